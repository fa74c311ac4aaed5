/* moe_routing_reference.c - the CPU reference of the MoE routing helpers
 * (moe_routing_reference.h): each CUDA kernel's stage on host memory, as a CPU kernel with the
 * same name and argument list. */
#include "moe_routing_reference.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "cpu_kernels.h"
#include "error.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "metrale/ops_moe.h"

/* ------------------------------------------------------------------ stages */

static void topk(const void *logits, bool bf16, uint32_t pitch, int32_t *ids, float *weights,
                 uint32_t tokens, uint32_t experts, uint32_t k, bool renormalize) {
    for (uint32_t t = 0; t < tokens; t++) {
        float v[MG_MOE_MAX_EXPERTS];
        bool taken[MG_MOE_MAX_EXPERTS] = {false};
        for (uint32_t e = 0; e < experts; e++) {
            size_t i = (size_t)t * pitch + e;
            float x =
                bf16 ? mg_bf16_to_f32(((const uint16_t *)logits)[i]) : ((const float *)logits)[i];
            v[e] = isnan(x) ? -INFINITY : x;
        }
        uint32_t chosen[MG_MOE_MAX_TOPK] = {0};
        for (uint32_t j = 0; j < k; j++) {
            uint32_t best = UINT32_MAX;
            for (uint32_t e = 0; e < experts; e++) /* ascending: ties keep the lower index */
                if (!taken[e] && (best == UINT32_MAX || v[e] > v[best]))
                    best = e;
            taken[best] = true;
            chosen[j] = best;
        }
        float max = v[chosen[0]], sum = 0.0f;
        if (renormalize)
            for (uint32_t j = 0; j < k; j++)
                sum += expf(v[chosen[j]] - max);
        else
            for (uint32_t e = 0; e < experts; e++)
                sum += expf(v[e] - max);
        for (uint32_t j = 0; j < k; j++) {
            ids[(size_t)t * k + j] = (int32_t)chosen[j];
            weights[(size_t)t * k + j] = expf(v[chosen[j]] - max) / sum;
        }
    }
}

static uint32_t chunk_count(uint32_t pairs) {
    return pairs ? (pairs + MG_MOE_SORT_CHUNK - 1) / MG_MOE_SORT_CHUNK : 1;
}

static bool valid_id(int32_t id, uint32_t experts) {
    return id >= 0 && (uint32_t)id < experts;
}

/* workspace[c * E + e] = pairs of chunk c with expert e. */
static void sort_count(const int32_t *ids, int32_t *workspace, uint32_t pairs, uint32_t experts) {
    memset(workspace, 0, (size_t)chunk_count(pairs) * experts * sizeof *workspace);
    for (uint32_t p = 0; p < pairs; p++)
        if (valid_id(ids[p], experts))
            workspace[(size_t)(p / MG_MOE_SORT_CHUNK) * experts + (uint32_t)ids[p]]++;
}

/* Counts -> each chunk's first row per expert, and the expert offsets; rows past the valid
 * pairs get token -1. */
static void sort_scan(int32_t *workspace, int32_t *offsets, int32_t *sorted_tokens, uint32_t pairs,
                      uint32_t experts) {
    uint32_t chunks = chunk_count(pairs);
    int32_t base = 0;
    for (uint32_t e = 0; e < experts; e++) {
        offsets[e] = base;
        for (uint32_t c = 0; c < chunks; c++) {
            int32_t count = workspace[(size_t)c * experts + e];
            workspace[(size_t)c * experts + e] = base;
            base += count;
        }
    }
    offsets[experts] = base;
    for (uint32_t row = (uint32_t)base; row < pairs; row++)
        sorted_tokens[row] = -1;
}

static void sort_scatter(const int32_t *ids, int32_t *workspace, int32_t *sorted_tokens,
                         int32_t *positions, uint32_t pairs, uint32_t experts, uint32_t k) {
    for (uint32_t p = 0; p < pairs; p++) {
        if (!valid_id(ids[p], experts)) {
            positions[p] = -1;
            continue;
        }
        int32_t row = workspace[(size_t)(p / MG_MOE_SORT_CHUNK) * experts + (uint32_t)ids[p]]++;
        sorted_tokens[row] = (int32_t)(p / k);
        positions[p] = row;
    }
}

