/* op_registry.c - provider choice, forcing and statistics of the ops (metrale/ops.h). */
#include "op_registry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "error.h"
#include "op_builtin.h"
#include "op_cache.h"
#include "op_state.h"

/* Per backend: the forced provider and the statistics of each op. */
typedef struct op_entry {
    _Atomic(const mg_op_provider *) forced;
    _Atomic(const mg_op_provider *) last;
    atomic_uint_fast64_t calls, plans, caller_workspace_calls;
    atomic_int_fast64_t workspace_bytes;
} op_entry;

typedef struct registry_state {
    op_entry ops[MG_OP_COUNT];
} registry_state;

static mg_status registry_create(mg_backend *b, void **out) {
    (void)b;
    registry_state *st = calloc(1, sizeof *st);
    if (!st)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "op registry state (%zu bytes)", sizeof *st);
    *out = st;
    return MG_OK;
}

static void registry_destroy(mg_backend *b, void *state) {
    (void)b;
    free(state);
}

static const mg_op_state_type registry_state_type = {
    .name = "op registry", .create = registry_create, .destroy = registry_destroy};

static registry_state *state_of(mg_backend *b) {
    void *st = mg_op_state_peek(b, &registry_state_type);
    if (!st) {
        mg_error_state saved;
        mg_error_save(&saved); /* a statistics update never changes the caller's error */
        if (mg_op_state_get(b, &registry_state_type, &st) != MG_OK)
            st = NULL;
        mg_error_restore(&saved);
    }
    return st;
}

const char *mg_op_name(mg_op op) {
    return (unsigned)op < MG_OP_COUNT && mg_op_defs[op] ? mg_op_defs[op]->name : "?";
}

mg_status mg_op_parse(const char *name, mg_op *out) {
    for (int i = 0; name && out && i < MG_OP_COUNT; i++)
        if (mg_op_defs[i] && !strcmp(name, mg_op_defs[i]->name)) {
            *out = (mg_op)i;
            return MG_OK;
        }
    return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_op_parse: unknown op '%s'", name ? name : "");
}

static const mg_op_def *def_of(mg_op op) {
    return (unsigned)op < MG_OP_COUNT ? mg_op_defs[op] : NULL;
}

static bool runs_on(const mg_op_provider *p, mg_backend_kind kind) {
    return p->backend == MG_OP_ANY_BACKEND || p->backend == kind;
}

static const mg_op_provider *find_provider(const mg_op_def *d, const char *name) {
    for (const mg_op_provider *const *p = d->providers; *p; p++)
        if (!strcmp((*p)->name, name))
            return *p;
    return NULL;
}

static void register_every_cpu_kernel(void) {
    for (int op = 0; op < MG_OP_COUNT; op++)
        for (const mg_op_provider *const *p = mg_op_defs[op] ? mg_op_defs[op]->providers : NULL;
             p && *p; p++)
            if ((*p)->register_cpu_kernels)
                (*p)->register_cpu_kernels();
}

void mg_op_register_cpu_kernels(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_every_cpu_kernel);
}

/* Whether `b` (live: validated by the caller) ships every kernel of `names` (module
 * "metrale"); the first missing one otherwise. A lookup that fails sets mg_last_error: the
 * caller's error is restored. */
static bool ships_kernels(mg_backend *b, const char *const *names, char *reason, size_t bytes) {
    mg_op_cache *cache = mg_backend_live_op_cache(b);
    bool ok = true;
    mg_error_state saved;
    mg_error_save(&saved);
    for (; ok && *names; names++) {
        mg_kernel *k;
        ok = mg_op_cache_kernel(cache, "metrale", *names, false, &k) == MG_OK;
        if (!ok)
            snprintf(reason, bytes, "the backend has no kernel %s: %s", *names, mg_last_error());
    }
    mg_error_restore(&saved);
    return ok;
}

bool mg_op_ships_kernel(mg_backend *b, const char *name, char *reason, size_t reason_bytes) {
    const char *const names[] = {name, NULL};
    return ships_kernels(b, names, reason, reason_bytes);
}

