/* op_cache.c - kernel memo, grow-only scratch and diagnostic gates (op_cache.h). */
#include "op_cache.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_internal.h"
#include "error.h"

typedef struct scratch_slot {
    char tag[64];
    mg_devptr ptr;
    size_t bytes;
    mg_stream *stream; /* the stream it is private to (freed with it), or NULL when shared */
} scratch_slot;

typedef struct retired_block {
    mg_devptr ptr;
    mg_event *done; /* completes when the last work that may use ptr has run */
} retired_block;

struct mg_op_cache {
    mg_backend *backend;

    pthread_rwlock_t kernel_lock;
    mg_kernel **kernel_table; /* open addressing, power-of-two capacity */
    size_t kernel_count, kernel_capacity;

    pthread_mutex_t scratch_lock;
    scratch_slot *slots;
    size_t slot_count, slot_capacity;
    retired_block *retired;
    size_t retired_count, retired_capacity;
};

/* ------------------------------------------------------------------ kernels */

static uint64_t hash_name(const char *module, const char *function) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = module; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
    for (const char *p = function; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

/* Slot of (module, function), or of the empty slot where it would go. Caller holds the lock. */
static size_t probe(const mg_op_cache *c, const char *module, const char *function) {
    size_t mask = c->kernel_capacity - 1;
    size_t i = (size_t)hash_name(module, function) & mask;
    while (c->kernel_table[i] && (strcmp(c->kernel_table[i]->module, module) ||
                                  strcmp(c->kernel_table[i]->function, function)))
        i = (i + 1) & mask;
    return i;
}

static mg_status grow_table(mg_op_cache *c) {
    size_t cap = c->kernel_capacity ? c->kernel_capacity * 2 : 64;
    mg_kernel **old = c->kernel_table;
    size_t old_cap = c->kernel_capacity;
    mg_kernel **table = calloc(cap, sizeof *table);
    if (!table)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "op cache: kernel table of %zu entries", cap);
    c->kernel_table = table;
    c->kernel_capacity = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i])
            c->kernel_table[probe(c, old[i]->module, old[i]->function)] = old[i];
    free(old);
    return MG_OK;
}

mg_status mg_op_cache_create(mg_backend *b, mg_op_cache **out) {
    mg_op_cache *c = calloc(1, sizeof *c);
    if (!c)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "op cache: calloc(%zu)", sizeof *c);
    c->backend = b;
    pthread_rwlock_init(&c->kernel_lock, NULL);
    pthread_mutex_init(&c->scratch_lock, NULL);
    mg_status st = grow_table(c);
    if (st) {
        free(c);
        return st;
    }
    *out = c;
    return MG_OK;
}

mg_status mg_op_cache_kernel(mg_op_cache *c, const char *module, const char *function, bool hold,
                             mg_kernel **out) {
    size_t module_len = strlen(module), function_len = strlen(function);
    if (module_len >= sizeof(((mg_kernel *)0)->module) ||
        function_len >= sizeof(((mg_kernel *)0)->function))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_kernel_lookup: name too long (module %zu, function %zu bytes)",
                        module_len, function_len);

    pthread_rwlock_rdlock(&c->kernel_lock);
    mg_kernel *k = c->kernel_table[probe(c, module, function)];
    if (k && hold)
        atomic_fetch_add(&k->holds, 1);
    pthread_rwlock_unlock(&c->kernel_lock);
    if (k) {
        *out = k;
        return MG_OK;
    }

    pthread_rwlock_wrlock(&c->kernel_lock);
    size_t slot = probe(c, module, function);
    k = c->kernel_table[slot]; /* another thread may have added it meanwhile */
    mg_status st = MG_OK;
    if (!k) {
        void *impl = NULL;
        mg_backend *b = c->backend;
        st = b->ops->kernel_lookup(b->ctx, module, function, &impl);
        if (st == MG_OK) {
            k = calloc(1, sizeof *k);
            if (!k) {
                st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "op cache: kernel handle");
            } else {
                k->owner = b;
                k->impl = impl;
                memcpy(k->module, module, module_len + 1);
                memcpy(k->function, function, function_len + 1);
                snprintf(k->name, sizeof k->name, "%s:%s", module, function);
                st = mg_handle_register(k, MG_HANDLE_KERNEL);
                if (st) {
                    free(k);
                    k = NULL;
                }
            }
        }
        if (st == MG_OK) {
            if ((c->kernel_count + 1) * 2 > c->kernel_capacity) {
                st = grow_table(c);
                slot = probe(c, module, function);
            }
            if (st == MG_OK) {
                c->kernel_table[slot] = k;
                c->kernel_count++;
            } else {
                mg_handle_unregister(k);
                free(k);
                k = NULL;
            }
        }
    }
    if (k && hold)
        atomic_fetch_add(&k->holds, 1);
    pthread_rwlock_unlock(&c->kernel_lock);
    if (st == MG_OK)
        *out = k;
    return st;
}

static bool in_list(const char *name, const char *const *list, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (!strcmp(name, list[i]))
            return true;
    return false;
}

