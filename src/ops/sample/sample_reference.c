/* sample_reference.c - the CPU reference of metrale/ops_sample.h (sample_reference.h): the
 * definition of the sampler, step by step as the header numbers them, and the CPU kernel that
 * runs it under the CUDA kernel's name and argument list. */
#include "sample_reference.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "error.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "philox.h"

bool mg_sample_params_valid(const mg_sample_params *p, uint32_t vocab, uint32_t history_pitch,
                            char *reason, size_t reason_bytes) {
    const float max_add = MG_SAMPLE_MAX_ADDITIVE_PENALTY;
    const char *bad = NULL;
    double value = 0;
    (void)vocab;
    /* written so that NaN fails every test */
    if (!(p->temperature >= 0.0f && p->temperature <= 3.4e38f))
        bad = "temperature must be 0 (greedy) or finite and > 0", value = p->temperature;
    else if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        bad = "top_p must be in (0, 1]", value = p->top_p;
    else if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        bad = "min_p must be in [0, 1]", value = p->min_p;
    else if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 3.4e38f))
        bad = "repetition_penalty must be finite and > 0", value = p->repetition_penalty;
    else if (!(p->presence_penalty >= -max_add && p->presence_penalty <= max_add))
        bad = "presence_penalty must be in [-1000, 1000]", value = p->presence_penalty;
    else if (!(p->frequency_penalty >= -max_add && p->frequency_penalty <= max_add))
        bad = "frequency_penalty must be in [-1000, 1000]", value = p->frequency_penalty;
    else if (p->history_len > history_pitch)
        bad = "history_len exceeds history_pitch", value = p->history_len;
    if (bad && reason_bytes)
        snprintf(reason, reason_bytes, "%s (got %g)", bad, value);
    return bad == NULL;
}

