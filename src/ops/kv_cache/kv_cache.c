/* kv_cache.c - the paged KV cache's sizes, host page allocator and page-table check
 * (metrale/ops_kv_cache.h). Host-only: nothing here touches a device. */
#include <stdlib.h>
#include <string.h>

#include "checked_math.h"
#include "error.h"
#include "kv_cache_host.h"

size_t mg_kv_dtype_bytes(mg_kv_dtype t) {
    switch (t) {
    case MG_KV_BF16:
        return 2;
    case MG_KV_FP8_E4M3:
        return 1;
    }
    return 0;
}

/* Bytes of one pool (K or V) of a checked descriptor; false beyond size_t. */
static bool pool_bytes(const mg_kv_cache_desc *d, size_t *bytes) {
    size_t token, page;
    return mg_mul_size((size_t)d->num_kv_heads * d->head_dim, mg_kv_dtype_bytes(d->kv_dtype),
                       &token) &&
           mg_mul_size(token, mg_kv_page_size(d->page_size), &page) &&
           mg_mul_size(page, d->num_pages, bytes);
}

mg_status mg_kv_cache_bytes(const mg_kv_cache_desc *d, size_t *bytes) {
    const char *fn = "mg_kv_cache_bytes";
    if (!bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output pointer", fn);
    *bytes = 0;
    mg_status st = mg_kv_cache_desc_check(d, fn);
    if (st)
        return st;
    size_t one;
    if (!pool_bytes(d, &one) || !mg_mul_size(one, 2, bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %u pages of %u tokens x %u heads x %u overflow the address space", fn,
                        d->num_pages, mg_kv_page_size(d->page_size), d->num_kv_heads, d->head_dim);
    return MG_OK;
}

mg_status mg_kv_cache_pools(const mg_kv_cache_desc *d, mg_devptr pool, mg_devptr *k_pages,
                            mg_devptr *v_pages) {
    const char *fn = "mg_kv_cache_pools";
    size_t total;
    mg_status st = mg_kv_cache_bytes(d, &total);
    if (st)
        return st;
    if (!pool || !k_pages || !v_pages)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn,
                        !pool ? "pool" : "output pointer");
    *k_pages = pool;
    *v_pages = pool + total / 2;
    return MG_OK;
}

/* ------------------------------------------------------------------ page allocator */

struct mg_kv_page_allocator {
    uint32_t num_pages;
    uint32_t free_count;
    int32_t *free_list; /* free_list[0..free_count): the free pages, top of the stack last */
    uint8_t *in_use;    /* per page: 1 while allocated */
};

mg_status mg_kv_page_allocator_create(uint32_t num_pages, mg_kv_page_allocator **out) {
    const char *fn = "mg_kv_page_allocator_create";
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output pointer", fn);
    *out = NULL;
    if (!num_pages || num_pages > (uint32_t)INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: num_pages %u must be in 1..%d", fn, num_pages,
                        INT32_MAX);
    mg_kv_page_allocator *a = calloc(1, sizeof *a);
    if (a) {
        a->free_list = malloc(sizeof(int32_t) * num_pages);
        a->in_use = calloc(num_pages, 1);
    }
    if (!a || !a->free_list || !a->in_use) {
        mg_kv_page_allocator_destroy(a);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory for %u pages", fn, num_pages);
    }
    a->num_pages = num_pages;
    a->free_count = num_pages;
    /* Page 0 on top, so a fresh allocator hands out 0, 1, 2, ... */
    for (uint32_t i = 0; i < num_pages; i++)
        a->free_list[i] = (int32_t)(num_pages - 1 - i);
    *out = a;
    return MG_OK;
}

void mg_kv_page_allocator_destroy(mg_kv_page_allocator *a) {
    if (!a)
        return;
    free(a->free_list);
    free(a->in_use);
    free(a);
}

mg_status mg_kv_page_alloc(mg_kv_page_allocator *a, uint32_t count, int32_t *pages) {
    const char *fn = "mg_kv_page_alloc";
    if (!a || (count && !pages))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, !a ? "allocator" : "pages");
    if (count > a->free_count)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY,
                        "%s: the KV cache pool is exhausted: %u pages asked, %u of %u free", fn,
                        count, a->free_count, a->num_pages);
    for (uint32_t i = 0; i < count; i++) {
        int32_t page = a->free_list[--a->free_count];
        a->in_use[page] = 1;
        pages[i] = page;
    }
    return MG_OK;
}

