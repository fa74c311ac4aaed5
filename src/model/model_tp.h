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

/* Replaces device buffer *w [rows, row_bytes] of `b` with rank `rank` of `ranks`'s shard of it
 * (mg_comm_shard's rule: `axis`, `parts`), through host memory, freeing the whole one; on
 * failure *w is left as it was. The shard holds rows * row_bytes / ranks bytes. */
mg_status mg_fwd_tp_cut_buffer(mg_backend *b, mg_devptr *w, size_t rows, size_t row_bytes,
                               mg_comm_shard_axis axis, uint32_t parts, uint32_t rank,
                               uint32_t ranks);

#endif
