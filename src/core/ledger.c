/* ledger.c - live device allocations of one backend (ledger.h). */
#include "ledger.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

void mg_ledger_init(mg_ledger *l) {
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->lock, NULL);
}

void mg_ledger_destroy(mg_ledger *l) {
    free(l->entries);
    pthread_mutex_destroy(&l->lock);
    memset(l, 0, sizeof *l);
}

/* Index of the first entry whose base is > ptr. Caller holds the lock. */
static size_t upper_bound(const mg_ledger *l, mg_devptr ptr) {
    size_t lo = 0, hi = l->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->entries[mid].base <= ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

mg_status mg_ledger_add(mg_ledger *l, const mg_ledger_entry *e) {
    pthread_mutex_lock(&l->lock);
    if (l->count == l->capacity) {
        size_t cap = l->capacity ? l->capacity * 2 : 64;
        mg_ledger_entry *grown = realloc(l->entries, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&l->lock);
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "allocation ledger: cannot grow to %zu entries",
                            cap);
        }
        l->entries = grown;
        l->capacity = cap;
    }
    size_t i = upper_bound(l, e->base);
    memmove(&l->entries[i + 1], &l->entries[i], (l->count - i) * sizeof *l->entries);
    l->entries[i] = *e;
    l->count++;
    l->live_bytes += e->bytes;
    pthread_mutex_unlock(&l->lock);
    return MG_OK;
}

bool mg_ledger_find(mg_ledger *l, mg_devptr ptr, mg_ledger_entry *out) {
    pthread_mutex_lock(&l->lock);
    size_t i = upper_bound(l, ptr);
    bool hit = i > 0 && ptr - l->entries[i - 1].base < l->entries[i - 1].bytes;
    if (hit && out)
        *out = l->entries[i - 1];
    pthread_mutex_unlock(&l->lock);
    return hit;
}

static void remove_at(mg_ledger *l, size_t i, mg_ledger_entry *out) {
    if (out)
        *out = l->entries[i];
    l->live_bytes -= l->entries[i].bytes;
    memmove(&l->entries[i], &l->entries[i + 1], (l->count - i - 1) * sizeof *l->entries);
    l->count--;
}

bool mg_ledger_remove(mg_ledger *l, mg_devptr base, mg_ledger_entry *out) {
    pthread_mutex_lock(&l->lock);
    size_t i = upper_bound(l, base);
    bool hit = i > 0 && l->entries[i - 1].base == base;
    if (hit)
        remove_at(l, i - 1, out);
    pthread_mutex_unlock(&l->lock);
    return hit;
}

bool mg_ledger_pop(mg_ledger *l, bool include_owned, mg_ledger_entry *out) {
    pthread_mutex_lock(&l->lock);
    size_t i = l->count;
    while (i > 0 && !include_owned && l->entries[i - 1].owned)
        i--;
    bool hit = i > 0;
    if (hit)
        remove_at(l, i - 1, out);
    pthread_mutex_unlock(&l->lock);
    return hit;
}

void mg_ledger_totals(mg_ledger *l, uint64_t *bytes, uint64_t *count) {
    pthread_mutex_lock(&l->lock);
    if (bytes)
        *bytes = l->live_bytes;
    if (count)
        *count = l->count;
    pthread_mutex_unlock(&l->lock);
}

static int same_site(const mg_ledger_site *s, const mg_ledger_entry *e) {
    return s->line == e->line &&
           (s->file == e->file || (s->file && e->file && !strcmp(s->file, e->file)));
}

static int by_bytes_desc(const void *a, const void *b) {
    const mg_ledger_site *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

mg_status mg_ledger_sites(mg_ledger *l, uint64_t min_bytes, mg_ledger_site *out, size_t max_sites,
                          size_t *written) {
    *written = 0;
    pthread_mutex_lock(&l->lock);
    /* Sites are few; a linear merge over a scratch array is plenty. */
    mg_ledger_site *sites = l->count ? calloc(l->count, sizeof *sites) : NULL;
    size_t n = 0;
    if (l->count && !sites) {
        size_t count = l->count;
        pthread_mutex_unlock(&l->lock);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY,
                        "allocation ledger: no host memory to group %zu allocations by site",
                        count);
    }
    for (size_t i = 0; i < l->count; i++) {
        const mg_ledger_entry *e = &l->entries[i];
        size_t j = 0;
        while (j < n && !same_site(&sites[j], e))
            j++;
        if (j == n)
            sites[n++] = (mg_ledger_site){e->file, e->line, 0, 0};
        sites[j].bytes += e->bytes;
        sites[j].count++;
    }
    pthread_mutex_unlock(&l->lock);
    qsort(sites, n, sizeof *sites, by_bytes_desc);
    for (size_t j = 0; j < n && *written < max_sites; j++)
        if (sites[j].bytes >= min_bytes)
            out[(*written)++] = sites[j];
    free(sites);
    return MG_OK;
}
