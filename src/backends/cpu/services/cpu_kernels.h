/*
 * cpu_kernels.h - private: helpers for writing CPU kernels (mg_cpu_kernel_fn, metrale/launch.h).
 *
 * A CPU kernel receives the same argument list a GPU kernel gets. Unlike a GPU kernel it must
 * not trust that list: it checks the argument kinds first, then resolves each buffer argument
 * with the number of bytes it will touch, so a wrong size or a freed buffer is an error
 * naming the kernel and the argument instead of a crash.
 *
 *   static mg_status my_kernel(const mg_launch *l) {
 *       static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_U32};
 *       mg_status st = mg_cpu_kernel_check_args(l, "mine:my_kernel", kinds, 2);
 *       uint32_t n = mg_launch_get_u32(l, 1);
 *       float *out;
 *       if (!st) st = mg_cpu_kernel_buffer(l, 0, (uint64_t)n * 4, 4, "mine:my_kernel", (void
 * **)&out);
 *       ...
 */
#ifndef METRALE_CPU_KERNELS_H
#define METRALE_CPU_KERNELS_H

#include <stdint.h>

#include "metrale/launch.h"

/* MG_OK when `l` has exactly `count` arguments of the given kinds; otherwise
 * MG_ERR_INVALID_ARGUMENT naming `kernel`, the argument index and the kinds. */
mg_status mg_cpu_kernel_check_args(const mg_launch *l, const char *kernel, const mg_arg_kind *kinds,
                                   uint32_t count);

/* Resolves buffer argument `index` to a host address after checking that it is a multiple
 * of `alignment` bytes (what the GPU kernel's loads need; a GPU would fault otherwise) and
 * that [ptr, ptr + bytes) lies inside one live allocation (or host_alloc memory) of the
 * backend running the launch. Only valid inside a kernel called by the CPU backend. */
mg_status mg_cpu_kernel_buffer(const mg_launch *l, uint32_t index, uint64_t bytes,
                               uint32_t alignment, const char *kernel, void **host_out);

#endif
