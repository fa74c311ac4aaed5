/*
 * op_builtin.h - private: what the fronts of ops that run our own kernels (module "metrale",
 * provider "kernels") share: the provider's availability test, the check of an op's device
 * tensors, and running a sequence of kernels with every one resolved before the first launch.
 */
#ifndef METRALE_OP_BUILTIN_H
#define METRALE_OP_BUILTIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "op_registry.h"

/* Whether `b` ships `kernel` (after `register_cpu_kernels`, which makes the CPU backend's
 * reference kernels known); on false writes the reason. Sets no error. */
bool mg_op_builtin_available(mg_backend *b, const char *kernel, void (*register_cpu_kernels)(void),
                             char *reason, size_t reason_bytes);

/* One device tensor of a call: its start, the bytes the call touches (0: the size overflowed),
 * the alignment the kernels need, and whether the call writes it. */
typedef struct mg_op_tensor {
    const char *name;
    mg_devptr ptr;
    size_t bytes;
    uint32_t alignment;
    bool output;
} mg_op_tensor;

/* Non-null, aligned, inside the backend's allocations, and no output overlapping another tensor
 * -- except tensors `same_a` and `same_b` (indices; -1: none), which may be exactly the same
 * range. MG_ERR_INVALID_ARGUMENT naming `fn` and the tensor otherwise. */
mg_status mg_op_check_tensors(mg_backend *b, const char *fn, const mg_op_tensor *t, int count,
                              int same_a, int same_b);

/* Chooses `op`'s provider, resolves the `count` (<= 4) kernels `names` of module "metrale" (so a
 * missing one writes nothing), launches them in order on `s` and counts the call. */
mg_status mg_op_run_builtin(mg_backend *b, mg_stream *s, mg_op op, const char *fn,
                            void (*register_cpu_kernels)(void), const char *const *names,
                            const mg_launch *launches, int count);

#endif
