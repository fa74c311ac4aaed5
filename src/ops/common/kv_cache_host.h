/* kv_cache_host.h - private to src/ops: the paged KV cache's limits and host-side checks
 * (metrale/ops_kv_cache.h), shared by the KV cache ops (src/ops/kv_cache/), attention over pages
 * (src/ops/attention/) and the GEMM's KV-append epilogue (src/ops/gemm/). Host-only. */
#ifndef METRALE_KV_CACHE_HOST_H
#define METRALE_KV_CACHE_HOST_H

#include <stdint.h>

#include "metrale/ops_kv_cache.h"

#define MG_KV_MAX_HEADS 1024u
#define MG_KV_MAX_HEAD_DIM 512u
#define MG_KV_MAX_BATCH (1u << 20)

/* MG_ERR_INVALID_ARGUMENT naming `fn` and the first bad field of `d` (or a NULL `d`). */
mg_status mg_kv_cache_desc_check(const mg_kv_cache_desc *d, const char *fn);
/* page_size with 0 meaning the default. */
uint32_t mg_kv_page_size(uint32_t page_size);
/* Tokens request `request` holds (indptrs already checked). */
int64_t mg_kv_len(const int32_t *kv_indptr, const int32_t *last_page_len, uint32_t page_size,
                  uint32_t request);
/* Every check of mg_kv_append (status and message as it gives them, the provider choice
 * included), launching nothing: mg_kv_append's own first step, and for a fused op that appends
 * after its own kernels (the GEMM's KV-append epilogue) and must refuse before it launches
 * anything. */
mg_status mg_kv_append_check(mg_backend *b, const mg_kv_cache_desc *cache,
                             const mg_kv_append_args *a);

#endif
