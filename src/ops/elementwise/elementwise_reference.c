/* elementwise_reference.c - the CPU references of gather_rows, rmsnorm, argmax, fill_uniform
 * and amax (metrale/ops_elementwise.h defines their results) and their CPU kernels. */
#include "elementwise_reference.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "elementwise_host.h"
#include "error.h"
#include "host_parallel.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "metrale/ops_elementwise.h"

static mg_status bad_shape(const char *name, uint32_t rows, uint32_t cols) {
    return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: bad shape rows=%u cols=%u", name, rows,
                    cols);
}

/* An optional buffer argument (0 allowed): NULL when it is 0. */
static mg_status optional_buffer(const mg_launch *l, uint32_t index, uint64_t bytes,
                                 const char *name, void **out) {
    *out = NULL;
    if (!mg_launch_get_ptr(l, index))
        return MG_OK;
    return mg_cpu_kernel_buffer(l, index, bytes, 2, name, out);
}

static mg_status kernel_gather_rows(const mg_launch *l) {
    static const char name[] = "metrale:" MG_GATHER_ROWS_KERNEL;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 7);
    if (st)
        return st;
    uint32_t rows = mg_launch_get_u32(l, 4), cols = mg_launch_get_u32(l, 5);
    uint32_t src_rows = mg_launch_get_u32(l, 6);
    if (!rows || !cols || !src_rows)
        return bad_shape(name, rows, cols);
    uint64_t src_bytes = (uint64_t)src_rows * cols * 2, out_bytes = (uint64_t)rows * cols * 2;
    void *ids_v, *src_v, *add_v, *out_v;
    if ((st = mg_cpu_kernel_buffer(l, 0, (uint64_t)rows * 4, 4, name, &ids_v)) ||
        (st = mg_cpu_kernel_buffer(l, 1, src_bytes, 2, name, &src_v)) ||
        (st = optional_buffer(l, 2, src_bytes, name, &add_v)) ||
        (st = mg_cpu_kernel_buffer(l, 3, out_bytes, 2, name, &out_v)))
        return st;
    const int32_t *ids = ids_v;
    const uint16_t *src = src_v, *add = add_v;
    uint16_t *out = out_v;
    for (uint32_t r = 0; r < rows; r++) {
        uint16_t *o = out + (size_t)r * cols;
        int32_t id = ids[r];
        if (id < 0 || (uint32_t)id >= src_rows) {
            memset(o, 0, (size_t)cols * 2);
            continue;
        }
        const uint16_t *a = src + (size_t)id * cols;
        if (!add) {
            memcpy(o, a, (size_t)cols * 2);
            continue;
        }
        const uint16_t *d = add + (size_t)id * cols;
        for (uint32_t c = 0; c < cols; c++)
            o[c] = mg_f32_to_bf16(mg_bf16_to_f32(a[c]) + mg_bf16_to_f32(d[c]));
    }
    return MG_OK;
}

static mg_status kernel_rmsnorm(const mg_launch *l) {
    static const char name[] = "metrale:" MG_RMSNORM_KERNEL;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_F32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 7);
    if (st)
        return st;
    uint32_t rows = mg_launch_get_u32(l, 4), cols = mg_launch_get_u32(l, 5);
    float eps = mg_launch_get_f32(l, 6);
    if (!rows || !cols)
        return bad_shape(name, rows, cols);
    uint64_t bytes = (uint64_t)rows * cols * 2;
    void *x_v, *add_v, *w_v, *out_v;
    if ((st = mg_cpu_kernel_buffer(l, 0, bytes, 2, name, &x_v)) ||
        (st = optional_buffer(l, 1, bytes, name, &add_v)) ||
        (st = mg_cpu_kernel_buffer(l, 2, (uint64_t)cols * 2, 2, name, &w_v)) ||
        (st = mg_cpu_kernel_buffer(l, 3, bytes, 2, name, &out_v)))
        return st;
    mg_rmsnorm_bf16_host(rows, cols, eps, x_v, add_v, w_v, out_v);
    return MG_OK;
}

/* argmax_f32 / argmax_bf16 (in, ids, rows, cols, pitch): elements of `element_bytes`. */
static mg_status argmax_rows(const mg_launch *l, const char *name, unsigned element_bytes) {
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32, MG_ARG_U32,
                                        MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 5);
    if (st)
        return st;
    uint32_t rows = mg_launch_get_u32(l, 2), cols = mg_launch_get_u32(l, 3);
    uint32_t pitch = mg_launch_get_u32(l, 4);
    if (!rows || !cols || pitch < cols)
        return bad_shape(name, rows, cols);
    void *in_v, *ids_v;
    if ((st = mg_cpu_kernel_buffer(l, 0, ((uint64_t)(rows - 1) * pitch + cols) * element_bytes,
                                   element_bytes, name, &in_v)) ||
        (st = mg_cpu_kernel_buffer(l, 1, (uint64_t)rows * 4, 4, name, &ids_v)))
        return st;
    mg_argmax_host(rows, cols, in_v, pitch, element_bytes, ids_v);
    return MG_OK;
}

