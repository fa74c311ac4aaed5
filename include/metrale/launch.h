/*
 * metrale/launch.h - the kernel-launch builder: grid, block, dynamic shared bytes, then typed
 * arguments, recorded once and launched on any backend.
 *
 *   mg_launch l;
 *   mg_launch_init(&l, grid, block, shared_bytes);
 *   mg_launch_arg_ptr(&l, out);  mg_launch_arg_u32(&l, n);  mg_launch_arg_f32(&l, alpha);
 *   mg_launch_run(backend, kernel, stream, &l);           // metrale/gpu.h
 *
 * Layout a kernel may rely on: every argument starts in a fresh 8-byte slot and occupies
 * ceil(size / 8) slots, at least one (an empty byte argument still has a slot, so argument
 * indices never shift). A 128-byte tensor map takes exactly 16 slots and the next argument
 * starts right after them. On CUDA each argument is passed as one kernel parameter (a pointer
 * to its first slot); the CPU backend's C kernels receive the same list. The Metal backend
 * binds argument i at index i: buffers with setBuffer:offset:atIndex:, every other kind with
 * setBytes:length:atIndex: (an empty byte argument binds nothing); tensor maps, more than 31
 * arguments and scalars over 4 KiB are MG_ERR_UNSUPPORTED there.
 *
 * The builder does not allocate. Errors while adding arguments (too many, too large) are
 * remembered and returned by mg_launch_run, so a caller may add arguments without checking
 * each call; mg_launch_status tells early.
 */
#ifndef METRALE_LAUNCH_H
#define METRALE_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_LAUNCH_MAX_ARGS 64
#define MG_LAUNCH_MAX_SLOTS 512 /* 4 KiB of argument bytes, CUDA's classic parameter limit */
#define MG_TENSOR_MAP_BYTES 128

typedef enum mg_arg_kind {
    MG_ARG_BUFFER = 0, /* device pointer (mg_devptr) */
    MG_ARG_U32,
    MG_ARG_I32,
    MG_ARG_U64,
    MG_ARG_F32,
    MG_ARG_BYTES,      /* raw bytes of any length, including 0 */
    MG_ARG_TENSOR_MAP, /* 128-byte CUtensorMap, passed by value */
} mg_arg_kind;

typedef struct mg_launch_arg {
    mg_arg_kind kind;
    uint32_t first_slot; /* index into slots[] */
    uint32_t bytes;      /* payload size: 8 for buffers, 4 for u32/i32/f32, ... */
} mg_launch_arg;

/* Launch flags (mg_launch_set_flags). */
/* Programmatic dependent launch. The kernel promises that it reads nothing the work before it on
 * the stream writes, and writes nothing, until it has waited on its grid dependency
 * (griddepcontrol.wait, kernels/cuda/common/grid_dependency.cuh); what it loads before the wait
 * (weights, tables that no earlier kernel writes) may then stream while that earlier kernel
 * drains. The CUDA backend launches such a kernel with programmatic stream serialization on
 * compute capability 9.0 and newer, in eager launches and in graph captures alike; elsewhere,
 * and on the CPU backend, the flag changes nothing. */
#define MG_LAUNCH_PROGRAMMATIC 1u

struct mg_launch {
    mg_dim3 grid;
    mg_dim3 block;
    uint32_t shared_bytes;
    uint32_t flags; /* MG_LAUNCH_* (mg_launch_init clears them) */
    uint32_t arg_count;
    uint32_t slot_count;
    mg_status error;         /* first error while building; MG_OK otherwise */
    char error_message[192]; /* its message, kept for mg_launch_run's report */
    mg_launch_arg args[MG_LAUNCH_MAX_ARGS];
    _Alignas(64) uint64_t slots[MG_LAUNCH_MAX_SLOTS];
};

MG_API void mg_launch_init(mg_launch *l, mg_dim3 grid, mg_dim3 block, uint32_t shared_bytes);
/* Sets the launch flags (MG_LAUNCH_*); mg_launch_clear_args keeps them. */
MG_API void mg_launch_set_flags(mg_launch *l, uint32_t flags);
/* Drops the arguments, keeps grid/block/shared bytes: reuse for the next launch. */
MG_API void mg_launch_clear_args(mg_launch *l);

MG_API void mg_launch_arg_ptr(mg_launch *l, mg_devptr p);
MG_API void mg_launch_arg_u32(mg_launch *l, uint32_t v);
MG_API void mg_launch_arg_i32(mg_launch *l, int32_t v);
MG_API void mg_launch_arg_u64(mg_launch *l, uint64_t v);
MG_API void mg_launch_arg_f32(mg_launch *l, float v);
MG_API void mg_launch_arg_bytes(mg_launch *l, const void *data, size_t bytes);
MG_API void mg_launch_arg_tensor_map(mg_launch *l, const void *map128);

/* MG_OK, or the first error met while adding arguments (message set at that time). */
MG_API mg_status mg_launch_status(const mg_launch *l);

/* Enqueues `count` launches of kernel `k` with the same builder on `s`, checking handles and
 * arguments once and skipping per-launch timing and debug synchronisation: the backend's
 * own launch floor, which benchmarks compare mg_launch_run's per-call cost against. */
MG_API mg_status mg_launch_run_repeated(mg_backend *b, mg_kernel *k, mg_stream *s,
                                        const mg_launch *launch, uint32_t count);

/* Pointer to argument i's first slot, or NULL if i is out of range. */
MG_API const void *mg_launch_arg_data(const mg_launch *l, uint32_t i);

/* Typed readers for the CPU backend's C kernels; out-of-range index or wrong kind reads 0. */
MG_API mg_devptr mg_launch_get_ptr(const mg_launch *l, uint32_t i);
MG_API uint32_t mg_launch_get_u32(const mg_launch *l, uint32_t i);
MG_API int32_t mg_launch_get_i32(const mg_launch *l, uint32_t i);
MG_API uint64_t mg_launch_get_u64(const mg_launch *l, uint32_t i);
MG_API float mg_launch_get_f32(const mg_launch *l, uint32_t i);

/* Writes "name(ptr=0x..., u32=5, f32=1.5, bytes[24], tmap)" into buf (debug-sync reports). */
MG_API void mg_launch_describe(const mg_launch *l, const char *name, char *buf, size_t buf_bytes);

/* ------------------------------------------------------------------ CPU kernels */

/* A kernel of the CPU backend: a C function that runs the whole grid (every block, every
 * thread) and reads its arguments from the same list a GPU kernel gets. Device pointers are
 * host addresses on the CPU backend. Return MG_OK or a status with mg_error set. */
typedef mg_status (*mg_cpu_kernel_fn)(const mg_launch *launch);

/* Registers `fn` under (module, function) for every CPU backend of the process. Registering
 * the same name again replaces it. Thread-safe. */
MG_API mg_status mg_cpu_kernel_register(const char *module, const char *function,
                                        mg_cpu_kernel_fn fn);

#ifdef __cplusplus
}
#endif
#endif
