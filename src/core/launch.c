/* launch.c - the launch builder's argument list (metrale/launch.h). */
#include "metrale/launch.h"

#include <stdio.h>
#include <string.h>

#include "error.h"

/* Keeps the first error and its message (callers format a message only while there is no
 * error yet, so the thread's message stays the first one too): the thread-local message may be
 * overwritten by the time mg_launch_run reports it. */
static void builder_fail(mg_launch *l, mg_status st) {
    if (l->error != MG_OK)
        return;
    l->error = st;
    snprintf(l->error_message, sizeof l->error_message, "%s", mg_last_error());
}

void mg_launch_init(mg_launch *l, mg_dim3 grid, mg_dim3 block, uint32_t shared_bytes) {
    l->grid = grid;
    l->block = block;
    l->shared_bytes = shared_bytes;
    l->flags = 0;
    mg_launch_clear_args(l);
}

void mg_launch_set_flags(mg_launch *l, uint32_t flags) {
    l->flags = flags;
}

void mg_launch_clear_args(mg_launch *l) {
    l->arg_count = 0;
    l->slot_count = 0;
    l->error = MG_OK;
    l->error_message[0] = '\0';
}

/* Reserves the slots of one argument and copies its payload; the unused tail of the last
 * slot is zeroed so the list is deterministic (graph-update comparisons, debug dumps). */
static void push_arg(mg_launch *l, mg_arg_kind kind, const void *data, size_t bytes) {
    if (l->error != MG_OK)
        return;
    if (l->arg_count >= MG_LAUNCH_MAX_ARGS) {
        builder_fail(l, MG_ERROR(MG_ERR_INVALID_ARGUMENT, "launch builder: more than %d arguments",
                                 MG_LAUNCH_MAX_ARGS));
        return;
    }
    /* Divide first: (bytes + 7) / 8 wraps to a tiny count for lengths near SIZE_MAX. */
    size_t slots = bytes == 0 ? 1 : bytes / 8 + (bytes % 8 != 0);
    if (slots > (size_t)(MG_LAUNCH_MAX_SLOTS - l->slot_count)) {
        builder_fail(l, MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                 "launch builder: argument %u of %zu bytes exceeds the %d-byte "
                                 "argument space (%u bytes used)",
                                 l->arg_count, bytes, MG_LAUNCH_MAX_SLOTS * 8, l->slot_count * 8));
        return;
    }
    uint64_t *first = &l->slots[l->slot_count];
    memset(first, 0, slots * 8);
    if (bytes)
        memcpy(first, data, bytes);
    l->args[l->arg_count] = (mg_launch_arg){kind, l->slot_count, (uint32_t)bytes};
    l->arg_count++;
    l->slot_count += (uint32_t)slots;
}

void mg_launch_arg_ptr(mg_launch *l, mg_devptr p) {
    push_arg(l, MG_ARG_BUFFER, &p, sizeof p);
}
void mg_launch_arg_u32(mg_launch *l, uint32_t v) {
    push_arg(l, MG_ARG_U32, &v, sizeof v);
}
void mg_launch_arg_i32(mg_launch *l, int32_t v) {
    push_arg(l, MG_ARG_I32, &v, sizeof v);
}
void mg_launch_arg_u64(mg_launch *l, uint64_t v) {
    push_arg(l, MG_ARG_U64, &v, sizeof v);
}
void mg_launch_arg_f32(mg_launch *l, float v) {
    push_arg(l, MG_ARG_F32, &v, sizeof v);
}
void mg_launch_arg_bytes(mg_launch *l, const void *data, size_t bytes) {
    if (bytes && !data) {
        if (l->error == MG_OK)
            builder_fail(l, MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                     "launch builder: NULL data for a %zu-byte argument", bytes));
        return;
    }
    push_arg(l, MG_ARG_BYTES, data, bytes);
}
void mg_launch_arg_tensor_map(mg_launch *l, const void *map128) {
    if (!map128) {
        if (l->error == MG_OK)
            builder_fail(l, MG_ERROR(MG_ERR_INVALID_ARGUMENT, "launch builder: NULL tensor map"));
        return;
    }
    push_arg(l, MG_ARG_TENSOR_MAP, map128, MG_TENSOR_MAP_BYTES);
}