static void combine(const uint16_t *rows, const int32_t *positions, const float *weights,
                    const uint16_t *residual, uint16_t *out, uint32_t tokens, uint32_t k,
                    uint32_t hidden) {
    int64_t row_count = (int64_t)tokens * k;
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t h = 0; h < hidden; h++) {
            size_t i = (size_t)t * hidden + h;
            float acc = residual ? mg_bf16_to_f32(residual[i]) : 0.0f;
            for (uint32_t j = 0; j < k; j++) {
                int32_t row = positions[(size_t)t * k + j];
                if (row < 0 || row >= row_count)
                    continue;
                acc = fmaf(weights[(size_t)t * k + j],
                           mg_bf16_to_f32(rows[(size_t)row * hidden + h]), acc);
            }
            out[i] = mg_f32_to_bf16(acc);
        }
}

/* ------------------------------------------------------------------ CPU kernels */

static uint64_t bytes_of(uint64_t count, uint64_t size) {
    return count > UINT64_MAX / size ? UINT64_MAX : count * size;
}

static mg_status kernel_topk(const mg_launch *l) {
    static const char name[] = "metrale:" MG_MOE_KERNEL_TOPK;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 9);
    if (st)
        return st;
    uint32_t tokens = mg_launch_get_u32(l, 3), experts = mg_launch_get_u32(l, 4);
    uint32_t k = mg_launch_get_u32(l, 5), pitch = mg_launch_get_u32(l, 6);
    bool bf16 = mg_launch_get_u32(l, 7) != 0, renormalize = mg_launch_get_u32(l, 8) != 0;
    if (experts == 0 || experts > MG_MOE_MAX_EXPERTS || k == 0 || k > MG_MOE_MAX_TOPK ||
        k > experts || pitch < experts)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: experts=%u k=%u logits_pitch=%u out of range", name,
                        experts, k, pitch);
    uint32_t size = bf16 ? 2 : 4;
    uint64_t logit_bytes = tokens ? bytes_of((uint64_t)(tokens - 1) * pitch + experts, size) : 0;
    void *logits, *ids, *weights;
    if ((st = mg_cpu_kernel_buffer(l, 0, logit_bytes, size, name, &logits)) ||
        (st = mg_cpu_kernel_buffer(l, 1, bytes_of((uint64_t)tokens * k, 4), 4, name, &ids)) ||
        (st = mg_cpu_kernel_buffer(l, 2, bytes_of((uint64_t)tokens * k, 4), 4, name, &weights)))
        return st;
    topk(logits, bf16, pitch, ids, weights, tokens, experts, k, renormalize);
    return MG_OK;
}

static mg_status check_sort_shape(const char *name, uint32_t pairs, uint32_t experts) {
    if (experts == 0 || experts > MG_MOE_MAX_EXPERTS || pairs > INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: pairs=%u experts=%u out of range",
                        name, pairs, experts);
    return MG_OK;
}

static uint64_t workspace_bytes(uint32_t pairs, uint32_t experts) {
    return (uint64_t)chunk_count(pairs) * experts * 4;
}

static mg_status kernel_sort_count(const mg_launch *l) {
    static const char name[] = "metrale:" MG_MOE_KERNEL_SORT_COUNT;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32, MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 4);
    if (st)
        return st;
    uint32_t pairs = mg_launch_get_u32(l, 2), experts = mg_launch_get_u32(l, 3);
    void *ids, *workspace;
    if ((st = check_sort_shape(name, pairs, experts)) ||
        (st = mg_cpu_kernel_buffer(l, 0, (uint64_t)pairs * 4, 4, name, &ids)) ||
        (st = mg_cpu_kernel_buffer(l, 1, workspace_bytes(pairs, experts), 16, name, &workspace)))
        return st;
    /* The reference refuses what the device kernels would drop (metrale/ops_moe.h): the first
     * stage checks every id before anything is written. */
    for (uint32_t p = 0; p < pairs; p++)
        if (!valid_id(((const int32_t *)ids)[p], experts))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "mg_moe_sort: topk_ids[%u] = %d is not an expert id in [0, %u)", p,
                            ((const int32_t *)ids)[p], experts);
    sort_count(ids, workspace, pairs, experts);
    return MG_OK;
}

