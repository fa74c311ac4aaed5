/*
 * tp_mlp.h - a tensor-parallel MLP block built from the public ops, shared by the tests and
 * `metrale-gpu bench comm`:
 *
 *   y = down( silu(x · W_gateᵀ) * (x · W_upᵀ) )
 *
 * split over n ranks (column-parallel / row-parallel): rank r holds rows [r * I/n, (r + 1) * I/n)
 * of W_gate and W_up (column-parallel gate_up, one GEMM of N = 2 I/n, gate then up in each output
 * row) and the same columns of W_down (row-parallel down); each rank's down GEMM gives a partial y,
 * and an all-reduce (sum, BF16) over the ranks gives y on every rank. With one rank (no
 * communicator) it is the one-device block. All tensors are BF16, row-major.
 */
#ifndef METRALE_TP_MLP_H
#define METRALE_TP_MLP_H

#include <stdint.h>

#include "metrale/comm.h"
#include "metrale/gpu.h"

typedef struct mg_tp_mlp {
    mg_backend *backend;
    mg_stream *stream; /* the caller's; NULL: the default stream */
    mg_comm *comm;     /* NULL: one device */
    uint32_t hidden, inter_local, max_tokens;
    mg_devptr gate_up; /* [2 * inter_local, hidden]: this rank's gate rows, then its up rows */
    mg_devptr down;    /* [hidden, inter_local]: this rank's columns of W_down */
    mg_devptr x;       /* [max_tokens, hidden], the input (the same on every rank) */
    mg_devptr gu;      /* [max_tokens, 2 * inter_local] */
    mg_devptr h;       /* [max_tokens, inter_local] */
    mg_devptr y;       /* [max_tokens, hidden], the output */
} mg_tp_mlp;

/* Sets up rank `rank` of `ranks` (comm's rank and size; 0 of 1 without comm) on `b`: uploads
 * its slices of the host weights w_gate [inter, hidden], w_up [inter, hidden] and w_down
 * [hidden, inter] (BF16 bits) and allocates the activations. `inter` must divide by `ranks`.
 * On failure everything is released. */
mg_status mg_tp_mlp_init(mg_tp_mlp *m, mg_backend *b, mg_stream *s, mg_comm *comm, uint32_t hidden,
                         uint32_t inter, uint32_t max_tokens, const uint16_t *w_gate,
                         const uint16_t *w_up, const uint16_t *w_down);

/* Enqueues the block for `tokens` rows of x on every rank of `ranks` (one thread: the
 * all-reduces go in one group), leaving y on each. Capturable once each shape ran. */
mg_status mg_tp_mlp_forward(mg_tp_mlp *const *ranks, int count, uint32_t tokens);

void mg_tp_mlp_release(mg_tp_mlp *m);

#endif
