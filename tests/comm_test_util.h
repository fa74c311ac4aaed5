/*
 * comm_test_util.h - what the communicator tests share: random inputs exactly representable
 * in each dtype, running one collective on every rank of a communicator (one thread, in a
 * group) from host arrays, and the plain-arithmetic expectation with its rounding bound.
 */
#ifndef METRALE_COMM_TEST_UTIL_H
#define METRALE_COMM_TEST_UTIL_H

#include <math.h>
#include <stdbool.h>

#include "metrale/comm.h"
#include "metrale/dtype.h"
#include "test_util.h"

typedef enum comm_case_kind {
    CASE_ALL_REDUCE,
    CASE_ALL_GATHER,
    CASE_REDUCE_SCATTER,
    CASE_BROADCAST,
    CASE_SEND_RECV, /* a ring: rank r sends to r + 1 and receives from r - 1 */
} comm_case_kind;

static const char *const comm_case_names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                              "broadcast", "send_recv"};

static inline double comm_decode(mg_dtype t, const void *p, size_t i) {
    switch (t) {
    case MG_DTYPE_F32:
        return ((const float *)p)[i];
    case MG_DTYPE_BF16:
        return mg_bf16_to_f32(((const uint16_t *)p)[i]);
    case MG_DTYPE_F16:
        return mg_f16_to_f32(((const uint16_t *)p)[i]);
    default:
        return mg_fp8_e4m3_to_f32(((const uint8_t *)p)[i]);
    }
}

static inline void comm_encode(mg_dtype t, void *p, size_t i, float v) {
    switch (t) {
    case MG_DTYPE_F32:
        ((float *)p)[i] = v;
        break;
    case MG_DTYPE_BF16:
        ((uint16_t *)p)[i] = mg_f32_to_bf16(v);
        break;
    case MG_DTYPE_F16:
        ((uint16_t *)p)[i] = mg_f32_to_f16(v);
        break;
    default:
        ((uint8_t *)p)[i] = mg_f32_to_fp8_e4m3(v);
        break;
    }
}

/* The spacing of dtype `t` at magnitude |x| (its subnormal spacing below the normal range). */
static inline double comm_ulp(mg_dtype t, double x) {
    int mantissa_bits = t == MG_DTYPE_F32    ? 24
                        : t == MG_DTYPE_BF16 ? 8
                        : t == MG_DTYPE_F16  ? 11
                                             : 4;
    int min_exponent = t == MG_DTYPE_F32    ? -125
                       : t == MG_DTYPE_BF16 ? -125
                       : t == MG_DTYPE_F16  ? -13
                                            : -5;
    int e;
    frexp(x, &e);
    if (x == 0 || e < min_exponent)
        e = min_exponent;
    return ldexp(1.0, e - mantissa_bits);
}

/* Random values in [-8, 8) (FP8: no saturation for sums of a few ranks), stored in `t`. */
static inline void comm_fill(mg_dtype t, void *p, size_t count) {
    for (size_t i = 0; i < count; i++) {
        float v = (float)((double)(test_rand() >> 11) / 9007199254740992.0 * 16.0 - 8.0);
        comm_encode(t, p, i, v);
    }
}

/* Elements rank r sends / receives in a case of per-rank `count`. */
static inline size_t comm_send_count(comm_case_kind k, size_t count, int size) {
    return k == CASE_REDUCE_SCATTER ? count * (size_t)size : count;
}
static inline size_t comm_recv_count(comm_case_kind k, size_t count, int size) {
    return k == CASE_ALL_GATHER ? count * (size_t)size : count;
}

/* Runs case `k` on every rank (one thread, one group), from host inputs in[r] (send counts)
 * to host outputs out[r] (recv counts, poisoned on the device first). in_place: recv is the
 * send buffer (all-reduce, broadcast) or holds it at the rank's slice (all-gather,
 * reduce-scatter). Returns the first failing status. */
