/* bench_comm.c - `metrale-gpu bench comm`: collectives between two devices (the bench's
 * device and the next one of the same kind) through metrale/comm.h, and the tensor-parallel
 * MLP block against the same block on one device.
 *
 * Rows:
 *  - all_reduce_<size>, all_gather_<size> (8 KiB .. 1 GiB, BF16; size is the all-reduce buffer
 *    and the all-gather output): event-timed on rank 0's stream around one call of each rank
 *    (one group), median; GB/s is the bus bandwidth as nccl-tests defines it, so it compares
 *    across rank counts: all-reduce bytes * 2 (n-1)/n, all-gather output bytes * (n-1)/n, per
 *    second. The note has the algorithm bandwidth (bytes / time).
 *  - all_reduce_<size>_graph (8 KiB, 64 KiB): latency of one small all-reduce under graph
 *    replay: `GRAPH_CALLS` all-reduces captured on each rank's stream, each replay timed with
 *    events, per-call time.
 *  - tp_mlp_b<B>_tp2 / tp_mlp_b<B>_one (B = 1, 64): y = down(silu(x W_gateᵀ) * x W_upᵀ) at
 *    Llama-3-8B's MLP (hidden 4096, intermediate 14336), graph replay; tp2 splits it over the
 *    two devices (column-parallel gate_up, row-parallel down, BF16 all-reduce of y), one runs
 *    it on the bench's device. The weights (352 MB) are far past L2. The tp2 note has the
 *    speedup over one device.
 *
 * With one device of the kind (or no communicators: NCCL missing) it reports why and adds no
 * rows. --quick: sizes up to 1 MiB and a smaller block (hidden 512), for the CPU backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/comm.h"
#include "metrale/dtype.h"
#include "tp_mlp.h"

#define GRAPH_CALLS 32

typedef struct comm_bench {
    mg_backend *backend[2];
    mg_stream *stream[2];
    mg_comm *comm[2];
} comm_bench;

typedef enum coll_kind { COLL_ALL_REDUCE, COLL_ALL_GATHER } coll_kind;

typedef struct coll_case {
    comm_bench *cb;
    coll_kind kind;
    size_t count; /* all-reduce: elements; all-gather: elements sent per rank */
    mg_devptr send[2], recv[2];
    int calls; /* per body */
    mg_graph *graph[2];
} coll_case;

static mg_status issue_collectives(coll_case *c) {
    comm_bench *cb = c->cb;
    mg_status st = mg_comm_group_begin();
    for (int i = 0; i < c->calls && !st; i++)
        for (int r = 0; r < 2 && !st; r++)
            st = c->kind == COLL_ALL_REDUCE
                     ? mg_comm_all_reduce(cb->comm[r], cb->stream[r], c->send[r], c->recv[r],
                                          c->count, MG_DTYPE_BF16, MG_COMM_SUM)
                     : mg_comm_all_gather(cb->comm[r], cb->stream[r], c->send[r], c->recv[r],
                                          c->count, MG_DTYPE_BF16);
    mg_status end = mg_comm_group_end();
    return st ? st : end;
}

static mg_status body_collective(mg_bench *b, void *arg, int iteration) {
    (void)b;
    (void)iteration;
    return issue_collectives(arg);
}

/* Replays both ranks' graphs (in a group: the CPU backend runs a replay's collectives when it
 * is launched). */
static mg_status launch_graphs(comm_bench *cb, mg_graph *const *g) {
    mg_status st = mg_comm_group_begin();
    for (int r = 0; r < 2 && !st; r++)
        st = mg_graph_launch(g[r], cb->stream[r]);
    mg_status end = mg_comm_group_end();
    return st ? st : end;
}

static mg_status body_collective_graph(mg_bench *b, void *arg, int iteration) {
    (void)b;
    (void)iteration;
    coll_case *c = arg;
    return launch_graphs(c->cb, c->graph);
}

/* Captures `issue(arg)` on both ranks' streams into g[0..1]. */
static mg_status capture_both(comm_bench *cb, mg_status (*issue)(void *), void *arg, mg_graph **g) {
    mg_status st = MG_OK;
    int begun = 0;
    for (; begun < 2 && !st; begun++)
        st = mg_graph_begin_capture(cb->stream[begun]);
    if (st)
        begun--;
    if (!st)
        st = issue(arg);
    for (int r = 0; r < begun; r++) {
        if (st)
            mg_graph_abort_capture(cb->stream[r]);
        else
            st = mg_graph_end_capture(cb->stream[r], &g[r]);
    }
    return st;
}