static int compare_ids(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Descending; the values are finite or -inf, never NaN. */
static int compare_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The k-th largest (1 <= k <= n) of v[0..n), reordering v: quickselect with a three-way
 * partition around the middle element. */
static float kth_largest(float *v, uint32_t n, uint32_t k) {
    size_t lo = 0, hi = n, want = k - 1;
    for (;;) {
        const float pivot = v[lo + (hi - lo) / 2];
        size_t gt = lo, i = lo, lt = hi; /* [lo, gt) > pivot, [gt, i) == pivot, [lt, hi) < */
        while (i < lt) {
            const float x = v[i];
            if (x > pivot) {
                v[i++] = v[gt];
                v[gt++] = x;
            } else if (x < pivot) {
                v[i] = v[--lt];
                v[lt] = x;
            } else {
                i++;
            }
        }
        if (want < gt)
            hi = gt;
        else if (want < lt)
            return pivot;
        else
            lo = lt;
    }
}

int32_t mg_sample_row_reference(const void *logits, bool bf16, uint32_t vocab,
                                const mg_sample_params *p, const int32_t *history,
                                uint32_t history_pitch, float *scratch) {
    float *y = scratch, *sorted = scratch + mg_sample_row_floats(vocab) / 2;
    /* 1: parameters (the history's ids with them), then the logits */
    if (!mg_sample_params_valid(p, vocab, history_pitch, NULL, 0))
        return MG_SAMPLE_BAD_PARAMS;
    for (uint32_t j = 0; j < p->history_len; j++)
        if (history[j] < 0 || (uint32_t)history[j] >= vocab)
            return MG_SAMPLE_BAD_PARAMS;
    for (uint32_t i = 0; i < vocab; i++) {
        const float x =
            bf16 ? mg_bf16_to_f32(((const uint16_t *)logits)[i]) : ((const float *)logits)[i];
        if (isnan(x) || x == INFINITY)
            return MG_SAMPLE_BAD_LOGITS;
        y[i] = x;
    }
    /* 2: penalties, once per distinct id (counted on a sorted copy of the history) */
    if (p->history_len && (p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
                           p->frequency_penalty != 0.0f)) {
        int32_t ids[MG_SAMPLE_MAX_HISTORY];
        memcpy(ids, history, p->history_len * sizeof *ids);
        qsort(ids, p->history_len, sizeof *ids, compare_ids);
        for (uint32_t j = 0; j < p->history_len;) {
            uint32_t c = 1;
            while (j + c < p->history_len && ids[j + c] == ids[j])
                c++;
            const float x = y[ids[j]];
            const float r = x > 0.0f ? x / p->repetition_penalty : x * p->repetition_penalty;
            y[ids[j]] = r - (p->presence_penalty + p->frequency_penalty * (float)c);
            j += c;
        }
    }
    /* 3 */
    float m = -INFINITY;
    uint32_t best = 0;
    for (uint32_t i = 0; i < vocab; i++)
        if (y[i] > m) {
            m = y[i];
            best = i;
        }
    if (m == -INFINITY)
        return MG_SAMPLE_NO_CANDIDATE;
    /* 4 */
    if (p->temperature == 0.0f)
        return (int32_t)best;
    /* 5: y becomes z; a removed token becomes -inf */
    uint32_t finite = 0;
    for (uint32_t i = 0; i < vocab; i++) {
        y[i] = (y[i] - m) / p->temperature;
        if (y[i] != -INFINITY)
            sorted[finite++] = y[i];
    }
    /* 6 */
    uint32_t kept = finite;
    if (p->top_k && p->top_k < vocab && p->top_k < finite) {
        const float t = kth_largest(sorted, finite, p->top_k);
        kept = 0;
        for (uint32_t i = 0; i < vocab; i++) {
            if (y[i] < t)
                y[i] = -INFINITY;
            else if (y[i] != -INFINITY)
                sorted[kept++] = y[i];
        }
    }
    /* 7 */
    if (p->top_p < 1.0f) {
        float S = 0.0f;
        for (uint32_t i = 0; i < vocab; i++)
            if (y[i] != -INFINITY)
                S += expf(y[i]);
        qsort(sorted, kept, sizeof *sorted, compare_desc);
        const float target = p->top_p * S;
        float acc = 0.0f, t = sorted[kept - 1];
        for (uint32_t j = 0; j < kept;) {
            const float v = sorted[j];
            while (j < kept && sorted[j] == v)
                acc += expf(sorted[j++]);
            if (acc >= target) {
                t = v;
                break;
            }
        }
        for (uint32_t i = 0; i < vocab; i++)
            if (y[i] < t)
                y[i] = -INFINITY;
    }
    /* 8 */
    if (p->min_p > 0.0f)
        for (uint32_t i = 0; i < vocab; i++)
            if (y[i] != -INFINITY && expf(y[i]) < p->min_p)
                y[i] = -INFINITY;
    /* 9 */
    float W = 0.0f;
    for (uint32_t i = 0; i < vocab; i++)
        if (y[i] != -INFINITY)
            W += expf(y[i]);
    const float target = mg_sample_uniform_of(p->seed, p->step) * W;
    float run = 0.0f;
    int32_t last = (int32_t)best;
    for (uint32_t i = 0; i < vocab; i++) {
        if (y[i] == -INFINITY)
            continue;
        const float w = expf(y[i]);
        run += w;
        if (w > 0.0f)
            last = (int32_t)i;
        if (run > target)
            return (int32_t)i;
    }
    return last;
}

/* ------------------------------------------------------------------ CPU kernel */

static uint64_t bytes_of(uint64_t count, uint64_t size) {
    return count > UINT64_MAX / size ? UINT64_MAX : count * size;
}

static mg_status kernel_sample(const mg_launch *l) {
    static const char name[] = "metrale:" MG_SAMPLE_KERNEL;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 10);
    if (st)
        return st;
    const uint32_t rows = mg_launch_get_u32(l, 5), vocab = mg_launch_get_u32(l, 6);
    const uint32_t pitch = mg_launch_get_u32(l, 7), history_pitch = mg_launch_get_u32(l, 9);
    const bool bf16 = mg_launch_get_u32(l, 8) != 0;
    if (rows == 0 || vocab == 0 || vocab > INT32_MAX || pitch < vocab ||
        history_pitch > MG_SAMPLE_MAX_HISTORY)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: rows=%u vocab=%u pitch=%u history_pitch=%u out of range",
                        name, rows, vocab, pitch, history_pitch);
    const uint32_t size = bf16 ? 2 : 4;
    void *logits, *params, *history = NULL, *workspace, *ids;
    if ((st = mg_cpu_kernel_buffer(l, 0, bytes_of((uint64_t)(rows - 1) * pitch + vocab, size), size,
                                   name, &logits)) ||
        (st = mg_cpu_kernel_buffer(l, 1, bytes_of(rows, sizeof(mg_sample_params)), 8, name,
                                   &params)) ||
        (history_pitch &&
         (st = mg_cpu_kernel_buffer(l, 2, bytes_of((uint64_t)rows, 4ull * history_pitch), 4, name,
                                    &history))) ||
        (st = mg_cpu_kernel_buffer(l, 3, bytes_of((uint64_t)rows, 4 * mg_sample_row_floats(vocab)),
                                   16, name, &workspace)) ||
        (st = mg_cpu_kernel_buffer(l, 4, bytes_of(rows, 4), 4, name, &ids)))
        return st;
    for (uint32_t r = 0; r < rows; r++) {
        const mg_sample_params *p = (const mg_sample_params *)params + r;
        ((int32_t *)ids)[r] = mg_sample_row_reference(
            (const char *)logits + (size_t)r * pitch * size, bf16, vocab, p,
            history ? (const int32_t *)history + (size_t)r * history_pitch : NULL, history_pitch,
            (float *)workspace + (size_t)r * mg_sample_row_floats(vocab));
    }
    return MG_OK;
}

static void register_kernels(void) {
    /* Failure is out of host memory at start-up; the lookup then reports NOT_FOUND. */
    mg_cpu_kernel_register("metrale", MG_SAMPLE_KERNEL, kernel_sample);
}

void mg_sample_cpu_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}
