/* kv_append_reference.c - the CPU reference of mg_kv_append (metrale/ops_kv_cache.h), registered
 * as the CPU kernel "metrale:kv_append" with the argument list of the CUDA kernel
 * (kernels/cuda/kv_cache/kv_append.cu; kv_cache_internal.h lists it). Unlike the CUDA kernel,
 * which skips tokens whose page entry is out of range, it checks the whole page table first
 * and writes nothing when any entry is bad. RoPE is computed in FP32 like the CUDA kernel
 * (inverse frequency rope_inv_freq[i] when given, else theta^(-2i/D), then cos and sin of
 * position * frequency).
 * "metrale:kv_append_fp8" (FP8 E4M3 pools) takes the same arguments plus the per-head scales,
 * checks them (finite, > 0) first, and stores e4m3(x / scale) of the FP32 (rotated) value. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "checked_math.h"
#include "cpu_kernels.h"
#include "error.h"
#include "kv_cache_internal.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"

#define NAME "metrale:" MG_KV_APPEND_KERNEL
#define FP8_NAME "metrale:" MG_KV_APPEND_FP8_KERNEL

enum {
    ARG_K_SRC,
    ARG_V_SRC,
    ARG_Q,
    ARG_POSITIONS,
    ARG_QO_INDPTR,
    ARG_KV_INDPTR,
    ARG_KV_INDICES,
    ARG_LAST_PAGE_LEN,
    ARG_K_PAGES,
    ARG_V_PAGES,
    ARG_BATCH,
    ARG_TOKENS,
    ARG_NUM_INDICES,
    ARG_KV_HEADS,
    ARG_QO_HEADS,
    ARG_HEAD_DIM,
    ARG_PAGE_SIZE,
    ARG_NUM_PAGES,
    ARG_K_STRIDE,
    ARG_V_STRIDE,
    ARG_Q_STRIDE,
    ARG_ROPE,
    ARG_THETA,
    ARG_INV_FREQ,
    ARG_COUNT,
    /* kv_append_fp8 only */
    ARG_K_SCALE = ARG_COUNT,
    ARG_V_SCALE,
    ARG_FP8_COUNT
};

/* Rotates one head of `d` elements in place at `position` (rotate-half), pair i by
 * position * inv_freq[i]. */
static void rope_head(float *x, uint32_t d, float position, const float *inv_freq) {
    const uint32_t half = d / 2;
    for (uint32_t i = 0; i < half; i++) {
        const float angle = position * inv_freq[i];
        const float c = cosf(angle), s = sinf(angle);
        const float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x1 * c + x0 * s;
    }
}

/* Copies (rotating when asked) one head of BF16 from `src` to `dst`, which may alias: BF16 when
 * `scale` is 0, else FP8 E4M3 codes of value / scale. */
static void move_head(const uint16_t *src, void *dst, uint32_t d, bool rope, float position,
                      const float *inv_freq, float scale, float *scratch) {
    for (uint32_t c = 0; c < d; c++)
        scratch[c] = mg_bf16_to_f32(src[c]);
    if (rope)
        rope_head(scratch, d, position, inv_freq);
    for (uint32_t c = 0; c < d; c++) {
        if (scale)
            ((uint8_t *)dst)[c] = mg_f32_to_fp8_e4m3(scratch[c] / scale);
        else
            ((uint16_t *)dst)[c] = mg_f32_to_bf16(scratch[c]);
    }
}