/* Whether `p` can run on `b`, a live backend of `kind` (validated once by the caller, so
 * nothing here looks the handle up); the reason otherwise. The hooks leave mg_last_error alone
 * (their contract, op_registry.h), so the hot path copies no message. */
static bool provider_available(mg_backend *b, mg_backend_kind kind, const mg_op_provider *p,
                               char *reason, size_t bytes) {
    if (!runs_on(p, kind)) {
        snprintf(reason, bytes, "provider %s runs on the %s backend, not %s", p->name,
                 mg_backend_kind_name(p->backend), mg_backend_kind_name(kind));
        return false;
    }
    if (p->kernels && !ships_kernels(b, p->kernels, reason, bytes))
        return false;
    return !p->available || p->available(b, reason, bytes);
}

bool mg_op_provider_available(mg_backend *b, mg_op op, const char *provider, char *reason,
                              size_t reason_bytes) {
    char scratch[8];
    if (!reason) {
        reason = scratch;
        reason_bytes = sizeof scratch;
    }
    const mg_op_def *d = def_of(op);
    if (!d) {
        snprintf(reason, reason_bytes, "unknown op %d", (int)op);
        return false;
    }
    mg_backend_kind kind = mg_backend_get_kind(b); /* the one handle lookup of the query */
    if (kind == MG_BACKEND_AUTO) { /* what a NULL, stale or closed handle reads as */
        mg_backend_dead_message(b, "mg_op_provider_available", reason, reason_bytes);
        return false;
    }
    const mg_op_provider *p = provider ? find_provider(d, provider) : NULL;
    if (!p) {
        snprintf(reason, reason_bytes, "op %s has no provider '%s'", d->name,
                 provider ? provider : "(null)");
        return false;
    }
    mg_error_state saved; /* belt and braces: a query never changes the caller's error */
    mg_error_save(&saved);
    bool ok = provider_available(b, kind, p, reason, reason_bytes);
    mg_error_restore(&saved);
    return ok;
}

bool mg_op_supported(mg_backend *b, mg_op op) {
    const mg_op_def *d = def_of(op);
    mg_backend_kind kind = d ? mg_backend_get_kind(b) : MG_BACKEND_AUTO; /* one lookup */
    if (kind == MG_BACKEND_AUTO)
        return false;
    char reason[256];
    mg_error_state saved;
    mg_error_save(&saved);
    bool ok = false;
    for (const mg_op_provider *const *p = d->providers; *p && !ok; p++)
        ok = provider_available(b, kind, *p, reason, sizeof reason);
    mg_error_restore(&saved);
    return ok;
}

size_t mg_op_providers(mg_op op, mg_backend_kind kind, const char **names, size_t max) {
    const mg_op_def *d = def_of(op);
    size_t n = 0;
    for (const mg_op_provider *const *p = d ? d->providers : NULL; p && *p; p++)
        if (runs_on(*p, kind)) {
            if (names && n < max)
                names[n] = (*p)->name;
            n++;
        }
    return n;
}

mg_status mg_op_force_provider(mg_backend *b, mg_op op, const char *provider) {
    const char *fn = "mg_op_force_provider";
    const mg_op_def *d = def_of(op);
    if (!d)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: unknown op %d", fn, (int)op);
    mg_status status = mg_op_enter(b, fn);
    if (status)
        return status;
    mg_backend_kind kind = mg_backend_live_kind(b);
    const mg_op_provider *p = NULL;
    if (provider && strcmp(provider, "auto")) {
        p = find_provider(d, provider);
        if (!p) {
            char names[256] = "";
            for (const mg_op_provider *const *q = d->providers; *q; q++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                         names[0] ? ", " : "", (*q)->name);
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: op %s has no provider '%s' (it has: %s, or auto)", fn, d->name,
                            provider, names);
        }
        if (!runs_on(p, kind))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: provider %s of op %s runs on the %s backend, not %s", fn, p->name,
                            d->name, mg_backend_kind_name(p->backend), mg_backend_kind_name(kind));
    }
    void *st;
    status = mg_op_state_get(b, &registry_state_type, &st);
    if (status)
        return status;
    atomic_store(&((registry_state *)st)->ops[op].forced, p);
    return MG_OK;
}

