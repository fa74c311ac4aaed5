/* op_state.c - the per-backend op state slots (op_state.h). */
#include "op_state.h"

#include <stdlib.h>

#include "backend_internal.h"
#include "error.h"

struct mg_op_state_slot {
    const mg_op_state_type *type;
    void *state;
};

static mg_op_state_slot *find_slot(mg_backend *b, const mg_op_state_type *type) {
    for (size_t i = 0; i < b->op_state_count; i++)
        if (b->op_states[i].type == type)
            return &b->op_states[i];
    return NULL;
}

mg_status mg_op_state_get(mg_backend *b, const mg_op_state_type *type, void **out) {
    const char *name = type && type->name ? type->name : "op state";
    mg_status st = mg_core_enter(b, name);
    if (st)
        return st;
    if (!type || !type->create || !type->destroy || !out)
        return MG_ERROR(MG_ERR_INTERNAL,
                        "mg_op_state_get(%s): incomplete state type or NULL output", name);
    pthread_mutex_lock(&b->op_state_lock);
    mg_op_state_slot *slot = find_slot(b, type);
    if (slot) {
        *out = slot->state;
        pthread_mutex_unlock(&b->op_state_lock);
        return MG_OK;
    }
    if (b->op_state_count == b->op_state_capacity) {
        size_t cap = b->op_state_capacity ? b->op_state_capacity * 2 : 8;
        mg_op_state_slot *grown = realloc(b->op_states, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&b->op_state_lock);
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: op state table of %zu slots", name, cap);
        }
        b->op_states = grown;
        b->op_state_capacity = cap;
    }
    void *state = NULL;
    st = type->create(b, &state);
    if (st == MG_OK) {
        b->op_states[b->op_state_count++] = (mg_op_state_slot){type, state};
        *out = state;
    }
    pthread_mutex_unlock(&b->op_state_lock);
    return st;
}

void *mg_op_state_peek(mg_backend *b, const mg_op_state_type *type) {
    if (!b || !type)
        return NULL;
    pthread_mutex_lock(&b->op_state_lock);
    mg_op_state_slot *slot = find_slot(b, type);
    void *state = slot ? slot->state : NULL;
    pthread_mutex_unlock(&b->op_state_lock);
    return state;
}

void mg_op_state_release_all(mg_backend *b) {
    pthread_mutex_lock(&b->op_state_lock);
    while (b->op_state_count) {
        mg_op_state_slot slot = b->op_states[--b->op_state_count];
        pthread_mutex_unlock(&b->op_state_lock); /* destroy may call back into the backend */
        slot.type->destroy(b, slot.state);
        pthread_mutex_lock(&b->op_state_lock);
    }
    free(b->op_states);
    b->op_states = NULL;
    b->op_state_capacity = 0;
    pthread_mutex_unlock(&b->op_state_lock);
}

void mg_op_state_stream_destroyed(mg_backend *b, mg_stream *s) {
    /* The callbacks run without the lock: they may ask for op state themselves (statistics).
     * Slots are only ever appended while the backend lives, so the first `count` stay put. */
    pthread_mutex_lock(&b->op_state_lock);
    size_t count = b->op_state_count;
    pthread_mutex_unlock(&b->op_state_lock);
    for (size_t i = 0; i < count; i++) {
        pthread_mutex_lock(&b->op_state_lock);
        mg_op_state_slot slot = b->op_states[i]; /* the table may move when it grows */
        pthread_mutex_unlock(&b->op_state_lock);
        if (slot.type->stream_destroyed)
            slot.type->stream_destroyed(b, slot.state, s);
    }
}