static mg_status kernel_sort_scan(const mg_launch *l) {
    static const char name[] = "metrale:" MG_MOE_KERNEL_SORT_SCAN;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,
                                        MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 5);
    if (st)
        return st;
    uint32_t pairs = mg_launch_get_u32(l, 3), experts = mg_launch_get_u32(l, 4);
    void *workspace, *offsets, *sorted;
    if ((st = check_sort_shape(name, pairs, experts)) ||
        (st = mg_cpu_kernel_buffer(l, 0, workspace_bytes(pairs, experts), 16, name, &workspace)) ||
        (st = mg_cpu_kernel_buffer(l, 1, ((uint64_t)experts + 1) * 4, 4, name, &offsets)) ||
        (st = mg_cpu_kernel_buffer(l, 2, (uint64_t)pairs * 4, 4, name, &sorted)))
        return st;
    sort_scan(workspace, offsets, sorted, pairs, experts);
    return MG_OK;
}

static mg_status kernel_sort_scatter(const mg_launch *l) {
    static const char name[] = "metrale:" MG_MOE_KERNEL_SORT_SCATTER;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 7);
    if (st)
        return st;
    uint32_t pairs = mg_launch_get_u32(l, 4), experts = mg_launch_get_u32(l, 5);
    uint32_t k = mg_launch_get_u32(l, 6);
    if (k == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: k is 0", name);
    void *ids, *workspace, *sorted, *positions;
    if ((st = check_sort_shape(name, pairs, experts)) ||
        (st = mg_cpu_kernel_buffer(l, 0, (uint64_t)pairs * 4, 4, name, &ids)) ||
        (st = mg_cpu_kernel_buffer(l, 1, workspace_bytes(pairs, experts), 16, name, &workspace)) ||
        (st = mg_cpu_kernel_buffer(l, 2, (uint64_t)pairs * 4, 4, name, &sorted)) ||
        (st = mg_cpu_kernel_buffer(l, 3, (uint64_t)pairs * 4, 4, name, &positions)))
        return st;
    sort_scatter(ids, workspace, sorted, positions, pairs, experts, k);
    return MG_OK;
}

static mg_status kernel_combine(const mg_launch *l) {
    static const char name[] = "metrale:" MG_MOE_KERNEL_COMBINE;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 9);
    if (st)
        return st;
    uint32_t tokens = mg_launch_get_u32(l, 5), k = mg_launch_get_u32(l, 6);
    uint32_t hidden = mg_launch_get_u32(l, 7);
    bool has_residual = mg_launch_get_u32(l, 8) != 0;
    uint64_t pairs = (uint64_t)tokens * k, token_bytes = bytes_of((uint64_t)tokens * hidden, 2);
    void *rows, *positions, *weights, *residual, *out;
    if ((st = mg_cpu_kernel_buffer(l, 0, bytes_of(pairs * hidden, 2), 16, name, &rows)) ||
        (st = mg_cpu_kernel_buffer(l, 1, pairs * 4, 4, name, &positions)) ||
        (st = mg_cpu_kernel_buffer(l, 2, pairs * 4, 4, name, &weights)) ||
        (st = mg_cpu_kernel_buffer(l, 3, token_bytes, 16, name, &residual)) ||
        (st = mg_cpu_kernel_buffer(l, 4, token_bytes, 16, name, &out)))
        return st;
    combine(rows, positions, weights, has_residual ? residual : NULL, out, tokens, k, hidden);
    return MG_OK;
}

static void register_kernels(void) {
    /* Failure is out of host memory at start-up; the lookups then report NOT_FOUND. */
    mg_cpu_kernel_register("metrale", MG_MOE_KERNEL_TOPK, kernel_topk);
    mg_cpu_kernel_register("metrale", MG_MOE_KERNEL_SORT_COUNT, kernel_sort_count);
    mg_cpu_kernel_register("metrale", MG_MOE_KERNEL_SORT_SCAN, kernel_sort_scan);
    mg_cpu_kernel_register("metrale", MG_MOE_KERNEL_SORT_SCATTER, kernel_sort_scatter);
    mg_cpu_kernel_register("metrale", MG_MOE_KERNEL_COMBINE, kernel_combine);
}

void mg_moe_routing_cpu_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}
