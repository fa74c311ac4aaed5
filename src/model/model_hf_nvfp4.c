/* model_hf_nvfp4.c - the NVFP4 linears of a Hugging Face directory (model_hf_nvfp4.h): the
 * safetensors entries as importer views, the canonical bytes prepared on the device. */
#include "model_hf_nvfp4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/nvfp4.h"
#include "metrale/ops.h"
#include "metrale/status.h"

/* The tensor names of a convention, after "base.": packed codes, block scales, the global,
 * the activation scale. */
typedef struct nvfp4_names {
    const char *codes, *scales, *global, *input;
} nvfp4_names;

static const nvfp4_names modelopt_names = {"weight", "weight_scale", "weight_scale_2",
                                           "input_scale"};
static const nvfp4_names compressed_names = {"weight_packed", "weight_scale", "weight_global_scale",
                                             "input_global_scale"};

static const nvfp4_names *names_of(mg_fwd_nvfp4_convention conv) {
    return conv == MG_FWD_NVFP4_MODELOPT ? &modelopt_names : &compressed_names;
}

bool mg_fwd_hf_nvfp4_suffix(mg_fwd_nvfp4_convention conv, const char *name, size_t *base_len) {
    if (conv == MG_FWD_NVFP4_NONE)
        return false;
    const nvfp4_names *nn = names_of(conv);
    const char *const suffixes[] = {nn->codes, nn->scales, nn->global, nn->input};
    const size_t n = strlen(name);
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        const size_t sl = strlen(suffixes[i]);
        if (strcmp(suffixes[i], "weight") && n > sl + 1 && name[n - sl - 1] == '.' &&
            !strcmp(name + n - sl, suffixes[i])) {
            *base_len = n - sl - 1;
            return true;
        }
    }
    return false;
}

/* base.suffix into buf; false when it does not fit. */
static bool tensor_name(char *buf, size_t size, const char *base, const char *suffix) {
    const int w = snprintf(buf, size, "%s.%s", base, suffix);
    return w > 0 && (size_t)w < size;
}

/* A safetensors entry of a dtype already checked (U8, F8_E4M3 or F32) as an importer view
 * (ranks above 2 are refused by the importers). */
static mg_nvfp4_tensor_view view_of(const mg_st_tensor *t) {
    mg_nvfp4_tensor_view v = {.data = t->data, .rank = t->rank};
    v.dtype = t->dtype == MG_ST_U8        ? MG_DTYPE_U8
              : t->dtype == MG_ST_F8_E4M3 ? MG_DTYPE_FP8_E4M3
                                          : MG_DTYPE_F32;
    for (uint32_t i = 0; i < 2 && i < t->rank; i++)
        v.shape[i] = t->shape[i];
    return v;
}

/* The three weight tensors of `base` through the convention's importer: the canonical bytes
 * into packed / scales (NULL with 0 capacities: the checks alone) and *info. */
static mg_status import_linear(const mg_st_model *st, const char *dir, mg_fwd_nvfp4_convention conv,
                               const char *base, uint8_t *packed, size_t packed_capacity,
                               uint8_t *scales, size_t scales_capacity,
                               mg_nvfp4_import_info *info) {
    const nvfp4_names *nn = names_of(conv);
    const char *const suffixes[3] = {nn->codes, nn->scales, nn->global};
    mg_st_tensor t[3];
    mg_nvfp4_tensor_view v[3];
    char name[192];
    for (int i = 0; i < 3; i++) {
        if (!tensor_name(name, sizeof name, base, suffixes[i]))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "checkpoint %s: tensor name %s.%s is longer than %zu bytes", dir,
                                   base, suffixes[i], sizeof name - 1);
        if (mg_st_find(st, name, &t[i]))
            return mg_error_report(
                MG_ERR_INVALID_ARGUMENT,
                "checkpoint %s: tensor %s is missing (NVFP4 linear %s, %s "
                "convention)",
                dir, name, base, conv == MG_FWD_NVFP4_MODELOPT ? "ModelOpt" : "compressed-tensors");
        /* block scales as F8_E4M3, or their bytes as U8 (the importers take both) */
        const bool scale_bytes = i == 1 && t[i].dtype == MG_ST_U8;
        if (!scale_bytes && t[i].dtype != (i == 0 ? MG_ST_U8 : i == 1 ? MG_ST_F8_E4M3 : MG_ST_F32))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "checkpoint %s: tensor %s is %s, NVFP4 needs %s", dir, name,
                                   mg_st_dtype_name(t[i].dtype),
                                   i == 0   ? "U8"
                                   : i == 1 ? "F8_E4M3 (or U8)"
                                            : "F32");
        v[i] = view_of(&t[i]);
    }
    mg_status st_ =
        conv == MG_FWD_NVFP4_MODELOPT
            ? mg_nvfp4_import_modelopt(&v[0], &v[1], &v[2], packed, packed_capacity, scales,
                                       scales_capacity, info)
            : mg_nvfp4_import_compressed_tensors(&v[0], &v[1], &v[2], packed, packed_capacity,
                                                 scales, scales_capacity, info);
    if (st_)
        return mg_error_report(st_, "checkpoint %s: NVFP4 linear %s: %s", dir, base,
                               mg_last_error());
    return MG_OK;
}

