/*
 * metrale/mlx.h - MLX affine-quantized checkpoints (bits 8 and 4) on every backend: reading
 * config.json's quantization, loading quantized linear layers from safetensors
 * (metrale/safetensors.h) into device buffers, and the ops that run them.
 *
 *   mg_st_model *m;  mg_mlx_config *c;  mg_mlx_linear q;
 *   mg_st_open("/models/Qwen3-8B-4bit", &m);
 *   mg_mlx_config_open("/models/Qwen3-8B-4bit", &c);
 *   mg_mlx_linear_load(b, m, c, "model.layers.0.mlp.down_proj", &q);
 *   mg_mlx_gemv(b, s, &q, 0, 1, x, y);                 // y[1, N] = x[1, K] · Wᵀ
 *   mg_mlx_linear_free(b, &q);
 *
 * The format (MLX's affine quantization): a layer's `weight` is U32 [N, K*bits/32], element j of
 * a row in bits [(j % (32/bits)) * bits, +bits) of word j / (32/bits) (element 0 in the low
 * bits); `scales` and `biases` are [N, K/G] in BF16 or FP16; the weight is
 * w[n, j] = scales[n, j/G] * q[n, j] + biases[n, j/G]. Mixture-of-experts layers stack E such
 * layers on a leading axis ([E, N, ...]); `expert` below picks one.
 *
 * The ops (module "metrale" kernels, the same names and argument lists on every backend; the
 * CPU backend's are the reference, kernels/cuda/mlx/ the CUDA ones):
 *  - dequant: W to BF16 [N, K], exactly as mx.dequantize rounds: t = round_T(scale * q),
 *    w = round_T(t + bias) in the scales' type T, then converted to BF16 (exact for BF16 T).
 *    Kernel mlx_dequant(weight, scales, biases, out, n, k, bits, group_size, scale_type).
 *  - GEMV, M = 1..8 rows of BF16 activations: y[M, N] = x[M, K] · Wᵀ, FP32 accumulation, BF16
 *    out. Which weights are multiplied depends on the provider (metrale/ops.h): the CPU
 *    reference and the CUDA SIMT kernels ("kernels") use the exact w = scale * q + bias, the
 *    bias folded per group (sum w*x = scale * sum q*x + bias * sum x); the CUDA tensor-core
 *    kernels ("cuda_mma", chosen first for BF16 scales; FP16 scales run on "kernels") use the
 *    dequant's BF16-rounded weights, as the GEMM below and MLX's own qmm do, so their cost does
 *    not grow with M. Every provider is within 2^-7 |y| + 2^-10 sum |w a| +
 *    sum |(dequant(w) - w) a| of the exact product (a: the activations). Fused forms:
 *    silu_gate: y = W · (silu(g) * u) where the activation silu(g) * u is computed in FP32 and
 *    rounded to BF16 once; silu_gate_resid: the same plus a BF16 residual [M, N] (which may be
 *    y itself, for an in-place add); gate_up: two layers of one shape and format applied to one
 *    x (read once). Kernels mlx_gemv(weight, scales, biases, x, u, resid, y, m, n, k, bits,
 *    group_size, scale_type, mode) with mode 0 plain, 1 silu_gate (x holds g), 2
 *    silu_gate_resid; mlx_gemv_gate_up(w1, s1, b1, w2, s2, b2, x, y1, y2, m, n, k, bits,
 *    group_size, scale_type). scale_type is 0 for BF16, 1 for FP16. The tensor-core forms
 *    (CUDA only, BF16 scales) are mlx_gemv_mma and mlx_gemv_gate_up_mma, the same arguments.
 *  - GEMM, any M (prefill): the layer is dequantized to a BF16 scratch buffer of the caller's
 *    (mg_mlx_gemm_scratch_bytes) by the dequant kernel, then multiplied by mg_gemm_bf16
 *    (metrale/ops_gemm.h: cuBLASLt on CUDA, the reference on the CPU). Its weights are
 *    therefore the dequant's BF16-rounded ones (those of "cuda_mma"'s GEMVs).
 *  - A layer's own `bias` (mg_mlx_linear.bias non-zero: BF16, FP16 or FP32 [experts, n]) is
 *    added by every op but dequant after the product, on the same stream (kernel
 *    mlx_add_bias(y, bias, m, n, bias_type), bias_type 0 BF16, 1 FP16, 2 FP32):
 *      y[t, r] = bf16_rne(fp32(y[t, r]) + fp32(bias[r]))
 *    where y[t, r] is the op's BF16 result without the bias (for silu_gate_resid: after the
 *    residual add), the bias converted exactly to FP32, and the sum one IEEE FP32 addition.
 *    This is MLX's own rounding for nn.QuantizedLinear in BF16 (quantized_matmul's BF16
 *    result, then `+ bias`). gate_up adds each layer's own bias to its own output.
 *
 * What a caller may rely on:
 *  - Arguments are checked before anything is launched (MG_ERR_INVALID_ARGUMENT naming the
 *    argument): bits 4 or 8, group_size 32, 64 or 128, K a multiple of group_size, scale_type
 *    BF16 or F16, expert < experts, M in 1..8 for the GEMVs, pointers non-null and aligned
 *    (weights, x, u 16 bytes; the rest 2 bytes), buffers large enough on backends that know
 *    the allocations. Outputs must not overlap inputs, the layer's buffers included (except
 *    resid == y).
 *  - Calls are ordered on `s` (NULL: the default stream), allocate nothing and wait for
 *    nothing, so they may be captured into a graph (mg_mlx_gemm as mg_gemm_bf16 allows).
 */