mg_status mg_op_cache_forget_modules(mg_op_cache *c, const char *const *modules, size_t count) {
    pthread_rwlock_wrlock(&c->kernel_lock);
    for (size_t i = 0; i < c->kernel_capacity; i++) {
        mg_kernel *k = c->kernel_table[i];
        if (k && in_list(k->module, modules, count) && atomic_load(&k->holds) > 0) {
            pthread_rwlock_unlock(&c->kernel_lock);
            return MG_ERROR(MG_ERR_BUSY,
                            "module unload: kernel %s is still held (%llu lookups not "
                            "released with mg_kernel_release)",
                            k->name, (unsigned long long)atomic_load(&k->holds));
        }
    }
    /* Rebuild without the forgotten kernels: open addressing cannot simply clear slots. */
    mg_kernel **kept = calloc(c->kernel_capacity, sizeof *kept);
    if (!kept) {
        pthread_rwlock_unlock(&c->kernel_lock);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "op cache: rebuild of the kernel table");
    }
    mg_kernel **old = c->kernel_table;
    c->kernel_table = kept;
    c->kernel_count = 0;
    for (size_t i = 0; i < c->kernel_capacity; i++) {
        mg_kernel *k = old[i];
        if (!k)
            continue;
        if (in_list(k->module, modules, count)) {
            mg_handle_unregister(k);
            free(k);
        } else {
            c->kernel_table[probe(c, k->module, k->function)] = k;
            c->kernel_count++;
        }
    }
    free(old);
    pthread_rwlock_unlock(&c->kernel_lock);
    return MG_OK;
}

size_t mg_op_cache_kernel_count(mg_op_cache *c) {
    pthread_rwlock_rdlock(&c->kernel_lock);
    size_t n = c->kernel_count;
    pthread_rwlock_unlock(&c->kernel_lock);
    return n;
}

/* ------------------------------------------------------------------ scratch */

/* Frees retired blocks whose event completed (all of them, waiting, when `wait`).
 * Caller holds scratch_lock. */
static void reclaim_retired(mg_op_cache *c, bool wait) {
    size_t kept = 0;
    for (size_t i = 0; i < c->retired_count; i++) {
        retired_block *r = &c->retired[i];
        mg_status done = wait ? mg_event_synchronize(r->done) : mg_event_query(r->done);
        if (done == MG_OK || (wait && done != MG_ERR_NOT_READY)) {
            mg_free(c->backend, r->ptr);
            mg_event_destroy(r->done);
        } else {
            c->retired[kept++] = *r;
        }
    }
    c->retired_count = kept;
}

static mg_status push_retired(mg_op_cache *c, mg_devptr ptr, mg_stream *s) {
    if (c->retired_count == c->retired_capacity) {
        size_t cap = c->retired_capacity ? c->retired_capacity * 2 : 8;
        retired_block *grown = realloc(c->retired, cap * sizeof *grown);
        if (!grown)
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "op cache: retired scratch list");
        c->retired = grown;
        c->retired_capacity = cap;
    }
    mg_event *done = NULL;
    mg_status st = mg_event_create(c->backend, &done);
    if (st == MG_OK)
        st = mg_event_record(done, s);
    if (st) {
        if (done)
            mg_event_destroy(done);
        return st;
    }
    c->retired[c->retired_count++] = (retired_block){ptr, done};
    return MG_OK;
}

static mg_status scratch(mg_op_cache *c, const char *tag, size_t bytes, mg_stream *s,
                         bool stream_private, mg_devptr *out) {
    if (!tag || !*tag || strlen(tag) >= sizeof(((scratch_slot *)0)->tag) || bytes == 0 || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "op cache scratch: bad tag or size %zu", bytes);
    pthread_mutex_lock(&c->scratch_lock);
    reclaim_retired(c, false);
    scratch_slot *slot = NULL;
    for (size_t i = 0; i < c->slot_count; i++)
        if (!strcmp(c->slots[i].tag, tag))
            slot = &c->slots[i];
    if (slot && slot->bytes >= bytes) {
        *out = slot->ptr;
        pthread_mutex_unlock(&c->scratch_lock);
        return MG_OK;
    }
    mg_status st = mg_stream_check_not_capturing(c->backend, s, "op cache scratch growth");
    if (st == MG_OK && !slot && c->slot_count == c->slot_capacity) {
        size_t cap = c->slot_capacity ? c->slot_capacity * 2 : 8;
        scratch_slot *grown = realloc(c->slots, cap * sizeof *grown);
        if (!grown)
            st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "op cache: scratch table");
        else {
            c->slots = grown;
            c->slot_capacity = cap;
        }
    }
    mg_devptr fresh = 0;
    if (st == MG_OK)
        st = mg_alloc_owned_at(c->backend, bytes, MG_ALLOC_DEVICE, &fresh, __FILE__, __LINE__);
    if (st == MG_OK && slot) {
        st = push_retired(c, slot->ptr, s);
        if (st) {
            mg_free(c->backend, fresh);
        }
    }
    if (st == MG_OK) {
        if (!slot) {
            slot = &c->slots[c->slot_count++];
            snprintf(slot->tag, sizeof slot->tag, "%s", tag);
            slot->stream = stream_private ? s : NULL;
        }
        slot->ptr = fresh;
        slot->bytes = bytes;
        *out = fresh;
    }
    pthread_mutex_unlock(&c->scratch_lock);
    return st;
}

