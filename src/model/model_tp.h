/*
 * model_tp.h - private to src/model: the one device-buffer cut of tensor parallelism (model.h),
 * shared by the BF16 weights (model_tp.c) and the MLX ones (model_mlx.c). The rest of the
 * tensor-parallel model's internals are in model_internal.h.
 */
#ifndef METRALE_MODEL_TP_H
#define METRALE_MODEL_TP_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/comm.h"
#include "metrale/gpu.h"

/* The split of the layer matrices (model.h), the one table both kinds of weights are cut by
 * (the BF16 ones, model_tp.c; the MLX ones, model_mlx.c). A column-parallel matrix keeps its
 * rank's rows (MG_COMM_SHARD_ROWS; `parts` stacked blocks each cut: k then v, gate then up), a
 * row-parallel one its rank's input features (MG_COMM_SHARD_COLUMNS). `name`: the checkpoint's
 * layers, for messages. */
typedef struct mg_fwd_tp_matrix {
    uint32_t slot; /* MG_FWD_WQ, MG_FWD_WKV, MG_FWD_WO, MG_FWD_W_GATE_UP, MG_FWD_W_DOWN */
    uint32_t parts;
    mg_comm_shard_axis axis;
    const char *name;
} mg_fwd_tp_matrix;

#define MG_FWD_TP_MATRICES 5
extern const mg_fwd_tp_matrix mg_fwd_tp_matrices[MG_FWD_TP_MATRICES];

/* Replaces device buffer *w [rows, row_bytes] of `b` with rank `rank` of `ranks`'s shard of it
 * (mg_comm_shard's rule: `axis`, `parts`), through host memory, freeing the whole one; on
 * failure *w is left as it was. The shard holds rows * row_bytes / ranks bytes. */
mg_status mg_fwd_tp_cut_buffer(mg_backend *b, mg_devptr *w, size_t rows, size_t row_bytes,
                               mg_comm_shard_axis axis, uint32_t parts, uint32_t rank,
                               uint32_t ranks);

#endif
