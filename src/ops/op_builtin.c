/* op_builtin.c - the helpers of op_builtin.h. */
#include "op_builtin.h"

#include <stdio.h>

#include "backend_impl.h"
#include "error.h"
#include "op_cache.h"

bool mg_op_builtin_available(mg_backend *b, const char *kernel, void (*register_cpu_kernels)(void),
                             char *reason, size_t reason_bytes) {
    mg_op_cache *cache = mg_backend_op_cache(b);
    mg_kernel *k;
    mg_error_state saved;
    mg_error_save(&saved);
    register_cpu_kernels();
    bool ok = cache && mg_op_cache_kernel(cache, "metrale", kernel, false, &k) == MG_OK;
    if (!ok)
        snprintf(reason, reason_bytes, "the backend has no kernel %s: %s", kernel,
                 cache ? mg_last_error() : "closed backend");
    mg_error_restore(&saved);
    return ok;
}

static bool may_share(int i, int j, int same_a, int same_b, const mg_op_tensor *t) {
    bool pair = (i == same_a && j == same_b) || (i == same_b && j == same_a);
    return pair && t[i].ptr == t[j].ptr && t[i].bytes == t[j].bytes;
}

mg_status mg_op_check_tensors(mg_backend *b, const char *fn, const mg_op_tensor *t, int count,
                              int same_a, int same_b) {
    mg_status st;
    for (int i = 0; i < count; i++) {
        if (!t[i].ptr)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s is null", fn, t[i].name);
        if (t[i].ptr % t[i].alignment)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s 0x%llx is not %u-byte aligned", fn,
                            t[i].name, (unsigned long long)t[i].ptr, t[i].alignment);
        if (!t[i].bytes)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: %s spans more bytes than the address space", fn, t[i].name);
        if ((st = mg_backend_check_device_range(b, t[i].ptr, t[i].bytes, fn, t[i].name)))
            return st;
    }
    for (int i = 0; i < count; i++)
        for (int j = 0; j < count; j++)
            if (i != j && t[i].output && !may_share(i, j, same_a, same_b, t) &&
                t[i].ptr < t[j].ptr + t[j].bytes && t[j].ptr < t[i].ptr + t[i].bytes)
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s and %s overlap", fn, t[i].name,
                                t[j].name);
    return MG_OK;
}

mg_status mg_op_run_builtin(mg_backend *b, mg_stream *s, mg_op op, const char *fn,
                            void (*register_cpu_kernels)(void), const char *const *names,
                            const mg_launch *launches, int count) {
    const mg_op_provider *provider;
    mg_status st = mg_op_choose(b, op, NULL, fn, &provider);
    if (st)
        return st;
    mg_op_cache *cache = mg_backend_op_cache(b);
    if (!cache)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: invalid or closed backend", fn);
    if (count < 1 || count > 4)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %d kernels (1 to 4)", fn, count);
    register_cpu_kernels();
    mg_kernel *kernels[4];
    for (int i = 0; i < count; i++)
        if ((st = mg_op_cache_kernel(cache, "metrale", names[i], false, &kernels[i])))
            return st;
    for (int i = 0; i < count; i++)
        if ((st = mg_launch_run(b, kernels[i], s, &launches[i])))
            return st;
    mg_op_count_call(b, op, provider, false);
    return MG_OK;
}