mg_status mg_op_cache_scratch(mg_op_cache *c, const char *tag, size_t bytes, mg_stream *s,
                              mg_devptr *out) {
    return scratch(c, tag, bytes, s, false, out);
}

mg_status mg_op_cache_stream_scratch(mg_op_cache *c, const char *tag, size_t bytes, mg_stream *s,
                                     mg_devptr *out) {
    /* the default stream lives as long as the backend: its scratch is shared scratch */
    return scratch(c, tag, bytes, s, s && !s->is_default, out);
}

void mg_op_cache_stream_destroyed(mg_op_cache *c, mg_stream *s) {
    if (!c || !s)
        return;
    pthread_mutex_lock(&c->scratch_lock);
    reclaim_retired(c, false);
    size_t kept = 0;
    for (size_t i = 0; i < c->slot_count; i++) {
        if (c->slots[i].stream == s)
            mg_free(c->backend, c->slots[i].ptr);
        else
            c->slots[kept++] = c->slots[i];
    }
    c->slot_count = kept;
    pthread_mutex_unlock(&c->scratch_lock);
}

void mg_op_cache_scratch_counts(mg_op_cache *c, size_t *live, size_t *retired) {
    pthread_mutex_lock(&c->scratch_lock);
    reclaim_retired(c, false);
    if (live)
        *live = c->slot_count;
    if (retired)
        *retired = c->retired_count;
    pthread_mutex_unlock(&c->scratch_lock);
}

void mg_op_cache_release(mg_op_cache *c) {
    if (!c)
        return;
    pthread_mutex_lock(&c->scratch_lock);
    reclaim_retired(c, true);
    for (size_t i = 0; i < c->slot_count; i++)
        mg_free(c->backend, c->slots[i].ptr);
    free(c->slots);
    free(c->retired);
    pthread_mutex_unlock(&c->scratch_lock);
    for (size_t i = 0; i < c->kernel_capacity; i++) {
        if (c->kernel_table[i]) {
            mg_handle_unregister(c->kernel_table[i]);
            free(c->kernel_table[i]);
        }
    }
    free(c->kernel_table);
    pthread_rwlock_destroy(&c->kernel_lock);
    pthread_mutex_destroy(&c->scratch_lock);
    free(c);
}

/* ------------------------------------------------------------------ gates */

typedef struct gate_entry {
    char *key;
    uint32_t calls;
} gate_entry;

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static gate_entry *gates;
static size_t gate_count, gate_capacity;

/* Counts one call of `key` and says whether it is among the first `limit`. An entry that
 * cannot be stored (out of memory) lets the call through: diagnostics are never lost. */
static bool gate_pass(const char *key, uint32_t limit) {
    pthread_mutex_lock(&gate_lock);
    gate_entry *g = NULL;
    for (size_t i = 0; i < gate_count; i++)
        if (!strcmp(gates[i].key, key))
            g = &gates[i];
    if (!g) {
        if (gate_count == gate_capacity) {
            size_t cap = gate_capacity ? gate_capacity * 2 : 32;
            gate_entry *grown = realloc(gates, cap * sizeof *grown);
            if (!grown) {
                pthread_mutex_unlock(&gate_lock);
                return true;
            }
            gates = grown;
            gate_capacity = cap;
        }
        char *copy = strdup(key);
        if (!copy) {
            pthread_mutex_unlock(&gate_lock);
            return true;
        }
        g = &gates[gate_count++];
        *g = (gate_entry){copy, 0};
    }
    bool pass = g->calls < limit;
    if (g->calls < UINT32_MAX)
        g->calls++;
    pthread_mutex_unlock(&gate_lock);
    return pass;
}

bool mg_diag_env_enabled(const char *name, atomic_int *cached) {
    int v = atomic_load_explicit(cached, memory_order_relaxed);
    if (v < 0) {
        const char *env = getenv(name);
        v = env && !strcmp(env, "1");
        atomic_store_explicit(cached, v, memory_order_relaxed);
    }
    return v == 1;
}

bool mg_gate_once(const char *key) {
    return gate_pass(key, 1);
}

bool mg_gate_first_n(const char *key, uint32_t n) {
    return gate_pass(key, n);
}

bool mg_gate_first_shape(const char *name, uint64_t m, uint64_t n, uint64_t k) {
    char key[256];
    snprintf(key, sizeof key, "shape\x1f%s\x1f%llu\x1f%llu\x1f%llu", name, (unsigned long long)m,
             (unsigned long long)n, (unsigned long long)k);
    return gate_pass(key, 1);
}