static mg_status issue_collectives_void(void *arg) {
    return issue_collectives(arg);
}

/* mg_bench_fill_random_device for a buffer of any rank's backend. */
static mg_status fill_random(mg_backend *backend, mg_devptr dst, size_t bytes, uint64_t seed) {
    const size_t chunk = (size_t)64 << 20;
    void *host = malloc(bytes < chunk ? bytes : chunk);
    if (!host)
        return MG_ERR_OUT_OF_MEMORY;
    mg_status st = MG_OK;
    for (size_t at = 0; at < bytes && !st; at += chunk) {
        size_t n = bytes - at < chunk ? bytes - at : chunk;
        mg_bench_fill_random(host, n, seed + at);
        st = mg_copy_h2d(backend, dst + at, host, n);
    }
    free(host);
    return st;
}

static void size_text(size_t bytes, char *out, size_t out_bytes) {
    if (bytes >= ((size_t)1 << 30))
        snprintf(out, out_bytes, "%zuGiB", bytes >> 30);
    else if (bytes >= ((size_t)1 << 20))
        snprintf(out, out_bytes, "%zuMiB", bytes >> 20);
    else
        snprintf(out, out_bytes, "%zuKiB", bytes >> 10);
}

static void free_case(coll_case *c) {
    for (int r = 0; r < 2; r++) {
        if (c->graph[r])
            mg_graph_destroy(c->graph[r]);
        mg_free(c->cb->backend[r], c->send[r]);
        mg_free(c->cb->backend[r], c->recv[r]);
        c->graph[r] = NULL;
        c->send[r] = c->recv[r] = 0;
    }
}

/* One row: `bytes` is the all-reduce buffer or the all-gather output. */
static int run_collective(mg_bench *b, comm_bench *cb, coll_kind kind, size_t bytes, bool graph) {
    char size[16], name[48];
    size_text(bytes, size, sizeof size);
    snprintf(name, sizeof name, "%s_%s%s", kind == COLL_ALL_REDUCE ? "all_reduce" : "all_gather",
             size, graph ? "_graph" : "");
    if (!mg_bench_selected(b, name))
        return 0;
    coll_case c = {.cb = cb, .kind = kind, .calls = graph ? GRAPH_CALLS : 1};
    size_t elements = bytes / 2;
    c.count = kind == COLL_ALL_REDUCE ? elements : elements / 2;
    size_t send_bytes = c.count * 2;
    mg_status st = MG_OK;
    for (int r = 0; r < 2 && !st; r++) {
        if (!(st = mg_alloc(cb->backend[r], send_bytes, &c.send[r])) &&
            !(st = mg_alloc(cb->backend[r], bytes, &c.recv[r])))
            st = fill_random(cb->backend[r], c.send[r], send_bytes, 7 + (uint64_t)r);
    }
    mg_bench_row row = mg_bench_row_make("comm", name, size);
    int warmup = b->warmup, iters = b->iters;
    if (bytes >= ((size_t)256 << 20)) { /* a few ms a call: fewer are as steady */
        warmup = warmup < 5 ? warmup : 5;
        iters = iters < 20 ? iters : 20;
    }
    if (!st) { /* the first call connects the peers, outside timing and capture */
        st = issue_collectives(&c);
        for (int r = 0; r < 2 && !st; r++)
            st = mg_comm_wait(cb->comm[r], cb->stream[r]);
    }
    if (!st && graph && !(st = capture_both(cb, issue_collectives_void, &c, c.graph)))
        st = mg_bench_time_events(b, body_collective_graph, &c, warmup, iters, &row.stats);
    else if (!st && !graph)
        st = mg_bench_time_events(b, body_collective, &c, warmup, iters, &row.stats);
    for (int r = 0; r < 2 && !st; r++)
        st = mg_comm_wait(cb->comm[r], cb->stream[r]);
    if (!st) {
        double bus =
            kind == COLL_ALL_REDUCE ? 2.0 * bytes * (2 - 1) / 2 : (double)bytes * (2 - 1) / 2;
        row.bytes = bus * c.calls;
        row.items = c.calls;
        snprintf(row.item_unit, sizeof row.item_unit, "call");
        snprintf(row.timing, sizeof row.timing, "%s", graph ? "graph" : "events");
        double us = row.stats.median_us / c.calls;
        snprintf(row.note, sizeof row.note, "GB/s is bus bandwidth; algbw %.1f GB/s; bf16, 2 ranks",
                 us > 0 ? bytes / (us * 1e3) : 0);
        mg_bench_add(b, &row);
    }
    free_case(&c);
    return st ? mg_bench_fail(b, name) : 0;
}

