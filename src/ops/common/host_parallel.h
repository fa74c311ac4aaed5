/*
 * host_parallel.h - shared by the ops' CPU code: a range of independent items split over the
 * machine's cores.
 *
 * mg_host_parallel_for(items, min_items, fn, ctx) calls fn(ctx, first, count) on disjoint
 * parts covering [0, items) exactly once, on up to one thread per online core (at most 16),
 * the calling thread taking the last part; parts hold at least min_items items, so small
 * ranges run on the calling thread alone. The parts are contiguous and fn must not depend on
 * which thread runs which part: results are then the same for any core count. When a thread
 * cannot be started its part runs on the calling thread. Returns when every part is done.
 */
#ifndef METRALE_OPS_HOST_PARALLEL_H
#define METRALE_OPS_HOST_PARALLEL_H

#include <stddef.h>

typedef void (*mg_host_range_fn)(void *ctx, size_t first, size_t count);

void mg_host_parallel_for(size_t items, size_t min_items, mg_host_range_fn fn, void *ctx);

#endif