mg_status mg_fwd_hf_nvfp4_check(const mg_st_model *st, const char *dir,
                                mg_fwd_nvfp4_convention conv, bool input_scales, const char *base,
                                uint64_t rows, uint64_t cols, bool *quantized) {
    const nvfp4_names *nn = names_of(conv);
    char name[192];
    mg_st_tensor t;
    *quantized = false;
    if (!tensor_name(name, sizeof name, base, nn->scales))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "checkpoint %s: tensor name %s.%s is longer than %zu bytes", dir,
                               base, nn->scales, sizeof name - 1);
    if (mg_st_find(st, name, &t)) {
        /* a float linear: nothing of the quantized form may stand beside it */
        const char *const others[] = {nn->codes, nn->global, nn->input};
        for (size_t i = 0; i < 3; i++)
            if (strcmp(others[i], "weight") && tensor_name(name, sizeof name, base, others[i]) &&
                !mg_st_find(st, name, &t))
                return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                       "checkpoint %s: tensor %s without %s.%s (neither a float "
                                       "nor a whole NVFP4 linear)",
                                       dir, name, base, nn->scales);
        return MG_OK;
    }
    mg_nvfp4_import_info info;
    mg_status s = import_linear(st, dir, conv, base, NULL, 0, NULL, 0, &info);
    if (s)
        return s;
    if (info.n != rows || info.k != cols)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "checkpoint %s: NVFP4 linear %s is [%u, %u], the config implies "
                               "[%llu, %llu]",
                               dir, base, info.n, info.k, (unsigned long long)rows,
                               (unsigned long long)cols);
    if (!tensor_name(name, sizeof name, base, nn->input))
        return MG_ERR_INTERNAL; /* unreachable: shorter than base.weight_global_scale */
    if (mg_st_find(st, name, &t)) {
        if (input_scales)
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "checkpoint %s: tensor %s is missing (the config quantizes "
                                   "activations)",
                                   dir, name);
    } else {
        /* the importer's rule for its globals (then not applied: W4A16) */
        if (t.dtype != MG_ST_F32)
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "checkpoint %s: tensor %s must be one finite F32 > 0, not %s",
                                   dir, name, mg_st_dtype_name(t.dtype));
        const mg_nvfp4_tensor_view v = view_of(&t);
        if (mg_nvfp4_import_scalar(&v, name, NULL))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT, "checkpoint %s: %s", dir,
                                   mg_last_error());
    }
    *quantized = true;
    return MG_OK;
}

mg_status mg_fwd_hf_nvfp4_upload(mg_backend *b, const mg_st_model *st, const char *dir,
                                 mg_fwd_nvfp4_convention conv, const char *base,
                                 mg_nvfp4_weight *out, uint64_t *bytes) {
    memset(out, 0, sizeof *out);
    mg_nvfp4_import_info info;
    mg_status s = import_linear(st, dir, conv, base, NULL, 0, NULL, 0, &info);
    if (s)
        return s;
    const size_t pb = mg_nvfp4_packed_bytes(info.n, info.k),
                 sb = mg_nvfp4_scale_bytes(info.n, info.k);
    const size_t vb = mg_nvfp4_prepared_value_bytes(info.n, info.k),
                 psb = mg_nvfp4_prepared_scale_bytes(info.n, info.k);
    uint8_t *host = malloc(pb + sb);
    if (!host)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for %s", base);
    s = import_linear(st, dir, conv, base, host, pb, host + pb, sb, &info);
    /* staging: the canonical codes then scales; the weight: values, scales, then the global
     * (vb and psb are multiples of 16, so every part keeps the allocation's alignment) */
    mg_devptr staging = 0, w = 0;
    const char *what = "allocating";
    if (!s && !(s = mg_alloc(b, pb + sb, &staging)) && !(s = mg_alloc(b, vb + psb + 16, &w))) {
        mg_stream *s0 = mg_stream_default(b);
        what = "uploading";
        if (!(s = mg_copy_h2d(b, staging, host, pb + sb)) &&
            !(s = mg_copy_h2d(b, w + vb + psb, &info.global_scale, sizeof info.global_scale))) {
            what = "preparing";
            if (!(s = mg_nvfp4_prepare(b, s0, info.n, info.k, 1, staging, staging + pb, w, w + vb)))
                s = mg_stream_synchronize(s0); /* the staging is freed only after prepare ran */
        }
    }
    free(host);
    if (staging)
        mg_free(b, staging);
    if (s) {
        if (w)
            mg_free(b, w);
        return mg_error_report(s, "checkpoint %s: %s NVFP4 linear %s: %s", dir, what, base,
                               mg_last_error());
    }
    *out = (mg_nvfp4_weight){.values = w, .scales = w + vb, .global_scale = w + vb + psb};
    *bytes += vb + psb + 16;
    return MG_OK;
}