mg_status mg_launch_status(const mg_launch *l) {
    return l->error;
}

const void *mg_launch_arg_data(const mg_launch *l, uint32_t i) {
    if (!l || i >= l->arg_count)
        return NULL;
    return &l->slots[l->args[i].first_slot];
}

/* Reads argument i when it has the expected kind and size; 0 otherwise. */
static uint64_t read_scalar(const mg_launch *l, uint32_t i, mg_arg_kind kind) {
    if (!l || i >= l->arg_count || l->args[i].kind != kind)
        return 0;
    uint64_t v = 0;
    memcpy(&v, &l->slots[l->args[i].first_slot], l->args[i].bytes);
    return v;
}

mg_devptr mg_launch_get_ptr(const mg_launch *l, uint32_t i) {
    return read_scalar(l, i, MG_ARG_BUFFER);
}
uint32_t mg_launch_get_u32(const mg_launch *l, uint32_t i) {
    return (uint32_t)read_scalar(l, i, MG_ARG_U32);
}
int32_t mg_launch_get_i32(const mg_launch *l, uint32_t i) {
    uint32_t bits = (uint32_t)read_scalar(l, i, MG_ARG_I32);
    int32_t v;
    memcpy(&v, &bits, sizeof v);
    return v;
}
uint64_t mg_launch_get_u64(const mg_launch *l, uint32_t i) {
    return read_scalar(l, i, MG_ARG_U64);
}
float mg_launch_get_f32(const mg_launch *l, uint32_t i) {
    uint32_t bits = (uint32_t)read_scalar(l, i, MG_ARG_F32);
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

void mg_launch_describe(const mg_launch *l, const char *name, char *buf, size_t buf_bytes) {
    if (!buf || buf_bytes == 0)
        return;
    size_t used = (size_t)snprintf(buf, buf_bytes, "%s<<<(%u,%u,%u),(%u,%u,%u),%u>>>(",
                                   name ? name : "?", l->grid.x, l->grid.y, l->grid.z, l->block.x,
                                   l->block.y, l->block.z, l->shared_bytes);
    for (uint32_t i = 0; i < l->arg_count && used < buf_bytes; i++) {
        const char *sep = i ? ", " : "";
        int n = 0;
        switch (l->args[i].kind) {
        case MG_ARG_BUFFER:
            n = snprintf(buf + used, buf_bytes - used, "%sptr=0x%llx", sep,
                         (unsigned long long)mg_launch_get_ptr(l, i));
            break;
        case MG_ARG_U32:
            n = snprintf(buf + used, buf_bytes - used, "%su32=%u", sep, mg_launch_get_u32(l, i));
            break;
        case MG_ARG_I32:
            n = snprintf(buf + used, buf_bytes - used, "%si32=%d", sep, mg_launch_get_i32(l, i));
            break;
        case MG_ARG_U64:
            n = snprintf(buf + used, buf_bytes - used, "%su64=%llu", sep,
                         (unsigned long long)mg_launch_get_u64(l, i));
            break;
        case MG_ARG_F32:
            n = snprintf(buf + used, buf_bytes - used, "%sf32=%g", sep,
                         (double)mg_launch_get_f32(l, i));
            break;
        case MG_ARG_BYTES:
            n = snprintf(buf + used, buf_bytes - used, "%sbytes[%u]", sep, l->args[i].bytes);
            break;
        case MG_ARG_TENSOR_MAP:
            n = snprintf(buf + used, buf_bytes - used, "%stensor_map", sep);
            break;
        }
        if (n < 0)
            return;
        used += (size_t)n;
    }
    if (used < buf_bytes)
        snprintf(buf + used, buf_bytes - used, ")");
}

void mg_launch_config_1d(uint64_t n, uint32_t block, mg_dim3 *grid_out, mg_dim3 *block_out) {
    if (block == 0)
        block = 256;
    uint64_t blocks = n / block + (n % block != 0); /* n + block - 1 could wrap */
    if (blocks == 0)
        blocks = 1;
    if (blocks > 0x7fffffffu)
        blocks = 0x7fffffffu; /* grid-stride kernels cover the rest */
    *grid_out = (mg_dim3){(uint32_t)blocks, 1, 1};
    *block_out = (mg_dim3){block, 1, 1};
}
