/*
 * op_builtin.h - private to src/ops: the front kit. Every op front reads the same way:
 *
 *   mg_status st = mg_op_enter(b, fn);            the handle, validated once
 *   ... the op's own checks of shapes and modes ...
 *   mg_op_tensor t[] = {{"in", in, in_bytes, 16, MG_OP_IN}, {"out", out, out_bytes, 16,
 * MG_OP_OUT}}; st = mg_op_check_tensors(b, fn, t, 2, -1, -1); pointers, alignment, range, overlap
 *   st = mg_op_run_builtin(b, s, op, fn, names, launches, count);   or a provider's run hook
 *
 * A kernel-by-name op's provider is MG_OP_KERNELS_PROVIDER (op_registry.h); its CPU kernels
 * are registered once per process when the first CPU backend opens, not by the front. Copy
 * activation/silu_mul.c (one kernel) or moe/moe_routing.c (several) as a template.
 */
#ifndef METRALE_OP_BUILTIN_H
#define METRALE_OP_BUILTIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checked_math.h"
#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "op_registry.h"

/* The first check of every public op call, and the only validation of `b` the op framework
 * makes for it: MG_ERR_INVALID_ARGUMENT with the core's one dead-handle message
 * (mg_backend_check_live: "`fn`: NULL, invalid or closed backend handle ...") unless `b` is a
 * live backend. No sticky-fault check. Later checks of the call, mg_op_choose and the
 * provider hooks rely on `b` being live; the CPU kernels of every op are registered already
 * (they are when a CPU backend opens). */
mg_status mg_op_enter(mg_backend *b, const char *fn);

/* What a call does with a tensor (flags of mg_op_tensor): reads it, writes it; whether it may
 * be absent (ptr 0: not checked, overlaps nothing); whether bytes 0 is an empty tensor (its
 * pointer still checked) rather than a size that overflowed. */
enum { MG_OP_IN = 0, MG_OP_OUT = 1, MG_OP_OPTIONAL = 2, MG_OP_EMPTY_OK = 4 };

/* One device tensor of a call: its start, the bytes the call touches (0: the size overflowed),
 * the alignment the kernels need, and MG_OP_IN or MG_OP_OUT, with MG_OP_OPTIONAL and
 * MG_OP_EMPTY_OK or-ed in as needed. */
typedef struct mg_op_tensor {
    const char *name;
    mg_devptr ptr;
    size_t bytes;
    uint32_t alignment;
    unsigned flags;
} mg_op_tensor;

/* The bytes of a rows x cols matrix of `element_bytes` elements with row pitch `pitch`
 * (elements), as an mg_op_tensor's size: 0 when it overflows, which the checker refuses. */
static inline size_t mg_op_matrix_bytes(uint64_t rows, uint64_t cols, uint64_t pitch,
                                        uint64_t element_bytes) {
    size_t bytes;
    return mg_matrix_span_bytes(rows, cols, pitch, element_bytes, &bytes) ? bytes : 0;
}

/* Non-null (unless MG_OP_OPTIONAL), aligned, inside the backend's allocations, and no output
 * overlapping another tensor -- except tensors `same_a` and `same_b` (indices; -1: none), which
 * may be exactly the same range. This is the overlap rule every op header states: an output
 * shares no byte with another operand unless the header names the pair. MG_ERR_INVALID_ARGUMENT
 * naming `fn` and the two tensors, in the order given, otherwise ("fn: in and out overlap"). */
mg_status mg_op_check_tensors(mg_backend *b, const char *fn, const mg_op_tensor *t, int count,
                              int same_a, int same_b);

/* Whether two ranges share a byte (empty or absent ranges share none): for the few ops that
 * also refuse overlapping inputs. */
bool mg_op_ranges_overlap(mg_devptr a, size_t a_bytes, mg_devptr b, size_t b_bytes);

/* Resolves the `count` (1 to 4) kernels `names` of module "metrale" on `b` (memoised in the op
 * cache), then launches them in order on `s`: a missing kernel writes nothing. A `b` closed
 * since the caller checked it (a plan outliving its backend) is refused with the dead-handle
 * message. Counts nothing: for providers whose front counts the call.
 * Every launch gets MG_LAUNCH_PROGRAMMATIC (set in `launches`): every kernel of module
 * "metrale" waits on its grid dependency before it reads or writes anything earlier work
 * touches (kernels/cuda/common/grid_dependency.cuh; tests/kernels_wait_check.py checks that
 * each one calls it), so on CUDA it may be launched while the kernel before it drains. */
mg_status mg_op_launch_kernels(mg_backend *b, mg_stream *s, const char *const *names,
                               mg_launch *launches, int count);

/* Chooses `op`'s provider (no call description: for ops with one "kernels" provider), launches
 * the kernels as mg_op_launch_kernels does and counts the call. */
mg_status mg_op_run_builtin(mg_backend *b, mg_stream *s, mg_op op, const char *fn,
                            const char *const *names, mg_launch *launches, int count);

#endif
