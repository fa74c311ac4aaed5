/* kv_cache_internal.h - private to the paged KV cache ops: the kernel names every backend ships
 * for the append op (kernels/cuda/kv_cache/kv_append.cu and kv_append_reference.c, same argument
 * list). The limits and host checks other op folders share are in kv_cache_host.h. */
#ifndef METRALE_KV_CACHE_INTERNAL_H
#define METRALE_KV_CACHE_INTERNAL_H

#include "kv_cache_host.h"

/* Argument list (in order): k_src, v_src, q, positions, qo_indptr, kv_indptr, kv_indices,
 * kv_last_page_len, k_pages, v_pages (buffers; q and positions may be 0), then u32 batch,
 * num_tokens, num_kv_indices, num_kv_heads, num_qo_heads (0: no q), head_dim, page_size,
 * num_pages, k_stride, v_stride, q_stride, rope (0/1), f32 rope_theta, buffer rope_inv_freq
 * (FP32 [head_dim / 2], or 0). */
#define MG_KV_APPEND_KERNEL "kv_append"
/* FP8 E4M3 pools (k_pages / v_pages of bytes): the same arguments, then buffers k_scale and
 * v_scale (FP32 [num_kv_heads]). */
#define MG_KV_APPEND_FP8_KERNEL "kv_append_fp8"

/* Registers the CPU kernels of the append op once per process. */
void mg_kv_append_cpu_kernels_register(void);

#endif
