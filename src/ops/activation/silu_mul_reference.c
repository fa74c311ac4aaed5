/* silu_mul_reference.c - the CPU reference of mg_silu_mul_bf16 and its CPU kernel. */
#include "silu_mul_reference.h"

#include <math.h>
#include <pthread.h>

#include "cpu_kernels.h"
#include "error.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "silu_mul_host.h"

/* The span of `rows` rows of `cols` BF16 with a pitch of `pitch` elements, in bytes. */
static uint64_t span_bytes(uint32_t rows, uint32_t cols, uint32_t pitch) {
    return ((uint64_t)(rows - 1) * pitch + cols) * 2u;
}

static mg_status kernel_silu_mul(const mg_launch *l) {
    static const char name[] = "metrale:" MG_SILU_MUL_KERNEL;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 6);
    if (st)
        return st;
    uint32_t rows = mg_launch_get_u32(l, 2), cols = mg_launch_get_u32(l, 3);
    uint32_t in_pitch = mg_launch_get_u32(l, 4), out_pitch = mg_launch_get_u32(l, 5);
    if (!rows || !cols || in_pitch < 2 * (uint64_t)cols || out_pitch < cols)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: bad shape rows=%u cols=%u in_pitch=%u out_pitch=%u", name,
                        rows, cols, in_pitch, out_pitch);
    void *in, *out;
    if ((st = mg_cpu_kernel_buffer(l, 0, span_bytes(rows, 2 * cols, in_pitch), 2, name, &in)) ||
        (st = mg_cpu_kernel_buffer(l, 1, span_bytes(rows, cols, out_pitch), 2, name, &out)))
        return st;
    const uint16_t *x = in;
    uint16_t *y = out;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++)
            y[(size_t)r * out_pitch + c] = mg_silu_mul_reference_one(
                x[(size_t)r * in_pitch + c], x[(size_t)r * in_pitch + cols + c]);
    return MG_OK;
}

static void register_kernels(void) {
    mg_cpu_kernel_register("metrale", MG_SILU_MUL_KERNEL, kernel_silu_mul);
}

void mg_silu_mul_cpu_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}
