/* mlx_linear.c - loading a quantized linear layer of an MLX checkpoint into device buffers
 * (metrale/mlx.h): the tensors found, their dtypes and shapes checked against each other and
 * the config, then allocated and copied. */
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "metrale/mlx.h"

typedef struct layer_tensors {
    mg_st_tensor weight, scales, biases, bias;
    bool has_bias;
} layer_tensors;

static mg_status find(const mg_st_model *m, const char *path, const char *suffix, mg_st_tensor *t) {
    char name[1024];
    if (snprintf(name, sizeof name, "%s.%s", path, suffix) >= (int)sizeof name)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_mlx_linear_load: path too long: %s", path);
    mg_status st = mg_st_find(m, name, t);
    return st ? MG_ERROR(MG_ERR_NOT_FOUND, "mg_mlx_linear_load: no tensor %s", name) : MG_OK;
}

static bool same_dims(const mg_st_tensor *a, const mg_st_tensor *b, uint32_t count) {
    for (uint32_t i = 0; i < count; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

/* Checks the tensors' dtypes and shapes; fills the descriptor's shape fields. */
static mg_status check_tensors(const char *path, const layer_tensors *t, const mg_mlx_quant *q,
                               mg_mlx_linear *out) {
    const char *fn = "mg_mlx_linear_load";
    if (t->weight.dtype != MG_ST_U32)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s.weight is %s, not U32 (not quantized?)",
                        fn, path, mg_st_dtype_name(t->weight.dtype));
    if (t->scales.dtype != MG_ST_BF16 && t->scales.dtype != MG_ST_F16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s.scales is %s, not BF16 or F16", fn, path,
                        mg_st_dtype_name(t->scales.dtype));
    if (t->biases.dtype != t->scales.dtype)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s.biases is %s but its scales are %s", fn,
                        path, mg_st_dtype_name(t->biases.dtype), mg_st_dtype_name(t->scales.dtype));
    uint32_t rank = t->weight.rank;
    if (rank != 2 && rank != 3)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s.weight has rank %u (2, or 3 for stacked experts)", fn, path, rank);
    if (t->scales.rank != rank || t->biases.rank != rank ||
        !same_dims(&t->scales, &t->biases, rank) || !same_dims(&t->weight, &t->scales, rank - 1))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s: weight, scales and biases disagree on their leading dimensions",
                        fn, path);
    uint64_t words = t->weight.shape[rank - 1], groups = t->scales.shape[rank - 1];
    uint64_t n = t->weight.shape[rank - 2], experts = rank == 3 ? t->weight.shape[0] : 1;
    uint64_t k = words * 32 / q->bits;
    if (groups * q->group_size != k)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s: weight [.., %llu] words of %u bits give k=%llu, but scales [.., "
                        "%llu] groups of %u give %llu",
                        fn, path, (unsigned long long)words, q->bits, (unsigned long long)k,
                        (unsigned long long)groups, q->group_size,
                        (unsigned long long)(groups * q->group_size));
    if (!n || !k || !experts || n > UINT32_MAX || k > UINT32_MAX || experts > UINT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s: empty or too large shape", fn, path);
    if (t->has_bias) {
        if (t->bias.rank != rank - 1 || !same_dims(&t->bias, &t->weight, rank - 1) ||
            (t->bias.dtype != MG_ST_BF16 && t->bias.dtype != MG_ST_F16 &&
             t->bias.dtype != MG_ST_F32))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: %s.bias must be BF16, F16 or F32 of shape [.., %llu]", fn, path,
                            (unsigned long long)n);
    }
    *out =
        (mg_mlx_linear){.experts = (uint32_t)experts,
                        .n = (uint32_t)n,
                        .k = (uint32_t)k,
                        .bits = q->bits,
                        .group_size = q->group_size,
                        .scale_type = t->scales.dtype == MG_ST_F16 ? MG_DTYPE_F16 : MG_DTYPE_BF16,
                        .bias_type = t->bias.dtype == MG_ST_F16   ? MG_DTYPE_F16
                                     : t->bias.dtype == MG_ST_F32 ? MG_DTYPE_F32
                                                                  : MG_DTYPE_BF16};
    return MG_OK;
}

static mg_status upload(mg_backend *b, const mg_st_tensor *t, mg_devptr *out) {
    mg_status st = mg_alloc(b, t->bytes ? t->bytes : 1, out);
    if (!st && t->bytes && (st = mg_copy_h2d(b, *out, t->data, t->bytes))) {
        mg_free(b, *out);
        *out = 0;
    }
    return st;
}

void mg_mlx_linear_free(mg_backend *b, mg_mlx_linear *l) {
    if (!l)
        return;
    mg_devptr ptrs[4] = {l->weight, l->scales, l->biases, l->bias};
    for (int i = 0; i < 4; i++)
        if (ptrs[i])
            mg_free(b, ptrs[i]);
    memset(l, 0, sizeof *l);
}

mg_status mg_mlx_linear_load(mg_backend *b, const mg_st_model *m, const mg_mlx_config *c,
                             const char *path, mg_mlx_linear *out) {
    if (!b || !m || !c || !path || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_mlx_linear_load: NULL %s",
                        !b      ? "backend"
                        : !m    ? "model"
                        : !c    ? "config"
                        : !path ? "path"
                                : "out");
    memset(out, 0, sizeof *out);
    mg_mlx_quant q;
    mg_status st = mg_mlx_config_module(c, path, &q);
    if (st)
        return st;
    if (!q.quantized)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_mlx_linear_load: %s is not quantized in the config", path);
    if ((q.bits != 4 && q.bits != 8) ||
        (q.group_size != 32 && q.group_size != 64 && q.group_size != 128))
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "mg_mlx_linear_load: %s: bits=%u group_size=%u (the ops run bits 4 and 8, "
                        "groups of 32, 64 and 128)",
                        path, q.bits, q.group_size);
    layer_tensors t = {0};
    if ((st = find(m, path, "weight", &t.weight)) || (st = find(m, path, "scales", &t.scales)) ||
        (st = find(m, path, "biases", &t.biases)))
        return st;
    mg_error_state saved; /* the bias is optional: its absence is no error */
    mg_error_save(&saved);
    t.has_bias = find(m, path, "bias", &t.bias) == MG_OK;
    mg_error_restore(&saved);
    mg_mlx_linear l;
    if ((st = check_tensors(path, &t, &q, &l)))
        return st;
    if ((st = upload(b, &t.weight, &l.weight)) || (st = upload(b, &t.scales, &l.scales)) ||
        (st = upload(b, &t.biases, &l.biases)) ||
        (t.has_bias && (st = upload(b, &t.bias, &l.bias)))) {
        mg_mlx_linear_free(b, &l);
        return st;
    }
    *out = l;
    return MG_OK;
}