const mg_op_provider *mg_op_forced(mg_backend *b, mg_op op) {
    registry_state *st =
        (unsigned)op < MG_OP_COUNT ? mg_op_state_peek(b, &registry_state_type) : NULL;
    return st ? atomic_load(&st->ops[op].forced) : NULL;
}

mg_status mg_op_choose(mg_backend *b, mg_op op, const void *call, const char *fn,
                       const mg_op_provider **out) {
    const mg_op_def *d = def_of(op);
    mg_backend_kind kind = mg_backend_live_kind(b); /* the caller entered */
    registry_state *st = state_of(b);
    const mg_op_provider *forced = st ? atomic_load(&st->ops[op].forced) : NULL;
    char reason[256];
    if (forced) {
        if (!provider_available(b, kind, forced, reason, sizeof reason) ||
            (forced->supports && !forced->supports(b, call, reason, sizeof reason)))
            return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: the forced provider %s cannot run it: %s", fn,
                            forced->name, reason);
        *out = forced;
        return MG_OK;
    }
    char why[768] = "";
    for (const mg_op_provider *const *p = d->providers; *p; p++) {
        if (!runs_on(*p, kind))
            continue;
        if (provider_available(b, kind, *p, reason, sizeof reason) &&
            (!(*p)->supports || (*p)->supports(b, call, reason, sizeof reason))) {
            *out = *p;
            return MG_OK;
        }
        snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s: %s", why[0] ? "; " : "",
                 (*p)->name, reason);
    }
    return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: not supported on the %s backend (%s)", fn,
                    mg_backend_kind_name(kind), why[0] ? why : "no provider for this backend");
}

void mg_op_count_call(mg_backend *b, mg_op op, const mg_op_provider *p, bool caller_workspace) {
    registry_state *st = state_of(b);
    if (!st)
        return;
    atomic_fetch_add(&st->ops[op].calls, 1);
    if (caller_workspace)
        atomic_fetch_add(&st->ops[op].caller_workspace_calls, 1);
    atomic_store(&st->ops[op].last, p);
}

void mg_op_count_plans(mg_backend *b, mg_op op, int64_t delta) {
    registry_state *st = state_of(b);
    if (st)
        atomic_fetch_add(&st->ops[op].plans, (uint64_t)delta);
}

void mg_op_count_workspace(mg_backend *b, mg_op op, int64_t delta_bytes) {
    registry_state *st = state_of(b);
    if (st)
        atomic_fetch_add(&st->ops[op].workspace_bytes, delta_bytes);
}

mg_status mg_op_stats_get(mg_backend *b, mg_op op, mg_op_stats *out) {
    const char *fn = "mg_op_stats_get";
    if (!out || !def_of(op))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s", fn, out ? "unknown op" : "NULL output");
    memset(out, 0, sizeof *out);
    void *state;
    mg_status status = mg_op_state_get(b, &registry_state_type, &state);
    if (status)
        return status;
    op_entry *e = &((registry_state *)state)->ops[op];
    out->calls = atomic_load(&e->calls);
    out->plans = atomic_load(&e->plans);
    int64_t ws = atomic_load(&e->workspace_bytes);
    out->workspace_bytes = ws > 0 ? (uint64_t)ws : 0;
    out->caller_workspace_calls = atomic_load(&e->caller_workspace_calls);
    const mg_op_provider *last = atomic_load(&e->last), *forced = atomic_load(&e->forced);
    snprintf(out->provider, sizeof out->provider, "%s", last ? last->name : "");
    snprintf(out->forced, sizeof out->forced, "%s", forced ? forced->name : "");
    return MG_OK;
}
