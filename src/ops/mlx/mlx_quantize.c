/* mlx_quantize.c - MLX's affine quantization on the host (metrale/mlx.h, mg_mlx_quantize): the
 * arithmetic of mx.quantize on MLX's CPU, step for step in FP32, so that the packed words,
 * scales and biases are bit for bit the ones MLX writes. */
#include <math.h>
#include <stddef.h>

#include "error.h"
#include "metrale/mlx.h"

/* std::max and std::min as MLX calls them: the first argument unless the second compares
 * greater (resp. less), so signed zeros come out as MLX's do. */
static float max_of(float a, float b) {
    return a < b ? b : a;
}

static float min_of(float a, float b) {
    return b < a ? b : a;
}

static float value_of(uint16_t bits, mg_dtype type) {
    return type == MG_DTYPE_BF16 ? mg_bf16_to_f32(bits) : mg_f16_to_f32(bits);
}

static uint16_t stored(float value, mg_dtype type) {
    return type == MG_DTYPE_BF16 ? mg_f32_to_bf16(value) : mg_f32_to_f16(value);
}

/* One group of `group` values: its packed words (32 / bits values each, the first in the low
 * bits), its scale and bias. */
static void quantize_group(const float *x, uint32_t group, uint32_t bits, uint32_t *words,
                           float *scale_out, float *bias_out) {
    const float n_bins = (float)((1u << bits) - 1), eps = 1e-7f;
    float lo = INFINITY, hi = -INFINITY;
    for (uint32_t j = 0; j < group; j++) {
        hi = max_of(hi, x[j]);
        lo = min_of(lo, x[j]);
    }
    /* the end farther from zero is represented exactly: it is the bias, or the top code */
    const bool low_end = fabsf(lo) > fabsf(hi);
    float scale = max_of((hi - lo) / n_bins, eps);
    scale = low_end ? scale : -scale;
    const float edge = low_end ? lo : hi;
    const float q0 = rintf(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
    }
    const uint32_t per_word = 32 / bits;
    for (uint32_t w = 0; w < group / per_word; w++) {
        uint32_t word = 0;
        for (uint32_t e = 0; e < per_word; e++) {
            float q = rintf((x[w * per_word + e] - bias) / scale);
            q = min_of(max_of(q, 0.0f), n_bins);
            word |= (uint32_t)q << (e * bits);
        }
        words[w] = word;
    }
    *scale_out = scale;
    *bias_out = bias;
}

mg_status mg_mlx_quantize(const uint16_t *w, mg_dtype type, uint32_t n, uint32_t k, uint32_t pitch,
                          uint32_t bits, uint32_t group_size, uint32_t *weight, uint16_t *scales,
                          uint16_t *biases) {
    const char *fn = "mg_mlx_quantize";
    if (!w || !weight || !scales || !biases)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: null pointer (w, weight, scales, biases)",
                        fn);
    if (type != MG_DTYPE_BF16 && type != MG_DTYPE_F16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: type %s is not BF16 or F16", fn,
                        mg_dtype_name(type));
    if (bits != 4 && bits != 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: bits %u is not 4 or 8", fn, bits);
    if (group_size != 32 && group_size != 64 && group_size != 128)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: group_size %u is not 32, 64 or 128", fn,
                        group_size);
    if (n == 0 || k == 0 || k % group_size)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: [%u, %u]: n and k must be positive, k a multiple of group_size %u", fn,
                        n, k, group_size);
    if (pitch < k)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: pitch %u is less than k %u", fn, pitch, k);
    /* every value checked before anything is written */
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t c = 0; c < k; c++)
            if (!isfinite(value_of(w[(size_t)r * pitch + c], type)))
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                "%s: the weight at row %u, column %u is not finite", fn, r, c);
    const uint32_t groups = k / group_size, words_per_row = k / (32 / bits);
    float x[128];
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t g = 0; g < groups; g++) {
            const uint16_t *src = w + (size_t)r * pitch + (size_t)g * group_size;
            for (uint32_t j = 0; j < group_size; j++)
                x[j] = value_of(src[j], type);
            float scale, bias;
            quantize_group(x, group_size, bits,
                           weight + (size_t)r * words_per_row + (size_t)g * group_size * bits / 32,
                           &scale, &bias);
            scales[(size_t)r * groups + g] = stored(scale, type);
            biases[(size_t)r * groups + g] = stored(bias, type);
        }
    return MG_OK;
}
