/* elementwise_host.c - rmsnorm and argmax on host memory (elementwise_host.h). */
#include "elementwise_host.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>

#include "metrale/dtype.h"
#include "metrale/ops_elementwise.h"

void mg_rmsnorm_bf16_host(uint32_t rows, uint32_t cols, float eps, uint16_t *x, const uint16_t *add,
                          const uint16_t *w, uint16_t *out) {
    for (uint32_t r = 0; r < rows; r++) {
        uint16_t *xr = x + (size_t)r * cols, *o = out + (size_t)r * cols;
        float sum = 0;
        for (uint32_t c = 0; c < cols; c++) {
            if (add)
                xr[c] = mg_f32_to_bf16(mg_bf16_to_f32(xr[c]) +
                                       mg_bf16_to_f32(add[(size_t)r * cols + c]));
            float v = mg_bf16_to_f32(xr[c]);
            sum += v * v;
        }
        float inv = 1.0f / sqrtf(sum / (float)cols + eps);
        for (uint32_t c = 0; c < cols; c++)
            o[c] = mg_f32_to_bf16((mg_bf16_to_f32(xr[c]) * inv) * mg_bf16_to_f32(w[c]));
    }
}

void mg_argmax_host(uint32_t rows, uint32_t cols, const void *in_v, uint32_t pitch,
                    unsigned element_bytes, int32_t *ids) {
    for (uint32_t r = 0; r < rows; r++) {
        uint32_t best = 0;
        float best_value = -INFINITY;
        bool found = false;
        for (uint32_t c = 0; c < cols; c++) {
            size_t at = (size_t)r * pitch + c;
            float v = element_bytes == 4 ? ((const float *)in_v)[at]
                                         : mg_bf16_to_f32(((const uint16_t *)in_v)[at]);
            if (!isnan(v) && (!found || v > best_value)) {
                best = c;
                best_value = v;
                found = true;
            }
        }
        ids[r] = (int32_t)best;
    }
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void mg_uniform_bf16_host(uint64_t counter, float offset, float scale, uint64_t count,
                          uint16_t *out) {
    for (uint64_t i = 0; i < count; i++) {
        const float u = (float)(splitmix64(counter + i) >> 40) * 0x1p-23f - 1.0f;
        /* stored apart, so that no compiler fuses the product into the sum (one rounding
         * each, as the device kernels round them) */
        volatile float product = scale * u;
        out[i] = mg_f32_to_bf16(offset + product);
    }
}
