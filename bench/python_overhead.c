/* python_overhead.c - the C side of bench/python_overhead.py: the host time of one mg_gemm call
 * with prebuilt descriptors (a small BF16 GEMM; on the CPU backend its reference runs at
 * enqueue, on CUDA the launch is what is timed, the stream drained after each round outside the
 * timer), so the Python figure can be read against it. Prints the median ns per call of
 * `rounds` rounds of `iters` calls. Usage: python_overhead M N K ITERS ROUNDS [cpu|cuda] */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "metrale/gpu.h"
#include "metrale/ops_gemm.h"

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7)
        return 2;
    const bool cuda = argc == 7 && !strcmp(argv[6], "cuda");
    uint32_t m = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]);
    int iters = atoi(argv[4]), rounds = atoi(argv[5]);
    mg_backend *b;
    if (mg_backend_open(cuda ? MG_BACKEND_CUDA : MG_BACKEND_CPU, cuda ? 0 : 2, &b))
        return fprintf(stderr, "%s\n", mg_last_error()), 1;
    mg_gemm_plan plan = {
        .kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = n, .out_type = MG_DTYPE_F32};
    mg_gemm_tensors t = {0};
    if (mg_alloc(b, (size_t)m * k * 2, &t.act) || mg_alloc(b, (size_t)n * k * 2, &t.weight) ||
        mg_alloc(b, (size_t)m * n * 4, &t.out) || mg_memset(b, t.act, 0x3c, (size_t)m * k * 2) ||
        mg_memset(b, t.weight, 0x3c, (size_t)n * k * 2))
        return fprintf(stderr, "%s\n", mg_last_error()), 1;
    double *per = malloc(sizeof *per * rounds);
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ns();
        for (int i = 0; i < iters; i++)
            if (mg_gemm(b, NULL, &plan, &t))
                return fprintf(stderr, "%s\n", mg_last_error()), 1;
        per[r] = (now_ns() - t0) / iters;
        if (mg_stream_synchronize(mg_stream_default(b)))
            return fprintf(stderr, "%s\n", mg_last_error()), 1;
    }
    qsort(per, rounds, sizeof *per, cmp);
    printf("%.1f\n", per[rounds / 2]);
    free(per);
    return mg_backend_close(b) ? 1 : 0;
}