mg_status mg_kv_page_free(mg_kv_page_allocator *a, uint32_t count, const int32_t *pages) {
    const char *fn = "mg_kv_page_free";
    if (!a || (count && !pages))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, !a ? "allocator" : "pages");
    /* Checked first (in_use toggled to detect duplicates, then restored), so a bad list frees
     * nothing. */
    uint32_t i = 0;
    mg_status st = MG_OK;
    for (; i < count; i++) {
        int32_t page = pages[i];
        if (page < 0 || (uint32_t)page >= a->num_pages) {
            st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: pages[%u] = %d is outside 0..%u", fn, i,
                          page, a->num_pages - 1);
            break;
        }
        if (a->in_use[page] != 1) {
            st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: page %d (pages[%u]) is %s", fn, page, i,
                          a->in_use[page] ? "listed twice" : "not allocated (double free?)");
            break;
        }
        a->in_use[page] = 2;
    }
    for (uint32_t j = 0; j < i; j++)
        a->in_use[pages[j]] = st ? 1 : 0;
    if (st)
        return st;
    for (uint32_t j = 0; j < count; j++)
        a->free_list[a->free_count++] = pages[j];
    return MG_OK;
}

uint32_t mg_kv_page_free_count(const mg_kv_page_allocator *a) {
    return a ? a->free_count : 0;
}

/* ------------------------------------------------------------------ page tables */

static mg_status check_indptr(const int32_t *indptr, uint32_t batch, const char *name,
                              const char *fn) {
    if (indptr[0] != 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s[0] = %d, must be 0", fn, name, indptr[0]);
    for (uint32_t i = 0; i < batch; i++)
        if (indptr[i + 1] < indptr[i])
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: %s is not monotone at request %u (%s[%u] = %d < %s[%u] = %d)", fn,
                            name, i, name, i + 1, indptr[i + 1], name, i, indptr[i]);
    return MG_OK;
}

mg_status mg_kv_page_table_check(const mg_kv_cache_desc *d, const mg_kv_page_table *t,
                                 const char *fn) {
    if (!fn)
        fn = "mg_kv_page_table_check";
    mg_status st = mg_kv_cache_desc_check(d, fn);
    if (st)
        return st;
    if (!t || !t->kv_indptr || !t->kv_last_page_len)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn,
                        !t              ? "page table"
                        : !t->kv_indptr ? "kv_indptr"
                                        : "kv_last_page_len");
    if (!t->batch_size || t->batch_size > MG_KV_MAX_BATCH)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: batch_size %u must be in 1..%u", fn,
                        t->batch_size, MG_KV_MAX_BATCH);
    const uint32_t page_size = mg_kv_page_size(d->page_size);
    if ((st = check_indptr(t->kv_indptr, t->batch_size, "kv_indptr", fn)) ||
        (t->qo_indptr && (st = check_indptr(t->qo_indptr, t->batch_size, "qo_indptr", fn))))
        return st;
    for (uint32_t i = 0; i < t->batch_size; i++) {
        const int32_t pages = t->kv_indptr[i + 1] - t->kv_indptr[i];
        const int32_t last = t->kv_last_page_len[i];
        if (pages && (last < 1 || (uint32_t)last > page_size))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: kv_last_page_len[%u] = %d must be in 1..%u (page_size) for a "
                            "request with %d pages",
                            fn, i, last, page_size, pages);
        if (t->qo_indptr) {
            const int64_t qo = (int64_t)t->qo_indptr[i + 1] - t->qo_indptr[i];
            const int64_t kv = mg_kv_len(t->kv_indptr, t->kv_last_page_len, page_size, i);
            if (qo > kv)
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                "%s: request %u has %lld new tokens but only %lld cached (the "
                                "page table must already hold the new tokens)",
                                fn, i, (long long)qo, (long long)kv);
        }
    }
    if (t->kv_indices)
        for (int32_t j = 0; j < t->kv_indptr[t->batch_size]; j++)
            if (t->kv_indices[j] < 0 || (uint32_t)t->kv_indices[j] >= d->num_pages)
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                "%s: kv_indices[%d] = %d is out of range (the pool has %u pages)",
                                fn, j, t->kv_indices[j], d->num_pages);
    return MG_OK;
}