#ifndef METRALE_MLX_H
#define METRALE_MLX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/dtype.h"
#include "metrale/export.h"
#include "metrale/gpu.h"
#include "metrale/ops_gemm.h"
#include "metrale/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ config.json */

/* How one module is quantized. */
typedef struct mg_mlx_quant {
    bool quantized;      /* false: the module is plain (no quantization, or an override false) */
    uint32_t bits;       /* 4 or 8 (others are refused when a layer is loaded) */
    uint32_t group_size; /* 32, 64 or 128 */
} mg_mlx_quant;

typedef struct mg_mlx_config mg_mlx_config;

/* Reads `path` (a config.json, or a directory holding one): its "quantization" object, or
 * "quantization_config" when the former is absent. group_size and bits are required in it,
 * mode must be absent or "affine" (other modes are MG_ERR_UNSUPPORTED); every other key is a
 * per-module override holding {group_size, bits} or false. A config without quantization is
 * valid: every module is then plain. */
MG_API mg_status mg_mlx_config_open(const char *path, mg_mlx_config **out);
/* The same from the text of a config.json; `what` names it in messages (NULL: "config"). */
MG_API mg_status mg_mlx_config_parse(const char *text, size_t length, const char *what,
                                     mg_mlx_config **out);
/* NULL is a no-op. */
MG_API void mg_mlx_config_close(mg_mlx_config *c);
/* The quantization of module `module` ("model.layers.0.mlp.gate"): its override, or the
 * default. */
MG_API mg_status mg_mlx_config_module(const mg_mlx_config *c, const char *module,
                                      mg_mlx_quant *out);

/* ------------------------------------------------------------------ layers */

typedef struct mg_mlx_linear {
    uint32_t experts; /* 1 for a plain layer; E for experts stacked on a leading axis */
    uint32_t n, k;    /* output and input features */
    uint32_t bits, group_size;
    mg_dtype scale_type;      /* MG_DTYPE_BF16 or MG_DTYPE_F16: scales and biases */
    mg_devptr weight;         /* U32 [experts, n, k * bits / 32] */
    mg_devptr scales, biases; /* [experts, n, k / group_size] */
    mg_devptr bias;           /* [experts, n] of bias_type, or 0 when the layer has none */
    mg_dtype bias_type;
} mg_mlx_linear;

/* Loads the quantized linear layer `path` (tensors path.weight, .scales, .biases and the
 * optional .bias) of `m` into new device buffers of `b` (mg_alloc, then copies), with its
 * quantization from `c`. MG_ERR_NOT_FOUND for a missing tensor; MG_ERR_INVALID_ARGUMENT (the
 * message names the tensor) for a layer the config says is not quantized, a wrong dtype, or
 * shapes that disagree with each other or with bits and group_size; MG_ERR_UNSUPPORTED for
 * bits or group sizes the ops do not run. Nothing is left allocated on failure. */
MG_API mg_status mg_mlx_linear_load(mg_backend *b, const mg_st_model *m, const mg_mlx_config *c,
                                    const char *path, mg_mlx_linear *out);
/* Frees the buffers of a loaded layer and zeroes it; a zeroed layer is a no-op. */
MG_API void mg_mlx_linear_free(mg_backend *b, mg_mlx_linear *l);

/* Bytes of one expert's packed weights, scales and biases: what a GEMV reads of the layer. */
MG_API uint64_t mg_mlx_linear_bytes(const mg_mlx_linear *w);

/* Quantizes W [n, k] (BF16 or FP16 values of `type`, rows `pitch` elements apart) into the
 * format above, on the host, bit for bit as mx.quantize(w, group_size, bits) does on MLX's CPU
 * (MLX 0.32): for each group of group_size values of a row, with lo and hi its least and
 * greatest in FP32 and `edge` the one of larger magnitude (hi on a tie),
 *   scale = max((hi - lo) / (2^bits - 1), 1e-7), negated unless edge is lo;
 *   q0 = rint(edge / scale); if q0 != 0: scale = edge / q0, bias = edge; else bias = 0;
 *   q[j] = clamp(rint((w[j] - bias) / scale), 0, 2^bits - 1)
 * every step one FP32 operation, rint to nearest even, and the scale and bias stored in `type`
 * (to nearest even). So the end of larger magnitude dequantizes exactly. Writes weight (U32
 * [n, k * bits / 32]), scales and biases ([n, k / group_size], `type`), all row-major without
 * padding: the tensors of a checkpoint (mg_mlx_linear_load) once copied to a device.
 * MG_ERR_INVALID_ARGUMENT (naming the argument) for a null pointer, a type other than BF16 or
 * F16, bits other than 4 and 8, a group size other than 32, 64 and 128, k not a positive
 * multiple of it, n zero, pitch < k, or a value that is not finite (naming its row and column);
 * nothing is written then. */
