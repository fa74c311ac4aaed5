/*
 * cuda_graph.c - stream capture (relaxed mode) and executable graphs.
 *
 * Relaxed mode lets other threads keep making calls the driver deems unsafe during a capture
 * (allocations elsewhere, queries); the core still refuses allocation, synchronization and
 * blocking copies on a backend with a capturing stream. An executable graph keeps the graph
 * it was made from; mg_graph_end_capture_update swaps in a newly captured graph with
 * cuGraphExecUpdate when only node parameters changed, and re-instantiates otherwise.
 */
#include <stdlib.h>

#include "cuda_internal.h"

mg_status mg_cuda_graph_begin_capture(void *ctx, void *stream) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    CUresult r = c->drv->StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuStreamBeginCapture", "relaxed mode");
    return MG_OK;
}

/* Enters the context and ends the capture of `stream`; the graph is NULL when the capture was
 * invalidated. */
static mg_status end_capture(mg_cuda_context *c, CUstream stream, CUgraph *graph_out) {
    *graph_out = NULL;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    CUgraph graph = NULL;
    CUresult r = c->drv->StreamEndCapture(stream, &graph);
    if (r != CUDA_SUCCESS) {
        if (graph)
            (void)c->drv->GraphDestroy(graph);
        *graph_out = NULL;
        return MG_CUDA_FAIL(c, r, "cuStreamEndCapture",
                            "an operation during the capture was not capturable (the capture "
                            "is discarded and the stream usable again)");
    }
    *graph_out = graph;
    return MG_OK;
}

/* `stream` has just ended its capture: the upload is ordered there. On failure `graph` is
 * destroyed. */
static mg_status instantiate(mg_cuda_context *c, CUgraph graph, CUstream stream, CUgraphExec *out) {
    CUresult r = c->drv->GraphInstantiateWithFlags(out, graph, 0);
    if (r != CUDA_SUCCESS) {
        *out = NULL;
        (void)c->drv->GraphDestroy(graph);
        return MG_CUDA_FAIL(c, r, "cuGraphInstantiateWithFlags", NULL);
    }
    /* Uploading now keeps the first launch as fast as the rest; failing it is harmless. */
    if (c->drv->GraphUpload)
        (void)c->drv->GraphUpload(*out, stream);
    return MG_OK;
}

mg_status mg_cuda_graph_end_capture(void *ctx, void *stream, void **graph_out) {
    mg_cuda_context *c = ctx;
    CUgraph graph;
    mg_status st = end_capture(c, stream, &graph);
    if (st)
        return st;
    mg_cuda_graph *g = calloc(1, sizeof *g);
    if (!g) {
        (void)c->drv->GraphDestroy(graph);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_graph_end_capture: graph object");
    }
    g->graph = graph;
    if ((st = instantiate(c, graph, stream, &g->exec))) {
        free(g);
        return st;
    }
    *graph_out = g;
    return MG_OK;
}

mg_status mg_cuda_graph_end_capture_update(void *ctx, void *stream, void *graph,
                                           bool *updated_in_place) {
    mg_cuda_context *c = ctx;
    mg_cuda_graph *g = graph;
    *updated_in_place = false;
    CUgraph fresh;
    mg_status st = end_capture(c, stream, &fresh);
    if (st)
        return st;
    CUgraphExecUpdateResultInfo info;
    CUresult r = c->drv->GraphExecUpdate(g->exec, fresh, &info);
    if (r == CUDA_SUCCESS) {
        (void)c->drv->GraphDestroy(g->graph);
        g->graph = fresh;
        *updated_in_place = true;
        return MG_OK;
    }
    if (r != CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) {
        (void)c->drv->GraphDestroy(fresh);
        return MG_CUDA_FAIL(c, r, "cuGraphExecUpdate", NULL);
    }
    /* Topology or node kinds changed: a new executable replaces the old one; `g` keeps its
     * identity so the caller's handle stays valid. */
    CUgraphExec exec;
    if ((st = instantiate(c, fresh, stream, &exec)))
        return st; /* `g` still holds the old, valid executable */
    (void)c->drv->GraphExecDestroy(g->exec);
    (void)c->drv->GraphDestroy(g->graph);
    g->exec = exec;
    g->graph = fresh;
    return MG_OK;
}

mg_status mg_cuda_graph_abort_capture(void *ctx, void *stream) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_make_current(c);
    if (st)
        return st;
    CUgraph graph = NULL;
    CUresult r = c->drv->StreamEndCapture(stream, &graph);
    if (graph)
        (void)c->drv->GraphDestroy(graph);
    /* An invalidated capture still ends it: the stream is usable again either way. */
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED &&
        !mg_cuda_result_is_teardown(r) && !c->faulted)
        return MG_CUDA_FAIL(c, r, "cuStreamEndCapture", "aborting a capture");
    return MG_OK;
}

mg_status mg_cuda_graph_launch(void *ctx, void *graph, void *stream) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    mg_cuda_graph *g = graph;
    CUresult r = c->drv->GraphLaunch(g->exec, stream);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuGraphLaunch", NULL);
    return MG_OK;
}

mg_status mg_cuda_graph_count_nodes(void *ctx, void *graph, size_t *kernels, size_t *nodes) {
    mg_cuda_context *c = ctx;
    mg_cuda_graph *g = graph;
    if (!c->drv->GraphGetNodes || !c->drv->GraphNodeGetType)
        return MG_ERROR(MG_ERR_UNSUPPORTED, "mg_graph_count_nodes: the driver lacks "
                                            "cuGraphGetNodes or cuGraphNodeGetType");
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    size_t count = 0;
    CUresult r = c->drv->GraphGetNodes(g->graph, NULL, &count);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuGraphGetNodes", NULL);
    CUgraphNode *list = count ? malloc(count * sizeof *list) : NULL;
    if (count && !list)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_graph_count_nodes: %zu nodes", count);
    size_t launches = 0;
    if (count && (r = c->drv->GraphGetNodes(g->graph, list, &count)) != CUDA_SUCCESS) {
        free(list);
        return MG_CUDA_FAIL(c, r, "cuGraphGetNodes", NULL);
    }
    for (size_t i = 0; i < count; i++) {
        CUgraphNodeType type;
        if ((r = c->drv->GraphNodeGetType(list[i], &type)) != CUDA_SUCCESS) {
            free(list);
            return MG_CUDA_FAIL(c, r, "cuGraphNodeGetType", NULL);
        }
        launches += type == CU_GRAPH_NODE_TYPE_KERNEL;
    }
    free(list);
    *kernels = launches;
    *nodes = count;
    return MG_OK;
}

mg_status mg_cuda_graph_destroy(void *ctx, void *graph) {
    mg_cuda_context *c = ctx;
    mg_cuda_graph *g = graph;
    if (mg_cuda_make_current(c) == MG_OK) {
        if (g->exec)
            (void)c->drv->GraphExecDestroy(g->exec);
        if (g->graph)
            (void)c->drv->GraphDestroy(g->graph);
    }
    free(g);
    return MG_OK;
}