/* ------------------------------------------------------------------ the TP block */

typedef struct mlp_case {
    comm_bench *cb;
    mg_tp_mlp *ranks[2];
    int count;
    uint32_t tokens;
    mg_graph *graph[2];
} mlp_case;

static mg_status issue_mlp(void *arg) {
    mlp_case *m = arg;
    return mg_tp_mlp_forward(m->ranks, m->count, m->tokens);
}

static mg_status body_mlp_graph(mg_bench *b, void *arg, int iteration) {
    (void)b;
    (void)iteration;
    mlp_case *m = arg;
    return m->count == 2 ? launch_graphs(m->cb, m->graph)
                         : mg_graph_launch(m->graph[0], m->cb->stream[0]);
}

static mg_status random_bf16(size_t count, uint32_t fan_in, uint16_t **out) {
    uint16_t *w = malloc(count * 2);
    if (!w)
        return MG_ERR_OUT_OF_MEMORY;
    mg_bench_fill_random(w, count * 2, count ^ fan_in);
    float scale = 2.0f / (float)fan_in;
    for (size_t i = 0; i < count; i++) /* uniform-ish in (-scale, scale) */
        w[i] = mg_f32_to_bf16(((float)w[i] - 32768.0f) / 32768.0f * scale);
    *out = w;
    return MG_OK;
}

/* Times the block at each batch on one device and on two; returns failures. */
static int run_mlp(mg_bench *b, comm_bench *cb, uint32_t hidden, uint32_t inter) {
    static const uint32_t batches[] = {1, 64};
    uint16_t *wg = NULL, *wu = NULL, *wd = NULL, *x = NULL;
    mg_tp_mlp one, tp[2];
    memset(&one, 0, sizeof one);
    memset(tp, 0, sizeof tp);
    size_t wcount = (size_t)inter * hidden;
    mg_status st = random_bf16(wcount, hidden, &wg);
    if (!st)
        st = random_bf16(wcount, hidden, &wu);
    if (!st)
        st = random_bf16(wcount, inter, &wd);
    if (!st)
        st = random_bf16((size_t)64 * hidden, 16, &x);
    if (!st)
        st = mg_tp_mlp_init(&one, cb->backend[0], cb->stream[0], NULL, hidden, inter, 64, wg, wu,
                            wd);
    for (int r = 0; r < 2 && !st; r++)
        st = mg_tp_mlp_init(&tp[r], cb->backend[r], cb->stream[r], cb->comm[r], hidden, inter, 64,
                            wg, wu, wd);
    if (!st)
        st = mg_copy_h2d(cb->backend[0], one.x, x, (size_t)64 * hidden * 2);
    for (int r = 0; r < 2 && !st; r++)
        st = mg_copy_h2d(cb->backend[r], tp[r].x, x, (size_t)64 * hidden * 2);
    free(wg);
    free(wu);
    free(wd);
    free(x);
    int failures = 0;
    char shape[64];
    for (size_t i = 0; i < sizeof batches / sizeof batches[0] && !st; i++) {
        double one_us = 0;
        for (int variant = 0; variant < 2 && !st; variant++) {
            bool split = variant == 1;
            char name[48];
            snprintf(name, sizeof name, "tp_mlp_b%u_%s", batches[i], split ? "tp2" : "one");
            snprintf(shape, sizeof shape, "%ux%ux%u", batches[i], hidden, inter);
            if (!mg_bench_selected(b, name))
                continue;
            mlp_case m = {.cb = cb, .count = split ? 2 : 1, .tokens = batches[i]};
            m.ranks[0] = split ? &tp[0] : &one;
            m.ranks[1] = &tp[1];
            /* plans the GEMM shapes and connects the peers, outside the capture */
            st = issue_mlp(&m);
            for (int r = 0; r < m.count && !st; r++)
                st = split ? mg_comm_wait(cb->comm[r], cb->stream[r])
                           : mg_stream_synchronize(cb->stream[0]);
            if (!st && split)
                st = capture_both(cb, issue_mlp, &m, m.graph);
            if (!st && !split && !(st = mg_graph_begin_capture(cb->stream[0]))) {
                st = issue_mlp(&m);
                if (st)
                    mg_graph_abort_capture(cb->stream[0]);
                else
                    st = mg_graph_end_capture(cb->stream[0], &m.graph[0]);
            }
            mg_bench_row row = mg_bench_row_make("comm", name, shape);
            if (!st)
                st = mg_bench_time_events(b, body_mlp_graph, &m, b->warmup, b->iters, &row.stats);
            for (int r = 0; r < m.count && !st; r++)
                st = split ? mg_comm_wait(cb->comm[r], cb->stream[r])
                           : mg_stream_synchronize(cb->stream[0]);
            for (int r = 0; r < 2; r++)
                if (m.graph[r])
                    mg_graph_destroy(m.graph[r]);
            if (st) {
                failures += mg_bench_fail(b, name);
                break;
            }
            /* weight bytes read per device per call */
            row.bytes = 3.0 * wcount * 2 / m.count;
            row.flops = 2.0 * 3.0 * wcount * batches[i] / m.count;
            snprintf(row.timing, sizeof row.timing, "graph");
            if (!split) {
                one_us = row.stats.median_us;
                snprintf(row.note, sizeof row.note, "one device; GB/s: weight bytes read");
            } else {
                snprintf(row.note, sizeof row.note,
                         "%.2fx the one-device block; GB/s: weight bytes read per device",
                         one_us > 0 && row.stats.median_us > 0 ? one_us / row.stats.median_us : 0);
            }
            mg_bench_add(b, &row);
        }
    }
    if (st && !failures)
        failures = mg_bench_fail(b, "tp_mlp setup");
    mg_tp_mlp_release(&one);
    for (int r = 0; r < 2; r++)
        mg_tp_mlp_release(&tp[r]);
    return failures;
}