MG_API mg_status mg_mlx_quantize(const uint16_t *w, mg_dtype type, uint32_t n, uint32_t k,
                                 uint32_t pitch, uint32_t bits, uint32_t group_size,
                                 uint32_t *weight, uint16_t *scales, uint16_t *biases);

/* ------------------------------------------------------------------ ops */

MG_API mg_status mg_mlx_dequant(mg_backend *b, mg_stream *s, const mg_mlx_linear *w,
                                uint32_t expert, mg_devptr out);
MG_API mg_status mg_mlx_gemv(mg_backend *b, mg_stream *s, const mg_mlx_linear *w, uint32_t expert,
                             uint32_t m, mg_devptr x, mg_devptr y);
MG_API mg_status mg_mlx_gemv_silu_gate(mg_backend *b, mg_stream *s, const mg_mlx_linear *w,
                                       uint32_t expert, uint32_t m, mg_devptr g, mg_devptr u,
                                       mg_devptr y);
MG_API mg_status mg_mlx_gemv_silu_gate_resid(mg_backend *b, mg_stream *s, const mg_mlx_linear *w,
                                             uint32_t expert, uint32_t m, mg_devptr g, mg_devptr u,
                                             mg_devptr resid, mg_devptr y);
/* gate and up: the same experts, n, k, bits, group_size and scale_type. */
MG_API mg_status mg_mlx_gemv_gate_up(mg_backend *b, mg_stream *s, const mg_mlx_linear *gate,
                                     const mg_mlx_linear *up, uint32_t expert, uint32_t m,
                                     mg_devptr x, mg_devptr y_gate, mg_devptr y_up);

/* A GEMV with a fusion of metrale/ops_gemm.h ("fusion"), each defined there as the
 * composition of the unfused calls on the same operands:
 *   epilogue MG_GEMM_EPILOGUE_SILU_MUL, `up` given (the gate_up form, gate = w): y[m, n] =
 *       mg_silu_mul_bf16 of mg_mlx_gemv_gate_up's two BF16 products, one launch that stores
 *       only y. For the decode MLP: the down projection then reads y as a plain GEMV's input,
 *       where mg_mlx_gemv_silu_gate would compute silu(g) * u again in every block.
 *   both kinds NONE, no up: mg_mlx_gemv.
 * What a caller may rely on:
 *  - The arguments of mg_mlx_gemv_gate_up (mg_mlx_gemv without up) with y as y_gate, plus: a
 *    NULL fusion or tensors, a kind out of range, SILU_MUL without up or up without it, or any
 *    fusion tensor given (none of these fusions reads one): MG_ERR_INVALID_ARGUMENT naming it;
 *    the RMSNorm prologue, the residual-add, argmax and KV-append epilogues, and a gate or up
 *    layer with a bias of its own: MG_ERR_UNSUPPORTED naming it (not built). Nothing is
 *    launched then.
 *  - On the CPU backend the result equals the composition bit for bit (every provider: the
 *    products as that provider's gate_up makes them, then the SiLU-mul); on CUDA each product
 *    is rounded to BF16 as gate_up stores it and silu(g) * u is mg_silu_mul_bf16's FP32
 *    arithmetic, so y differs from the composition on CUDA only where the products do. */
MG_API mg_status mg_mlx_gemv_fused(mg_backend *b, mg_stream *s, const mg_mlx_linear *w,
                                   const mg_mlx_linear *up, uint32_t expert, uint32_t m,
                                   mg_devptr x, mg_devptr y, const mg_gemm_fusion *fusion,
                                   const mg_gemm_fusion_tensors *tensors);

/* n * k * 2: the BF16 scratch mg_mlx_gemm needs. */
MG_API uint64_t mg_mlx_gemm_scratch_bytes(const mg_mlx_linear *w);
/* y[M, N] (BF16, row pitch N) = x[M, K] · Wᵀ for any M >= 1, through `scratch`. */
MG_API mg_status mg_mlx_gemm(mg_backend *b, mg_stream *s, const mg_mlx_linear *w, uint32_t expert,
                             uint32_t m, mg_devptr x, mg_devptr y, mg_devptr scratch);

/* y[m, n] (BF16, row pitch n) += bias[n] (BF16, FP16 or FP32), rounded as a layer's own bias
 * above (one FP32 addition, then BF16 to nearest even): for a caller whose product came from
 * another op, e.g. a BF16 GEMM of a checkpoint whose projections have biases. y and bias must
 * not overlap; y is 2-byte aligned, bias aligned to its element size. Kernel mlx_add_bias. */
MG_API mg_status mg_mlx_add_bias(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, mg_devptr y,
                                 mg_devptr bias, mg_dtype bias_type);

#ifdef __cplusplus
}
#endif
#endif