static mg_status kernel_argmax(const mg_launch *l) {
    return argmax_rows(l, "metrale:" MG_ARGMAX_KERNEL, 4);
}

static mg_status kernel_argmax_bf16(const mg_launch *l) {
    return argmax_rows(l, "metrale:" MG_ARGMAX_BF16_KERNEL, 2);
}

/* BF16 [count] of the synthetic-data kernels: count >= 1 and within the address space. */
static mg_status check_count(const char *name, uint64_t count) {
    if (!count || count > SIZE_MAX / 2)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: count=%llu", name,
                        (unsigned long long)count);
    return MG_OK;
}

typedef struct fill_job {
    uint64_t counter;
    float offset, scale;
    uint16_t *out;
} fill_job;

static void fill_part(void *ctx, size_t first, size_t count) {
    const fill_job *j = ctx;
    mg_uniform_bf16_host(j->counter + first, j->offset, j->scale, count, j->out + first);
}

static mg_status kernel_fill_uniform(const mg_launch *l) {
    static const char name[] = "metrale:" MG_FILL_UNIFORM_KERNEL;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_U64, MG_ARG_U64, MG_ARG_F32,
                                        MG_ARG_F32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 5);
    if (st)
        return st;
    const uint64_t count = mg_launch_get_u64(l, 1);
    void *out;
    if ((st = check_count(name, count)))
        return st;
    if ((st = mg_cpu_kernel_buffer(l, 0, count * 2, 2, name, &out)))
        return st;
    fill_job job = {mg_launch_get_u64(l, 2), mg_launch_get_f32(l, 3), mg_launch_get_f32(l, 4), out};
    mg_host_parallel_for((size_t)count, (size_t)1 << 16, fill_part, &job);
    return MG_OK;
}

/* The amax in chunks of per_chunk elements (64 chunks at most), each chunk's maximum in its
 * own slot: any split of the chunks over threads gives the same slots. */
typedef struct amax_job {
    const uint16_t *x;
    size_t count, per_chunk;
    float chunk_max[64];
} amax_job;

static void amax_chunks(void *ctx, size_t first, size_t count) {
    amax_job *j = ctx;
    for (size_t c = first; c < first + count; c++) {
        const size_t end = (c + 1) * j->per_chunk < j->count ? (c + 1) * j->per_chunk : j->count;
        float m = 0.0f;
        for (size_t i = c * j->per_chunk; i < end; i++) {
            const float a = fabsf(mg_bf16_to_f32(j->x[i]));
            if (isfinite(a) && a > m)
                m = a;
        }
        j->chunk_max[c] = m;
    }
}

static mg_status kernel_amax(const mg_launch *l) {
    static const char name[] = "metrale:" MG_AMAX_KERNEL;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U64};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 3);
    if (st)
        return st;
    const uint64_t count = mg_launch_get_u64(l, 2);
    void *x, *out;
    if ((st = check_count(name, count)))
        return st;
    if ((st = mg_cpu_kernel_buffer(l, 0, count * 2, 2, name, &x)) ||
        (st = mg_cpu_kernel_buffer(l, 1, 4, 4, name, &out)))
        return st;
    amax_job job = {.x = x, .count = (size_t)count, .per_chunk = ((size_t)count + 63) / 64};
    if (job.per_chunk < ((size_t)1 << 16))
        job.per_chunk = (size_t)1 << 16;
    const size_t chunks = ((size_t)count + job.per_chunk - 1) / job.per_chunk;
    mg_host_parallel_for(chunks, 1, amax_chunks, &job);
    float m = *(float *)out;
    for (size_t c = 0; c < chunks; c++)
        m = job.chunk_max[c] > m ? job.chunk_max[c] : m;
    *(float *)out = m;
    return MG_OK;
}

static void register_kernels(void) {
    mg_cpu_kernel_register("metrale", MG_FILL_UNIFORM_KERNEL, kernel_fill_uniform);
    mg_cpu_kernel_register("metrale", MG_AMAX_KERNEL, kernel_amax);
    mg_cpu_kernel_register("metrale", MG_GATHER_ROWS_KERNEL, kernel_gather_rows);
    mg_cpu_kernel_register("metrale", MG_RMSNORM_KERNEL, kernel_rmsnorm);
    mg_cpu_kernel_register("metrale", MG_ARGMAX_KERNEL, kernel_argmax);
    mg_cpu_kernel_register("metrale", MG_ARGMAX_BF16_KERNEL, kernel_argmax_bf16);
}

void mg_elementwise_cpu_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}