static inline mg_status comm_run_case(mg_comm *const *comms, int size, comm_case_kind k, mg_dtype t,
                                      mg_comm_reduce op, size_t count, int root, bool in_place,
                                      void *const *in, void *const *out) {
    size_t e = mg_dtype_bytes(t);
    size_t sc = comm_send_count(k, count, size), rc = comm_recv_count(k, count, size);
    /* big[r]: the larger buffer (recv, or send of a reduce-scatter, in place), own_send[r]
     * the separate send buffer when not in place. */
    mg_devptr big[MG_COMM_MAX_RANKS] = {0}, own_send[MG_COMM_MAX_RANKS] = {0};
    mg_devptr send[MG_COMM_MAX_RANKS] = {0}, recv[MG_COMM_MAX_RANKS] = {0};
    size_t big_count = sc > rc ? sc : rc;
    mg_status st = MG_OK;
    for (int r = 0; r < size && !st; r++) {
        mg_backend *b = mg_comm_backend(comms[r]);
        if ((st = mg_alloc(b, big_count * e, &big[r])) ||
            (st = mg_memset(b, big[r], 0xff, big_count * e)))
            break;
        send[r] = recv[r] = big[r];
        if (in_place && k == CASE_ALL_GATHER)
            send[r] = big[r] + (size_t)r * count * e;
        else if (in_place && k == CASE_REDUCE_SCATTER)
            recv[r] = big[r] + (size_t)r * count * e;
        else if (!in_place && (st = mg_alloc(b, sc * e, &own_send[r])))
            break;
        if (!in_place)
            send[r] = own_send[r];
        st = mg_copy_h2d(b, send[r], in[r], sc * e);
    }
    if (!st) {
        mg_comm_group_begin();
        for (int r = 0; r < size && !st; r++) {
            switch (k) {
            case CASE_ALL_REDUCE:
                st = mg_comm_all_reduce(comms[r], NULL, send[r], recv[r], count, t, op);
                break;
            case CASE_ALL_GATHER:
                st = mg_comm_all_gather(comms[r], NULL, send[r], recv[r], count, t);
                break;
            case CASE_REDUCE_SCATTER:
                st = mg_comm_reduce_scatter(comms[r], NULL, send[r], recv[r], count, t, op);
                break;
            case CASE_BROADCAST:
                st = mg_comm_broadcast(comms[r], NULL, send[r], recv[r], count, t, root);
                break;
            case CASE_SEND_RECV:
                st = mg_comm_send(comms[r], NULL, send[r], count, t, (r + 1) % size);
                if (!st)
                    st = mg_comm_recv(comms[r], NULL, recv[r], count, t, (r + size - 1) % size);
                break;
            }
        }
        mg_status end = mg_comm_group_end();
        if (!st)
            st = end;
    }
    for (int r = 0; r < size && !st; r++)
        st = mg_comm_wait(comms[r], NULL);
    for (int r = 0; r < size && !st; r++)
        st = mg_copy_d2h(mg_comm_backend(comms[r]), out[r], recv[r], rc * e);
    for (int r = 0; r < size; r++) {
        mg_free(mg_comm_backend(comms[r]), big[r]);
        mg_free(mg_comm_backend(comms[r]), own_send[r]);
    }
    return st;
}

/* The exact (double) expectation of element i of rank r's output. */
static inline double comm_expect(comm_case_kind k, mg_dtype t, mg_comm_reduce op, size_t count,
                                 int size, int root, void *const *in, int r, size_t i) {
    switch (k) {
    case CASE_ALL_REDUCE:
    case CASE_REDUCE_SCATTER: {
        size_t at = k == CASE_REDUCE_SCATTER ? (size_t)r * count + i : i;
        double a = comm_decode(t, in[0], at);
        for (int q = 1; q < size; q++) {
            double v = comm_decode(t, in[q], at);
            a = op == MG_COMM_SUM ? a + v : (v > a ? v : a);
        }
        return a;
    }
    case CASE_ALL_GATHER:
        return comm_decode(t, in[i / count], i % count);
    case CASE_BROADCAST:
        return comm_decode(t, in[root], i);
    case CASE_SEND_RECV:
        return comm_decode(t, in[(r + size - 1) % size], i);
    }
    return NAN;
}

/* Whether `got` is `want` rounded to dtype t: exact for data movement and max, within one
 * spacing of t for sums (correct rounding is half a spacing; NCCL may round once per step, so
 * sums of `size` ranks allow size - 1 spacings). */
static inline bool comm_close(comm_case_kind k, mg_dtype t, mg_comm_reduce op, int size, double got,
                              double want) {
    bool sums = (k == CASE_ALL_REDUCE || k == CASE_REDUCE_SCATTER) && op == MG_COMM_SUM;
    if (!sums)
        return got == want;
    int steps = size > 2 ? size - 1 : 1;
    return fabs(got - want) <= steps * comm_ulp(t, want);
}

/* Opens CUDA devices 0 and 1 into b[0..1], or exits 77 saying why two GPUs with NCCL are not
 * usable here. */
static inline void comm_open_two_cuda_or_skip(const char *test_name, mg_backend **b) {
    mg_backend_probe probe;
    mg_backend_probe_kind(MG_BACKEND_CUDA, &probe);
    char reason[512] = "";
    if (!probe.compiled_in || !probe.usable || probe.device_count < 2) {
        printf("%s: skipped: needs two CUDA devices: %s\n", test_name,
               !probe.compiled_in ? "not compiled in"
               : !probe.usable    ? probe.reason
                                  : "only one device");
        exit(77);
    }
    if (!mg_comm_available(MG_BACKEND_CUDA, reason, sizeof reason)) {
        printf("%s: skipped: NCCL unavailable: %s\n", test_name, reason);
        exit(77);
    }
    for (int r = 0; r < 2; r++)
        if (mg_backend_open(MG_BACKEND_CUDA, r, &b[r])) {
            fprintf(stderr, "FAIL %s: cannot open CUDA device %d: %s\n", test_name, r,
                    mg_last_error());
            exit(1);
        }
}

#endif
