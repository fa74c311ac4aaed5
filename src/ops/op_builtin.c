/* op_builtin.c - the front kit (op_builtin.h). */
#include "op_builtin.h"

#include "backend_impl.h"
#include "error.h"
#include "op_cache.h"

mg_status mg_op_enter(mg_backend *b, const char *fn) {
    return mg_backend_check_live(b, fn);
}

bool mg_op_ranges_overlap(mg_devptr a, size_t a_bytes, mg_devptr b, size_t b_bytes) {
    return a && b && a_bytes && b_bytes && a < b + b_bytes && b < a + a_bytes;
}

static bool may_share(int i, int j, int same_a, int same_b, const mg_op_tensor *t) {
    bool pair = (i == same_a && j == same_b) || (i == same_b && j == same_a);
    return pair && t[i].ptr == t[j].ptr && t[i].bytes == t[j].bytes;
}

mg_status mg_op_check_tensors(mg_backend *b, const char *fn, const mg_op_tensor *t, int count,
                              int same_a, int same_b) {
    mg_status st;
    for (int i = 0; i < count; i++) {
        if (!t[i].ptr && (t[i].flags & MG_OP_OPTIONAL))
            continue;
        if (!t[i].ptr)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s is null", fn, t[i].name);
        if (t[i].alignment > 1 && t[i].ptr % t[i].alignment)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s 0x%llx is not %u-byte aligned", fn,
                            t[i].name, (unsigned long long)t[i].ptr, t[i].alignment);
        if (!t[i].bytes && !(t[i].flags & MG_OP_EMPTY_OK))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: %s spans more bytes than the address space", fn, t[i].name);
        if ((st = mg_backend_check_device_range(b, t[i].ptr, t[i].bytes, fn, t[i].name)))
            return st;
    }
    for (int i = 0; i < count; i++)
        for (int j = 0; j < count; j++)
            if (i != j && (t[i].flags & MG_OP_OUT) && !may_share(i, j, same_a, same_b, t) &&
                mg_op_ranges_overlap(t[i].ptr, t[i].bytes, t[j].ptr, t[j].bytes))
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s and %s overlap", fn,
                                t[i < j ? i : j].name, t[i < j ? j : i].name);
    return MG_OK;
}

mg_status mg_op_launch_kernels(mg_backend *b, mg_stream *s, const char *const *names,
                               mg_launch *launches, int count) {
    if (count < 1 || count > 4)
        return MG_ERROR(MG_ERR_INTERNAL, "mg_op_launch_kernels: %d kernels (1 to 4)", count);
    /* A plan may launch on a backend closed since it was made: refused here. */
    mg_op_cache *cache = mg_backend_op_cache(b);
    mg_status st = cache ? MG_OK : mg_backend_check_live(b, names[0]);
    if (st)
        return st;
    mg_kernel *kernels[4];
    for (int i = 0; i < count; i++)
        if ((st = mg_op_cache_kernel(cache, "metrale", names[i], false, &kernels[i])))
            return st;
    for (int i = 0; i < count; i++) {
        mg_launch_set_flags(&launches[i], launches[i].flags | MG_LAUNCH_PROGRAMMATIC);
        if ((st = mg_launch_run(b, kernels[i], s, &launches[i])))
            return st;
    }
    return MG_OK;
}

mg_status mg_op_run_builtin(mg_backend *b, mg_stream *s, mg_op op, const char *fn,
                            const char *const *names, mg_launch *launches, int count) {
    const mg_op_provider *provider;
    mg_status st = mg_op_choose(b, op, NULL, fn, &provider);
    if (st || (st = mg_op_launch_kernels(b, s, names, launches, count)))
        return st;
    mg_op_count_call(b, op, provider, false);
    return MG_OK;
}
