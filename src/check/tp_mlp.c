/* tp_mlp.c - the tensor-parallel MLP block of tp_mlp.h, from the public ops. */
#include "tp_mlp.h"

#include <stdlib.h>
#include <string.h>

#include "metrale/ops_activation.h"
#include "metrale/ops_gemm.h"

void mg_tp_mlp_release(mg_tp_mlp *m) {
    mg_devptr *all[] = {&m->gate_up, &m->down, &m->x, &m->gu, &m->h, &m->y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (*all[i])
            mg_free(m->backend, *all[i]);
        *all[i] = 0;
    }
}

mg_status mg_tp_mlp_init(mg_tp_mlp *m, mg_backend *b, mg_stream *s, mg_comm *comm, uint32_t hidden,
                         uint32_t inter, uint32_t max_tokens, const uint16_t *w_gate,
                         const uint16_t *w_up, const uint16_t *w_down) {
    memset(m, 0, sizeof *m);
    int rank = comm ? mg_comm_rank(comm) : 0, ranks = comm ? mg_comm_size(comm) : 1;
    if (!hidden || !inter || !max_tokens || inter % (uint32_t)ranks)
        return MG_ERR_INVALID_ARGUMENT;
    uint32_t il = inter / (uint32_t)ranks;
    *m = (mg_tp_mlp){.backend = b,
                     .stream = s,
                     .comm = comm,
                     .hidden = hidden,
                     .inter_local = il,
                     .max_tokens = max_tokens};
    size_t gate_up_bytes = (size_t)2 * il * hidden * 2, down_bytes = (size_t)hidden * il * 2;
    uint16_t *host = malloc(gate_up_bytes > down_bytes ? gate_up_bytes : down_bytes);
    if (!host)
        return MG_ERR_OUT_OF_MEMORY;
    /* gate rows, then up rows, of this rank's slice of the intermediate dimension */
    mg_status st =
        mg_comm_shard(w_gate, inter, (size_t)hidden * 2, MG_COMM_SHARD_ROWS, 1, rank, ranks, host);
    if (!st)
        st = mg_comm_shard(w_up, inter, (size_t)hidden * 2, MG_COMM_SHARD_ROWS, 1, rank, ranks,
                           host + (size_t)il * hidden);
    if (!st && !(st = mg_alloc(b, gate_up_bytes, &m->gate_up)))
        st = mg_copy_h2d(b, m->gate_up, host, gate_up_bytes);
    /* this rank's columns of every row of W_down */
    if (!st)
        st = mg_comm_shard(w_down, hidden, (size_t)inter * 2, MG_COMM_SHARD_COLUMNS, 1, rank, ranks,
                           host);
    if (!st && !(st = mg_alloc(b, down_bytes, &m->down)))
        st = mg_copy_h2d(b, m->down, host, down_bytes);
    free(host);
    if (!st)
        st = mg_alloc(b, (size_t)max_tokens * hidden * 2, &m->x);
    if (!st)
        st = mg_alloc(b, (size_t)max_tokens * 2 * il * 2, &m->gu);
    if (!st)
        st = mg_alloc(b, (size_t)max_tokens * il * 2, &m->h);
    if (!st)
        st = mg_alloc(b, (size_t)max_tokens * hidden * 2, &m->y);
    if (st)
        mg_tp_mlp_release(m);
    return st;
}

mg_status mg_tp_mlp_forward(mg_tp_mlp *const *ranks, int count, uint32_t tokens) {
    mg_status st = MG_OK;
    for (int i = 0; i < count && !st; i++) {
        mg_tp_mlp *m = ranks[i];
        if (tokens == 0 || tokens > m->max_tokens)
            return MG_ERR_INVALID_ARGUMENT;
        uint32_t il = m->inter_local;
        st = mg_gemm_bf16(m->backend, m->stream, tokens, 2 * il, m->hidden, m->x, m->gate_up, m->gu,
                          MG_DTYPE_BF16, 2 * il);
        if (!st)
            st = mg_silu_mul_bf16(m->backend, m->stream, tokens, il, m->gu, 2 * il, m->h, il);
        if (!st)
            st = mg_gemm_bf16(m->backend, m->stream, tokens, m->hidden, il, m->h, m->down, m->y,
                              MG_DTYPE_BF16, m->hidden);
    }
    if (st || count == 0 || !ranks[0]->comm)
        return st;
    st = mg_comm_group_begin();
    for (int i = 0; i < count && !st; i++) {
        mg_tp_mlp *m = ranks[i];
        size_t n = (size_t)tokens * m->hidden;
        st = mg_comm_all_reduce(m->comm, m->stream, m->y, m->y, n, MG_DTYPE_BF16, MG_COMM_SUM);
    }
    mg_status end = mg_comm_group_end();
    return st ? st : end;
}
