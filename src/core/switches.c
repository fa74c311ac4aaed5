/*
 * switches.c - process-wide set-once switches (metrale/switches.h).
 *
 * Each switch is one atomic cell holding UNRESOLVED, FALSE or TRUE. Setters and first
 * readers race with a compare-and-swap from UNRESOLVED, so exactly one value is ever stored
 * and every later load sees it. A reader that loses the race returns the winner's value, not
 * its own, which is what makes concurrent first calls agree. The cell holds the whole state,
 * so there is no separate "published" flag that could be observed half-written.
 */
#include "metrale/switches.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { CELL_UNRESOLVED = 0, CELL_FALSE = 1, CELL_TRUE = 2 };

typedef _Atomic int switch_cell;

static switch_cell hermetic_cell = CELL_UNRESOLVED;
static switch_cell midchunk_cell = CELL_UNRESOLVED;
static switch_cell tail_ckpt_cell = CELL_UNRESOLVED;
static switch_cell programmatic_cell = CELL_UNRESOLVED;

static int cell_of(bool value) {
    return value ? CELL_TRUE : CELL_FALSE;
}

/* Stores `value` if the cell is still unresolved. Returns true when this call stored it;
 * *winner receives the value the cell holds afterwards either way. */
static bool cell_publish(switch_cell *cell, bool value, int *winner) {
    int expected = CELL_UNRESOLVED;
    int desired = cell_of(value);
    if (atomic_compare_exchange_strong_explicit(cell, &expected, desired, memory_order_acq_rel,
                                                memory_order_acquire)) {
        *winner = desired;
        return true;
    }
    *winner = expected;
    return false;
}

/* True when the environment variable exists and equals `exact` byte for byte. */
static bool env_equals(const char *name, const char *exact) {
    const char *value = getenv(name);
    return value && strcmp(value, exact) == 0;
}

/* The cached value, resolving it with `resolve` on the first call. */
static bool cell_read(switch_cell *cell, bool (*resolve)(void)) {
    int current = atomic_load_explicit(cell, memory_order_acquire);
    if (current == CELL_UNRESOLVED)
        cell_publish(cell, resolve(), &current);
    return current == CELL_TRUE;
}

static bool hermetic_from_env(void) {
    return env_equals("METRALE_HERMETIC", "1");
}

static bool midchunk_from_env(void) {
    return !env_equals("METRALE_SSM_TAIL_MIDCHUNK", "0");
}

static bool tail_ckpt_from_env(void) {
    return env_equals("METRALE_SSM_TAIL_CKPT", "1");
}

bool mg_hermetic_enabled(void) {
    return cell_read(&hermetic_cell, hermetic_from_env);
}

bool mg_set_hermetic(bool on) {
    if (!on)
        return false; /* only true is published: the environment keeps deciding */
    int winner;
    return cell_publish(&hermetic_cell, true, &winner);
}

bool mg_set_ssm_tail_midchunk(mg_tristate value) {
    if (value != MG_TRISTATE_FALSE && value != MG_TRISTATE_TRUE)
        return false; /* unset (or not a tristate) publishes nothing */
    int winner;
    return cell_publish(&midchunk_cell, value == MG_TRISTATE_TRUE, &winner);
}

bool mg_ssm_tail_midchunk_enabled(void) {
    return cell_read(&midchunk_cell, midchunk_from_env);
}

static bool programmatic_from_env(void) {
    return !env_equals("METRALE_PROGRAMMATIC_LAUNCH", "0");
}

bool mg_set_programmatic_launch(mg_tristate value) {
    if (value != MG_TRISTATE_FALSE && value != MG_TRISTATE_TRUE)
        return false;
    int winner;
    return cell_publish(&programmatic_cell, value == MG_TRISTATE_TRUE, &winner);
}

bool mg_programmatic_launch_enabled(void) {
    return cell_read(&programmatic_cell, programmatic_from_env);
}

bool mg_ssm_tail_ckpt_enabled(void) {
    return cell_read(&tail_ckpt_cell, tail_ckpt_from_env);
}

bool mg_ssm_tail_boundary(uint64_t total_tokens, uint64_t block_size, uint64_t *out) {
    if (block_size == 0 || total_tokens <= block_size)
        return false;
    uint64_t boundary = ((total_tokens - 1) / block_size) * block_size;
    if (boundary == 0)
        return false;
    if (out)
        *out = boundary;
    return true;
}