/* ------------------------------------------------------------------ the sub-benchmark */

static int bench_comm(mg_bench *b, int argc, char **argv) {
    (void)argc;
    (void)argv;
    comm_bench cb = {.backend = {b->backend, NULL}, .stream = {b->stream, NULL}};
    mg_backend_kind kind = mg_backend_get_kind(b->backend);
    char reason[384];
    if (!mg_comm_available(kind, reason, sizeof reason)) {
        fprintf(stderr, "bench comm: skipped: no communicators for %s: %s\n",
                mg_backend_kind_name(kind), reason);
        return 0;
    }
    mg_backend_probe probe;
    mg_backend_probe_kind(kind, &probe);
    int other = b->opts->device + 1;
    if (other >= probe.device_count || mg_backend_open(kind, other, &cb.backend[1]) != MG_OK) {
        fprintf(stderr, "bench comm: skipped: needs %s device %d as the second rank: %s\n",
                mg_backend_kind_name(kind), other,
                other >= probe.device_count ? "not present" : mg_last_error());
        return 0;
    }
    int failures = 0;
    if (mg_stream_create(cb.backend[1], &cb.stream[1]) ||
        mg_comm_create_local(cb.backend, 2, NULL, cb.comm)) {
        failures = mg_bench_fail(b, "comm setup");
    } else {
        /* 8 KiB .. 1 GiB in factors of 4, with 64 MiB .. 1 GiB in factors of 2 (the range
         * of the bandwidth target) */
        static const size_t kib[] = {8,     32,    128,    512,    2048,   8192,
                                     32768, 65536, 131072, 262144, 524288, 1048576};
        size_t largest = b->quick ? ((size_t)1 << 20) : ((size_t)1 << 30);
        for (int kindi = COLL_ALL_REDUCE; kindi <= COLL_ALL_GATHER; kindi++)
            for (size_t i = 0; i < sizeof kib / sizeof kib[0] && kib[i] << 10 <= largest; i++)
                failures += run_collective(b, &cb, (coll_kind)kindi, kib[i] << 10, false);
        failures += run_collective(b, &cb, COLL_ALL_REDUCE, 8u << 10, true);
        failures += run_collective(b, &cb, COLL_ALL_REDUCE, 64u << 10, true);
        failures += b->quick ? run_mlp(b, &cb, 512, 1536) : run_mlp(b, &cb, 4096, 14336);
    }
    for (int r = 0; r < 2; r++)
        mg_comm_destroy(cb.comm[r]);
    if (cb.stream[1])
        mg_stream_destroy(cb.stream[1]);
    mg_backend_close(cb.backend[1]);
    return failures;
}

MG_BENCH_REGISTER(comm, "comm",
                  "two devices: all-reduce / all-gather bus bandwidth 8 KiB..1 GiB, small "
                  "all-reduce latency under graph replay, tensor-parallel MLP block vs one device",
                  bench_comm)
