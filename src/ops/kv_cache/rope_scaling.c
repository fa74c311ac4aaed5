/* rope_scaling.c - the frequency tables of scaled RoPE variants (metrale/ops_kv_cache.h), for
 * mg_kv_append_args.rope_inv_freq: computed on the host, once per model. */
#include <math.h>

#include "error.h"
#include "kv_cache_internal.h"
#include "metrale/ops_kv_cache.h"

mg_status mg_rope_inv_freq_llama3(uint32_t head_dim, float rope_theta, float factor,
                                  float low_freq_factor, float high_freq_factor,
                                  uint32_t original_max_positions, float *out) {
    static const char fn[] = "mg_rope_inv_freq_llama3";
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
    if (!head_dim || head_dim % 2 || head_dim > MG_KV_MAX_HEAD_DIM)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: head_dim %u must be even and in 2..%u", fn,
                        head_dim, MG_KV_MAX_HEAD_DIM);
    if (!isfinite(rope_theta) || !(rope_theta > 0.0f))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: rope_theta %g must be finite and > 0", fn,
                        (double)rope_theta);
    if (!isfinite(factor) || !(factor >= 1.0f) || !isfinite(high_freq_factor) ||
        !(low_freq_factor > 0.0f) || !(low_freq_factor < high_freq_factor) ||
        !original_max_positions)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: factor %g (>= 1), low_freq_factor %g < high_freq_factor %g (both > 0) "
                        "and original_max_position_embeddings %u (>= 1) out of range",
                        fn, (double)factor, (double)low_freq_factor, (double)high_freq_factor,
                        original_max_positions);
    const double old = original_max_positions, low = low_freq_factor, high = high_freq_factor;
    const double low_wavelen = old / low, high_wavelen = old / high;
    for (uint32_t i = 0; i < head_dim / 2; i++) {
        const double f = pow((double)rope_theta, -(double)(2 * i) / head_dim);
        const double wavelen = 6.283185307179586 / f; /* 2 pi */
        double scaled;
        if (wavelen < high_wavelen)
            scaled = f;
        else if (wavelen > low_wavelen)
            scaled = f / factor;
        else {
            const double smooth = (old / wavelen - low) / (high - low);
            scaled = (1.0 - smooth) * f / factor + smooth * f;
        }
        out[i] = (float)scaled;
    }
    return MG_OK;
}
