/*
 * test_cuda_util.h - what the CUDA backend's device tests share: open CUDA device 0 or skip
 * (exit 77, with the reason) where no CUDA device is usable, and small launch helpers for
 * the built-in test kernels (kernels/cuda/test_kernels.cu).
 */
#ifndef METRALE_TEST_CUDA_UTIL_H
#define METRALE_TEST_CUDA_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "metrale/launch.h"
#include "test_util.h"

#define TEST_SKIP_EXIT 77

/* CUDA device 0, or exits 77 saying why it cannot be used here. */
static inline mg_backend *cuda_test_open_or_skip(const char *test_name) {
    mg_backend_probe probe;
    mg_backend_probe_kind(MG_BACKEND_CUDA, &probe);
    if (!probe.compiled_in || !probe.usable) {
        printf("%s: skipped: the CUDA backend is not usable here: %s\n", test_name,
               probe.compiled_in ? probe.reason : "not compiled in");
        exit(TEST_SKIP_EXIT);
    }
    mg_backend *b = NULL;
    mg_status st = mg_backend_open(MG_BACKEND_CUDA, 0, &b);
    if (st) {
        fprintf(stderr, "FAIL %s: mg_backend_open(cuda, 0): %s: %s\n", test_name,
                mg_status_name(st), mg_last_error());
        exit(1);
    }
    mg_device_info info;
    if (mg_device_get_info(b, &info) == MG_OK)
        printf("%s on %s (sm_%d%d, %d SMs, driver %s)\n", test_name, info.name, info.cc_major,
               info.cc_minor, info.multiprocessors, info.driver);
    return b;
}

/* A built-in kernel of module "metrale"; NULL (with a failed check) when missing. */
static inline mg_kernel *cuda_test_kernel(mg_backend *b, const char *function) {
    mg_kernel *k = NULL;
    CHECK_OK(mg_kernel_lookup(b, "metrale", function, &k));
    return k;
}

/* fill_u32(out, v, n) on `s`. */
static inline mg_status cuda_test_fill_u32(mg_backend *b, mg_kernel *k, mg_stream *s, mg_devptr out,
                                           uint32_t v, uint32_t n) {
    mg_launch l;
    mg_dim3 grid, block;
    mg_launch_config_1d(n, 256, &grid, &block);
    mg_launch_init(&l, grid, block, 0);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, v);
    mg_launch_arg_u32(&l, n);
    return mg_launch_run(b, k, s, &l);
}

/* spin_kernel(ns): keeps `s` busy for at least `ns` of device time. */
static inline mg_status cuda_test_spin(mg_backend *b, mg_kernel *k, mg_stream *s, uint64_t ns) {
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_launch_arg_u64(&l, ns);
    return mg_launch_run(b, k, s, &l);
}

/* vector_add(a, b, out, n): out = a + b over floats. */
static inline mg_status cuda_test_vector_add(mg_backend *b, mg_kernel *k, mg_stream *s, mg_devptr x,
                                             mg_devptr y, mg_devptr out, uint32_t n) {
    mg_launch l;
    mg_dim3 grid, block;
    mg_launch_config_1d(n, 128, &grid, &block);
    mg_launch_init(&l, grid, block, 0);
    mg_launch_arg_ptr(&l, x);
    mg_launch_arg_ptr(&l, y);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, n);
    return mg_launch_run(b, k, s, &l);
}

#endif
