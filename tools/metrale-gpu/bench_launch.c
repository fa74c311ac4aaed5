/* bench_launch.c - `metrale-gpu bench launch`: the cost of a kernel launch through the
 * launch builder, eager (host time per launch, and device-event time like PyTorch's figure)
 * and per kernel node under graph replay. The kernel is vector_add over one element, a tiny
 * kernel with four arguments, like PyTorch's x.add_(1.0) in bench/peers/peers_copy_launch.py. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/launch.h"

typedef struct launch_case {
    mg_kernel *kernel, *empty; /* vector_add; empty_kernel (no arguments) */
    mg_devptr a, b, out;
    int launches; /* per iteration */
} launch_case;

/* One block of 32 threads, with vector_add's arguments over one element or, for
 * empty_kernel, none. */
static void one_block_launch(const launch_case *c, bool vector_add_args, mg_launch *l) {
    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){32, 1, 1}, 0);
    if (!vector_add_args)
        return;
    mg_launch_arg_ptr(l, c->a);
    mg_launch_arg_ptr(l, c->b);
    mg_launch_arg_ptr(l, c->out);
    mg_launch_arg_u32(l, 1);
}

/* c->launches launches of `kernel`, each built afresh: the builder is part of the cost. */
static mg_status run_launches(mg_bench *b, const launch_case *c, mg_kernel *kernel,
                              bool vector_add_args) {
    mg_status st = MG_OK;
    for (int i = 0; !st && i < c->launches; i++) {
        mg_launch l;
        one_block_launch(c, vector_add_args, &l);
        st = mg_launch_run(b->backend, kernel, b->stream, &l);
    }
    return st;
}

static mg_status body_launches(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    launch_case *c = arg;
    return run_launches(b, c, c->kernel, true);
}

static mg_status body_empty_launches(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    launch_case *c = arg;
    return run_launches(b, c, c->empty, false);
}

/* The same launches checked once and sent straight to the backend (on CUDA: cuLaunchKernel
 * alone): the driver's floor under eager_host. */
static mg_status body_driver_launches(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    launch_case *c = arg;
    mg_launch l;
    one_block_launch(c, true, &l);
    return mg_launch_run_repeated(b->backend, c->kernel, b->stream, &l, (uint32_t)c->launches);
}

static int add_row(mg_bench *b, const char *name, const char *timing, mg_status st,
                   mg_bench_row *row, int launches, const char *unit, const char *note) {
    if (st)
        return mg_bench_fail(b, name);
    snprintf(row->timing, sizeof row->timing, "%s", timing);
    row->items = launches;
    snprintf(row->item_unit, sizeof row->item_unit, "%s", unit);
    snprintf(row->note, sizeof row->note, "%s", note);
    mg_bench_add(b, row);
    return 0;
}

static int bench_launch(mg_bench *b, int argc, char **argv) {
    launch_case c = {.launches = b->quick ? 200 : 2000};
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--launches") && atoi(argv[i + 1]) > 0)
            c.launches = atoi(argv[i + 1]);
    char shape[48];
    snprintf(shape, sizeof shape, "%d x vector_add(n=1)", c.launches);
    mg_status st = mg_kernel_lookup(b->backend, "metrale", "vector_add", &c.kernel);
    if (!st)
        st = mg_kernel_lookup(b->backend, "metrale", "empty_kernel", &c.empty);
    if (!st)
        st = mg_alloc(b->backend, 256, &c.a);
    if (!st)
        st = mg_alloc(b->backend, 256, &c.b);
    if (!st)
        st = mg_alloc(b->backend, 256, &c.out);
    if (!st)
        st = mg_memset(b->backend, c.a, 0x3f, 256);
    if (!st)
        st = mg_memset(b->backend, c.b, 0x3f, 256);
    int failures = 0;
    if (st) {
        failures += mg_bench_fail(b, "launch setup");
    } else {
        if (mg_bench_selected(b, "eager_host")) {
            mg_bench_row row = mg_bench_row_make("launch", "eager_host", shape);
            st = mg_bench_time_host(b, body_launches, &c, 2, b->iters, false, &row.stats);
            failures += add_row(b, "eager_host", "issue", st, &row, c.launches, "launch",
                                "host time to issue, builder + mg_launch_run");
        }
        if (mg_backend_get_kind(b->backend) == MG_BACKEND_CUDA &&
            mg_bench_selected(b, "eager_driver_floor")) {
            mg_bench_row row = mg_bench_row_make("launch", "eager_driver_floor", shape);
            st = mg_bench_time_host(b, body_driver_launches, &c, 2, b->iters, false, &row.stats);
            failures += add_row(b, "eager_driver_floor", "issue", st, &row, c.launches, "launch",
                                "cuLaunchKernel alone, same arguments (no library layers)");
        }
        if (mg_bench_selected(b, "eager_empty_host")) {
            char empty_shape[48];
            snprintf(empty_shape, sizeof empty_shape, "%d x empty_kernel()", c.launches);
            mg_bench_row row = mg_bench_row_make("launch", "eager_empty_host", empty_shape);
            st = mg_bench_time_host(b, body_empty_launches, &c, 2, b->iters, false, &row.stats);
            failures += add_row(b, "eager_empty_host", "issue", st, &row, c.launches, "launch",
                                "host time to issue a kernel without arguments");
        }
        if (mg_bench_selected(b, "eager_events")) {
            mg_bench_row row = mg_bench_row_make("launch", "eager_events", shape);
            st = mg_bench_time_events(b, body_launches, &c, 2, b->iters, &row.stats);
            failures += add_row(b, "eager_events", "events", st, &row, c.launches, "launch",
                                "device time of the whole burst (PyTorch's method)");
        }
        if (mg_bench_selected(b, "graph_replay")) {
            mg_bench_row row = mg_bench_row_make("launch", "graph_replay", shape);
            st = mg_bench_time_graph(b, body_launches, &c, 2, b->iters, &row.stats);
            failures += add_row(b, "graph_replay", "graph", st, &row, c.launches, "node",
                                "one graph of all launches, replayed");
        }
    }
    mg_free(b->backend, c.a);
    mg_free(b->backend, c.b);
    mg_free(b->backend, c.out);
    if (c.kernel)
        mg_kernel_release(c.kernel);
    if (c.empty)
        mg_kernel_release(c.empty);
    return failures;
}

MG_BENCH_REGISTER(launch, "launch",
                  "kernel launch cost through the builder: eager host time, eager device time, "
                  "graph replay per node [--launches N per burst, default 2000]",
                  bench_launch)