static mg_status row_span(uint32_t rows, uint32_t cols, uint32_t stride, uint64_t *out) {
    size_t bytes;
    if (!mg_matrix_span_bytes(rows, cols, stride, 2, &bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: rows overflow the address space",
                        NAME);
    *out = bytes;
    return MG_OK;
}

/* Both kernels: `fp8` selects the FP8 pools and the two scale arguments. */
static mg_status append(const mg_launch *l, bool fp8) {
    static const mg_arg_kind kinds[ARG_FP8_COUNT] = {
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,
        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_F32,    MG_ARG_BUFFER,
        MG_ARG_BUFFER, MG_ARG_BUFFER};
    const char *name = fp8 ? FP8_NAME : NAME;
    const char *fn = fp8 ? "cpu kernel " FP8_NAME : "cpu kernel " NAME;
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, fp8 ? ARG_FP8_COUNT : ARG_COUNT);
    if (st)
        return st;
    const uint32_t batch = mg_launch_get_u32(l, ARG_BATCH),
                   tokens = mg_launch_get_u32(l, ARG_TOKENS);
    const uint32_t num_indices = mg_launch_get_u32(l, ARG_NUM_INDICES);
    const uint32_t kv_heads = mg_launch_get_u32(l, ARG_KV_HEADS);
    const uint32_t qo_heads = mg_launch_get_u32(l, ARG_QO_HEADS);
    const uint32_t d = mg_launch_get_u32(l, ARG_HEAD_DIM);
    const uint32_t k_stride = mg_launch_get_u32(l, ARG_K_STRIDE);
    const uint32_t v_stride = mg_launch_get_u32(l, ARG_V_STRIDE);
    const uint32_t q_stride = mg_launch_get_u32(l, ARG_Q_STRIDE);
    const bool rope = mg_launch_get_u32(l, ARG_ROPE) != 0;
    const float theta = mg_launch_get_f32(l, ARG_THETA);
    const mg_kv_cache_desc cache = {.num_kv_heads = kv_heads,
                                    .head_dim = d,
                                    .page_size = mg_launch_get_u32(l, ARG_PAGE_SIZE),
                                    .num_pages = mg_launch_get_u32(l, ARG_NUM_PAGES),
                                    .kv_dtype = fp8 ? MG_KV_FP8_E4M3 : MG_KV_BF16};
    if ((st = mg_kv_cache_desc_check(&cache, fn)))
        return st;
    if (!batch || batch > MG_KV_MAX_BATCH || k_stride < kv_heads * d || v_stride < kv_heads * d ||
        (qo_heads && q_stride < qo_heads * d))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: bad shape (batch %u, strides %u/%u/%u)", name, batch,
                        k_stride, v_stride, q_stride);
    const uint32_t page_size = mg_kv_page_size(cache.page_size);
    size_t pool_bytes;
    if ((st = mg_kv_cache_bytes(&cache, &pool_bytes)))
        return st;
    uint64_t k_bytes = 0, v_bytes = 0, q_bytes = 0;
    if ((st = row_span(tokens, kv_heads * d, k_stride, &k_bytes)) ||
        (st = row_span(tokens, kv_heads * d, v_stride, &v_bytes)) ||
        (qo_heads && (st = row_span(tokens, qo_heads * d, q_stride, &q_bytes))))
        return st;
    void *k_src = NULL, *v_src = NULL, *q = NULL, *positions = NULL, *qo_indptr, *kv_indptr,
         *kv_indices = NULL, *last, *k_pages, *v_pages;
    const uint64_t indptr_bytes = 4ull * (batch + 1);
    if ((tokens && ((st = mg_cpu_kernel_buffer(l, ARG_K_SRC, k_bytes, 16, name, &k_src)) ||
                    (st = mg_cpu_kernel_buffer(l, ARG_V_SRC, v_bytes, 16, name, &v_src)))) ||
        (qo_heads && tokens && (st = mg_cpu_kernel_buffer(l, ARG_Q, q_bytes, 16, name, &q))) ||
        (mg_launch_get_ptr(l, ARG_POSITIONS) && tokens &&
         (st = mg_cpu_kernel_buffer(l, ARG_POSITIONS, 4ull * tokens, 4, name, &positions))) ||
        (st = mg_cpu_kernel_buffer(l, ARG_QO_INDPTR, indptr_bytes, 4, name, &qo_indptr)) ||
        (st = mg_cpu_kernel_buffer(l, ARG_KV_INDPTR, indptr_bytes, 4, name, &kv_indptr)) ||
        (num_indices && (st = mg_cpu_kernel_buffer(l, ARG_KV_INDICES, 4ull * num_indices, 4, name,
                                                   &kv_indices))) ||
        (st = mg_cpu_kernel_buffer(l, ARG_LAST_PAGE_LEN, 4ull * batch, 4, name, &last)) ||
        (st = mg_cpu_kernel_buffer(l, ARG_K_PAGES, pool_bytes / 2, 16, name, &k_pages)) ||
        (st = mg_cpu_kernel_buffer(l, ARG_V_PAGES, pool_bytes / 2, 16, name, &v_pages)))
        return st;
    void *freq_table = NULL;
    if (rope && mg_launch_get_ptr(l, ARG_INV_FREQ) &&
        (st = mg_cpu_kernel_buffer(l, ARG_INV_FREQ, 4ull * (d / 2), 4, name, &freq_table)))
        return st;
    float inv_freq[MG_KV_MAX_HEAD_DIM / 2];
    for (uint32_t i = 0; rope && i < d / 2; i++)
        inv_freq[i] =
            freq_table ? ((const float *)freq_table)[i] : powf(theta, -(float)(2 * i) / (float)d);
    void *k_scale_buf = NULL, *v_scale_buf = NULL;
    if (fp8 &&
        ((st = mg_cpu_kernel_buffer(l, ARG_K_SCALE, 4ull * kv_heads, 4, name, &k_scale_buf)) ||
         (st = mg_cpu_kernel_buffer(l, ARG_V_SCALE, 4ull * kv_heads, 4, name, &v_scale_buf))))
        return st;
    const float *k_scale = k_scale_buf, *v_scale = v_scale_buf;
    for (uint32_t h = 0; fp8 && h < kv_heads; h++)
        if (!isfinite(k_scale[h]) || !(k_scale[h] > 0.0f) || !isfinite(v_scale[h]) ||
            !(v_scale[h] > 0.0f))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: k_scale[%u] = %g / v_scale[%u] = %g must be finite and > 0", fn, h,
                            (double)k_scale[h], h, (double)v_scale[h]);
    const int32_t *qo = qo_indptr, *kv = kv_indptr, *idx = kv_indices, *lpl = last;
    /* The whole table is checked before the first write. */
    const mg_kv_page_table table = {batch, qo, kv, NULL, lpl};
    if ((st = mg_kv_page_table_check(&cache, &table, fn)))
        return st;
    if ((uint32_t)qo[batch] > tokens || (uint32_t)kv[batch] > num_indices)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: qo_indptr ends at %d, beyond num_tokens %u, or kv_indptr "
                        "at %d, beyond num_kv_indices %u",
                        name, qo[batch], tokens, kv[batch], num_indices);
    const mg_kv_page_table with_indices = {batch, qo, kv, idx, lpl};
    if (num_indices && (st = mg_kv_page_table_check(&cache, &with_indices, fn)))
        return st;
    float scratch[MG_KV_MAX_HEAD_DIM];
    const size_t token_elems = (size_t)kv_heads * d, elem_bytes = fp8 ? 1 : 2;
    for (uint32_t r = 0; r < batch; r++) {
        const int64_t qo_len = qo[r + 1] - qo[r];
        const int64_t kv_len = mg_kv_len(kv, lpl, page_size, r);
        for (int64_t j = 0; j < qo_len; j++) {
            const uint32_t t = (uint32_t)(qo[r] + j);
            const int64_t pos = kv_len - qo_len + j;
            const int32_t page = idx[kv[r] + pos / page_size];
            const size_t dst = ((size_t)page * page_size + (size_t)(pos % page_size)) * token_elems;
            const float position = positions ? (float)((const int32_t *)positions)[t] : (float)pos;
            for (uint32_t h = 0; h < kv_heads; h++) {
                const size_t at = (dst + (size_t)h * d) * elem_bytes;
                move_head((const uint16_t *)k_src + (size_t)t * k_stride + (size_t)h * d,
                          (uint8_t *)k_pages + at, d, rope, position, inv_freq,
                          fp8 ? k_scale[h] : 0.0f, scratch);
                move_head((const uint16_t *)v_src + (size_t)t * v_stride + (size_t)h * d,
                          (uint8_t *)v_pages + at, d, false, 0.0f, inv_freq,
                          fp8 ? v_scale[h] : 0.0f, scratch);
            }
            for (uint32_t h = 0; q && h < qo_heads; h++) {
                uint16_t *row = (uint16_t *)q + (size_t)t * q_stride + (size_t)h * d;
                move_head(row, row, d, rope, position, inv_freq, 0.0f, scratch);
            }
        }
    }
    return MG_OK;
}

static pthread_once_t register_once = PTHREAD_ONCE_INIT;

static mg_status kernel_append(const mg_launch *l) {
    return append(l, false);
}

static mg_status kernel_append_fp8(const mg_launch *l) {
    return append(l, true);
}

static void register_kernels(void) {
    mg_cpu_kernel_register("metrale", MG_KV_APPEND_KERNEL, kernel_append);
    mg_cpu_kernel_register("metrale", MG_KV_APPEND_FP8_KERNEL, kernel_append_fp8);
}

void mg_kv_append_cpu_kernels_register(void) {
    pthread_once(&register_once, register_kernels);
}
