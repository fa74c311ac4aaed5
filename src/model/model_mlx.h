/*
 * model_mlx.h - private to src/model: the layer matrices of the forward model (model.h) read from
 * an MLX affine-quantized checkpoint (metrale/mlx.h) and run by the MLX ops.
 *
 * The checkpoint holds, per layer l, model.layers.<l>.self_attn.{q,k,v,o}_proj and
 * model.layers.<l>.mlp.{gate,up,down}_proj (tests/mlx/make_checkpoint.py writes them from the
 * model's own weights). k and v are joined into one layer (k rows then v rows, the model's wkv),
 * gate and up likewise (the model's w_gate_up): one GEMM each at prefill, and the decode's
 * gate_up GEMV reads the two halves. Rows <= MG_FWD_MLX_GEMV_MAX_ROWS run the GEMVs (the MLP as
 * gate_up GEMV, then the down GEMV fused with silu(gate) * up); more rows run mg_mlx_gemm.
 */
#ifndef METRALE_MODEL_MLX_H
#define METRALE_MODEL_MLX_H

#include "metrale/mlx.h"
#include "model.h"

#define MG_FWD_MLX_GEMV_MAX_ROWS 8u
/* The group size of a preset's weights quantized at load (mlx-lm's default). */
#define MG_FWD_MLX_GROUP 64u

/* The layer matrices of one layer, in the order of mg_fwd_mlx_adopt's array. */
enum { MX_Q, MX_KV, MX_O, MX_GATE_UP, MX_DOWN, MX_SLOTS };
/* model.h's slot of matrix i (MX_Q .. MX_DOWN): MG_FWD_WQ, MG_FWD_WKV, ... */
uint32_t mg_fwd_mlx_model_slot(uint32_t i);

typedef struct mg_fwd_mlx mg_fwd_mlx;

/* Opens checkpoint `dir` and loads every layer matrix of a model of shape `sh` with `layers`
 * layers; each must be quantized with `bits` and have the shape the preset gives it. Errors
 * (one line, through mg_last_error) name the checkpoint and what disagrees. */
mg_status mg_fwd_mlx_create(mg_backend *b, const mg_model_shape *sh, uint32_t layers,
                            const char *dir, uint32_t bits, mg_fwd_mlx **out);
void mg_fwd_mlx_destroy(mg_fwd_mlx *x);
/* The same from layers already loaded: w[l * 5 + i] for i = q, kv (k rows then v rows), o,
 * gate_up (gate rows then up rows), down, each of the shape the model gives it. Takes the
 * buffers of w (zeroing it) whether it succeeds or not. */
mg_status mg_fwd_mlx_adopt(mg_backend *b, const mg_model_shape *sh, uint32_t layers,
                           mg_mlx_linear *w, mg_fwd_mlx **out);

/* The committed checkpoint of `preset` with `bits` (tests/mlx/checkpoints/<preset>-mlx<bits>),
 * or NULL when there is none. */
const char *mg_fwd_mlx_default_checkpoint(const char *preset, uint32_t bits, char *buf,
                                          size_t size);

/* Tensor parallelism (model.h): every matrix cut down to rank `rank` of `ranks`'s share, the
 * model's shape then `local` (that rank's). q_proj, k/v_proj and gate/up_proj keep their rows
 * of the rank (each half of a joined layer cut); o_proj and down_proj their input features,
 * which must hold whole quantization groups per rank and no bias (else MG_ERR_UNSUPPORTED
 * naming the layer, before anything is cut). Slicing MLX rows or whole groups is exact: the
 * shares dequantize to the same values as the whole matrices. */
mg_status mg_fwd_mlx_shard(mg_fwd_mlx *x, const mg_model_shape *local, uint32_t rank,
                           uint32_t ranks);

/* The prefill GEMMs' scratch (the model's arena: model_plan.c sizes it as the largest
 * layer matrix's n * k * 2): MG_ERR_INTERNAL when `bytes` is less than x's largest matrix
 * needs. Not owned by x. */
mg_status mg_fwd_mlx_set_scratch(mg_fwd_mlx *x, mg_devptr scratch, uint64_t bytes);

/* Bytes of all the packed weights, scales and biases. */
uint64_t mg_fwd_mlx_bytes(const mg_fwd_mlx *x);

/* Layer l's matrix `slot` (MG_FWD_WQ, MG_FWD_WKV, MG_FWD_WO, MG_FWD_W_GATE_UP, MG_FWD_W_DOWN)
 * dequantized to a new BF16 allocation [rows, cols] (mg_mlx_dequant), for the reference run. */
mg_status mg_fwd_mlx_dequantize(mg_fwd_mlx *x, uint32_t l, uint32_t slot, mg_devptr *out);

/* out[rows, n] = act[rows, k] times layer l's matrix `slot` (not the MLP's). */
mg_status mg_fwd_mlx_linear(mg_fwd_mlx *x, mg_stream *s, uint32_t l, uint32_t slot, uint32_t rows,
                            mg_devptr act, mg_devptr out);
/* Layer l's MLP: out[rows, hidden] = down(silu(gate(act)) * up(act)), through mlp_act [rows, I]
 * (decode rows: the gate_up GEMV's SiLU-mul epilogue; more rows: the GEMM into gate_up [rows,
 * 2 I], then the SiLU-mul), or through gate_up alone for decode rows of layers with biases. */
mg_status mg_fwd_mlx_mlp(mg_fwd_mlx *x, mg_stream *s, uint32_t l, uint32_t rows, mg_devptr act,
                         mg_devptr gate_up, mg_devptr mlp_act, mg_devptr out);

/* The checkpoint the MLX weights of `c` come from: c->checkpoint, else the committed one of the
 * preset, else NULL: the preset's own weights are then quantized at load (mg_mlx_quantize,
 * groups of MG_FWD_MLX_GROUP, BF16 scales), as tests/mlx/make_checkpoint.py quantizes them. */
const char *mg_fwd_mlx_checkpoint(const mg_fwd_config *c, char *buf, size_t size);
/* For mg_fwd_create: MLX weights need a dense preset and the MLX op on `b`. One-line errors. */
mg_status mg_fwd_mlx_check_config(mg_backend *b, const mg_fwd_config *c);
/* The layer matrices x (made by mg_fwd_mlx_adopt; NULL: loaded here from the checkpoint of `c`)
 * into *out; with c->mlx_dequantized instead writes each, dequantized to BF16, into
 * layer_w[l * MG_FWD_LAYER_TENSORS + slot], frees x and leaves *out NULL. Adds the bytes of the
 * weights kept to *weight_bytes. Takes x whether it succeeds or not. */
mg_status mg_fwd_mlx_attach(mg_backend *b, const mg_fwd_config *c, mg_fwd_mlx *x,
                            mg_devptr *layer_w, mg_fwd_mlx **out, uint64_t *weight_bytes);

#endif
