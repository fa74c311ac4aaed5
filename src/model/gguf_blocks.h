/*
 * gguf_blocks.h - decoders of GGUF's K-quant blocks (Q4_K, Q5_K, Q6_K: 256 elements each, the
 * layouts of ggml's block_q4_K, block_q5_K and block_q6_K) to FP32. The result is bit-exact
 * with ggml's dequantize_row_* and with `gguf.quants.dequantize` of the gguf Python package:
 * each element is (FP32 super-block scale x sub-block scale) x code, minus (FP32 min x sub-block
 * min) for Q4_K and Q5_K, in that order of FP32 operations (tests/test_gguf_blocks.c).
 *
 * How the loader uses them (model_gguf.c): every K-quant matrix of a checkpoint is dequantized
 * and stored as BF16, model-wide; no K-quant is mapped onto MLX affine groups yet.
 */
#ifndef METRALE_MODEL_GGUF_BLOCKS_H
#define METRALE_MODEL_GGUF_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { MG_GGUF_K_BLOCK = 256 };

/* Decodes `blocks` consecutive blocks of GGUF type `type` from `p` into out[blocks * 256];
 * false (writing nothing) when type is not Q4_K, Q5_K or Q6_K. */
bool mg_gguf_k_blocks_to_f32(uint32_t type, const uint8_t *p, size_t blocks, float *out);

#endif
