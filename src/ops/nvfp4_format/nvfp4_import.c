/* nvfp4_import.c - the checkpoint importers of metrale/nvfp4.h: ModelOpt and
 * compressed-tensors tensors checked and turned into the canonical host buffers. Both
 * conventions store the same packed bytes and E4M3 scales; they differ in the global scale,
 * which ModelOpt stores as the multiplier and compressed-tensors as its reciprocal. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "error.h"
#include "metrale/nvfp4.h"

/* One F32 value, finite and > 0 (mg_nvfp4_import_scalar); `fn` (or NULL) begins the message. */
static mg_status scalar_of(const char *fn, const mg_nvfp4_tensor_view *t, const char *name,
                           float *value) {
    const char *sep = fn ? ": " : "";
    fn = fn ? fn : "";
    name = name ? name : "the scalar";
    const bool scalar = t && t->data && (t->rank == 0 || (t->rank == 1 && t->shape[0] == 1));
    if (!t || t->dtype != MG_DTYPE_F32 || !scalar)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s%s%s must be one F32 value (%s, rank %u)", fn,
                        sep, name, t ? mg_dtype_name(t->dtype) : "null", t ? t->rank : 0);
    float v;
    memcpy(&v, t->data, sizeof v);
    if (!(v > 0.0f) || !isfinite(v))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s%s%s is %g; it must be finite and > 0", fn, sep,
                        name, (double)v);
    if (value)
        *value = v;
    return MG_OK;
}

mg_status mg_nvfp4_import_scalar(const mg_nvfp4_tensor_view *t, const char *name, float *value) {
    return scalar_of(NULL, t, name, value);
}

/* The first block scale the format's writer never produces (sign bit set, or NaN: 0x7f, and
 * 0xff with the sign), as an index into the n * blocks bytes; SIZE_MAX when there is none. */
static size_t first_bad_scale(const uint8_t *scales, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (scales[i] & 0x80 || scales[i] == 0x7f)
            return i;
    return SIZE_MAX;
}

static mg_status check_view(const char *fn, const char *name, const mg_nvfp4_tensor_view *t) {
    if (!t || !t->data)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s is %s", fn, name,
                        t ? "a view with no data" : "null");
    if (t->rank > 2)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s has rank %u (at most 2)", fn, name,
                        t->rank);
    return MG_OK;
}

/* The shared body: `global_stored` is the scalar as stored, `reciprocal` whether it divides. */
static mg_status import(const char *fn, const char *const names[3],
                        const mg_nvfp4_tensor_view *weight, const mg_nvfp4_tensor_view *scale,
                        const mg_nvfp4_tensor_view *global, bool reciprocal, uint8_t *packed,
                        size_t packed_capacity, uint8_t *scales, size_t scales_capacity,
                        mg_nvfp4_import_info *info) {
    mg_status st;
    if ((st = check_view(fn, names[0], weight)) || (st = check_view(fn, names[1], scale)) ||
        (st = check_view(fn, names[2], global)))
        return st;
    if (!info)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: info is null", fn);
    if (weight->dtype != MG_DTYPE_U8 || weight->rank != 2)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s must be a U8 matrix [N, K/2], not %s of "
                        "rank %u",
                        fn, names[0], mg_dtype_name(weight->dtype), weight->rank);
    if ((scale->dtype != MG_DTYPE_FP8_E4M3 && scale->dtype != MG_DTYPE_U8) || scale->rank != 2)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s must be an F8_E4M3 matrix [N, K/16], "
                        "not %s of rank %u",
                        fn, names[1], mg_dtype_name(scale->dtype), scale->rank);
    uint64_t n = weight->shape[0], k = weight->shape[1] * 2;
    if (n == 0 || n > UINT32_MAX || k == 0 || k > UINT32_MAX || k % MG_NVFP4_BLOCK)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s [%llu, %llu] gives N=%llu K=%llu: need N, K in [1, 2^32) and K a "
                        "multiple of 16",
                        fn, names[0], (unsigned long long)weight->shape[0],
                        (unsigned long long)weight->shape[1], (unsigned long long)n,
                        (unsigned long long)k);
    if (scale->shape[0] != n || scale->shape[1] != k / MG_NVFP4_BLOCK)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s is [%llu, %llu], expected [%llu, %llu] "
                        "for %s [%llu, %llu]",
                        fn, names[1], (unsigned long long)scale->shape[0],
                        (unsigned long long)scale->shape[1], (unsigned long long)n,
                        (unsigned long long)(k / MG_NVFP4_BLOCK), names[0],
                        (unsigned long long)weight->shape[0], (unsigned long long)weight->shape[1]);
    float stored;
    if ((st = scalar_of(fn, global, names[2], &stored)))
        return st;
    float multiplier = reciprocal ? 1.0f / stored : stored;
    if (!(multiplier > 0.0f) || !isfinite(multiplier))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s=%g has no finite reciprocal", fn, names[2],
                        (double)stored);
    size_t packed_bytes = (size_t)n * (size_t)(k / 2);
    size_t scale_bytes = (size_t)n * (size_t)(k / MG_NVFP4_BLOCK);
    const size_t bad = first_bad_scale(scale->data, scale_bytes);
    if (bad != SIZE_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s[%zu, %zu] is 0x%02x: block scales are E4M3 with the sign bit clear "
                        "and not NaN (0x7f)",
                        fn, names[1], bad / (k / MG_NVFP4_BLOCK), bad % (k / MG_NVFP4_BLOCK),
                        ((const uint8_t *)scale->data)[bad]);
    if (packed || scales || packed_capacity || scales_capacity) {
        if (!packed || packed_capacity < packed_bytes)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: packed holds %zu bytes, %s needs %zu", fn,
                            packed ? packed_capacity : 0, names[0], packed_bytes);
        if (!scales || scales_capacity < scale_bytes)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: scales holds %zu bytes, %s needs %zu", fn,
                            scales ? scales_capacity : 0, names[1], scale_bytes);
        memcpy(packed, weight->data, packed_bytes);
        memcpy(scales, scale->data, scale_bytes);
    }
    info->n = (uint32_t)n;
    info->k = (uint32_t)k;
    info->global_scale = multiplier;
    return MG_OK;
}

mg_status mg_nvfp4_import_modelopt(const mg_nvfp4_tensor_view *weight,
                                   const mg_nvfp4_tensor_view *weight_scale,
                                   const mg_nvfp4_tensor_view *weight_scale_2, uint8_t *packed,
                                   size_t packed_capacity, uint8_t *scales, size_t scales_capacity,
                                   mg_nvfp4_import_info *info) {
    static const char *const names[3] = {"weight", "weight_scale", "weight_scale_2"};
    return import("mg_nvfp4_import_modelopt", names, weight, weight_scale, weight_scale_2, false,
                  packed, packed_capacity, scales, scales_capacity, info);
}

mg_status mg_nvfp4_import_compressed_tensors(const mg_nvfp4_tensor_view *weight_packed,
                                             const mg_nvfp4_tensor_view *weight_scale,
                                             const mg_nvfp4_tensor_view *weight_global_scale,
                                             uint8_t *packed, size_t packed_capacity,
                                             uint8_t *scales, size_t scales_capacity,
                                             mg_nvfp4_import_info *info) {
    static const char *const names[3] = {"weight_packed", "weight_scale", "weight_global_scale"};
    return import("mg_nvfp4_import_compressed_tensors", names, weight_packed, weight_scale,
                  weight_global_scale, true, packed, packed_capacity, scales, scales_capacity,
                  info);
}
