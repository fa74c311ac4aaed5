/*
 * metrale/switches.h - process-wide switches: hermetic mode and the SSM tail-snapshot
 * controls, each resolved once per process and cached.
 *
 * Every switch is a set-once cell. The first value that lands in it wins for the life of the
 * process: either a value published by a setter (a command-line flag) or the value the first
 * reader derived from the environment. Consequences a caller may rely on:
 *  - publish flags before anything reads the switch; a setter called after the first read
 *    changes nothing (its return value says so);
 *  - every reader in every thread sees the same value, also when many threads make the
 *    first call at the same time (the cells are C11 atomics; the environment is read with
 *    getenv, so do not setenv concurrently with a first read);
 *  - changing the environment after the first read has no effect.
 *
 * Environment values are compared exactly: "1" is not " 1", "01" or "true".
 *
 *   METRALE_HERMETIC=1          hermetic mode on (mg_hermetic_enabled)
 *   METRALE_SSM_TAIL_MIDCHUNK=0 mid-chunk SSM tail capture off (mg_ssm_tail_midchunk_enabled)
 *   METRALE_SSM_TAIL_CKPT=1     tail-checkpoint chunk split on (mg_ssm_tail_ckpt_enabled)
 *   METRALE_PROGRAMMATIC_LAUNCH=0  programmatic dependent launch off
 *                                  (mg_programmatic_launch_enabled)
 */
#ifndef METRALE_SWITCHES_H
#define METRALE_SWITCHES_H

#include <stdbool.h>
#include <stdint.h>

#include "metrale/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An optional boolean: a flag that was not given (UNSET), or given as false / true. */
typedef enum mg_tristate {
    MG_TRISTATE_UNSET = 0,
    MG_TRISTATE_FALSE = 1,
    MG_TRISTATE_TRUE = 2,
} mg_tristate;

/* Whether hermetic mode is on: mg_set_hermetic(true) was published first, or else
 * METRALE_HERMETIC is exactly "1". Resolved on the first call and cached. */
MG_API bool mg_hermetic_enabled(void);

/* Publishes the hermetic flag (`serve --hermetic`). Only true is published: false is ignored,
 * so without the flag the environment still decides. Returns true when the value was
 * published, false when it was ignored (on == false) or came too late (the switch was
 * already resolved; it keeps its value). */
MG_API bool mg_set_hermetic(bool on);

/* Publishes the mid-chunk SSM tail-capture flag. MG_TRISTATE_UNSET publishes nothing (the
 * environment still decides); MG_TRISTATE_FALSE is `--no-ssm-tail-midchunk`. Shares one
 * set-once cell with mg_ssm_tail_midchunk_enabled: the first published value, or the first
 * read, wins. Returns true when this call published its value. */
MG_API bool mg_set_ssm_tail_midchunk(mg_tristate value);

/* Mid-chunk SSM tail capture: the published value if one was published before the first
 * read; otherwise true unless METRALE_SSM_TAIL_MIDCHUNK is exactly "0". Cached. */
MG_API bool mg_ssm_tail_midchunk_enabled(void);

/* Programmatic dependent launch (metrale/launch.h, MG_LAUNCH_PROGRAMMATIC): the published value
 * if one was published before the first read; otherwise true unless METRALE_PROGRAMMATIC_LAUNCH
 * is exactly "0". Off, every kernel launches with plain stream order, so the effect of PDL on a
 * run can be measured with the same binary. Read by the CUDA backend at each launch. */
MG_API bool mg_programmatic_launch_enabled(void);
/* Publishes it before the first read, as mg_set_ssm_tail_midchunk does for its switch. */
MG_API bool mg_set_programmatic_launch(mg_tristate value);

/* Tail-checkpoint chunk split: true only when METRALE_SSM_TAIL_CKPT is exactly "1".
 * Resolved on the first call and cached. */
MG_API bool mg_ssm_tail_ckpt_enabled(void);

/* The last multiple of `block_size` strictly below `total_tokens`, ((total - 1) / bs) * bs,
 * written to *out with true returned. Returns false ("none", *out untouched) when
 * block_size == 0, when total_tokens <= block_size, or when that value would be 0.
 * Examples: (17,16)->16, (32,16)->16, (33,16)->32, (16,16)->none, (2,1)->1.
 * `out` may be NULL to ask only whether a boundary exists. Pure; never fails. */
MG_API bool mg_ssm_tail_boundary(uint64_t total_tokens, uint64_t block_size, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
