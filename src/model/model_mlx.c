/* model_mlx.c - the forward model's layer matrices from an MLX checkpoint (model_mlx.h). */
#include "model_mlx.h"
#include "model_tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrale/mlx.h"
#include "metrale/ops.h"
#include "metrale/ops_activation.h"
#include "metrale/status.h"

struct mg_fwd_mlx {
    mg_backend *b;
    mg_model_shape sh;
    uint32_t layers;
    mg_mlx_linear *w; /* [layers][MX_SLOTS] */
    /* the GEMM's BF16 expansion of the largest matrix: the model's arena (set_scratch) */
    mg_devptr scratch;
    uint64_t scratch_need;
    uint64_t bytes;
};

uint32_t mg_fwd_mlx_model_slot(uint32_t i) {
    static const uint32_t slots[MX_SLOTS] = {MG_FWD_WQ, MG_FWD_WKV, MG_FWD_WO, MG_FWD_W_GATE_UP,
                                             MG_FWD_W_DOWN};
    return slots[i];
}

static int mx_slot(uint32_t slot) {
    switch (slot) {
    case MG_FWD_WQ:
        return MX_Q;
    case MG_FWD_WKV:
        return MX_KV;
    case MG_FWD_WO:
        return MX_O;
    case MG_FWD_W_GATE_UP:
        return MX_GATE_UP;
    case MG_FWD_W_DOWN:
        return MX_DOWN;
    default:
        return -1;
    }
}

const char *mg_fwd_mlx_default_checkpoint(const char *preset, uint32_t bits, char *buf,
                                          size_t size) {
    /* The environment first, so a binary moved off its source tree still finds them. */
    const char *dir = getenv("METRALE_MLX_CHECKPOINTS");
#ifdef METRALE_MLX_CHECKPOINTS
    if (!dir || !*dir)
        dir = METRALE_MLX_CHECKPOINTS;
#endif
    if (!dir || !*dir)
        return NULL;
    snprintf(buf, size, "%s/%s-mlx%u", dir, preset, bits);
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/config.json", buf);
    if (access(probe, R_OK) == 0)
        return buf;
    return NULL;
}

/* The parts' halves of one joined layer: views into its buffers (gate rows then up rows). */
static mg_mlx_linear half(const mg_mlx_linear *w, uint32_t part) {
    mg_mlx_linear h = *w;
    h.n = w->n / 2;
    uint64_t wb = (uint64_t)h.n * w->k * w->bits / 8, gb = 2ull * h.n * (w->k / w->group_size);
    h.weight += part * wb;
    h.scales += part * gb;
    h.biases += part * gb;
    if (w->bias)
        h.bias += (uint64_t)part * h.n * mg_dtype_bytes(w->bias_type);
    return h;
}

static mg_status load(mg_fwd_mlx *x, const mg_st_model *m, const mg_mlx_config *c, const char *dir,
                      const char *path, uint32_t bits, uint32_t n, uint32_t k, mg_mlx_linear *out) {
    mg_status st = mg_mlx_linear_load(x->b, m, c, path, out);
    if (st)
        return mg_error_report(st, "MLX checkpoint %s: %s", dir, mg_last_error());
    if (out->experts != 1 || out->n != n || out->k != k || out->bits != bits) {
        st = mg_error_report(MG_ERR_INVALID_ARGUMENT,
                             "MLX checkpoint %s: %s is [%u, %u] %u-bit (x%u), the preset needs "
                             "[%u, %u] %u-bit",
                             dir, path, out->n, out->k, out->bits, out->experts, n, k, bits);
        mg_mlx_linear_free(x->b, out);
    }
    return st;
}

/* Loads a and b ([n, k] each, one format) and joins them into one layer of 2n rows. */
static mg_status load_joined(mg_fwd_mlx *x, const mg_st_model *m, const mg_mlx_config *c,
                             const char *dir, const char *pa, const char *pb, uint32_t bits,
                             uint32_t n, uint32_t k, mg_mlx_linear *out) {
    mg_mlx_linear p[2] = {{0}, {0}};
    mg_status st = load(x, m, c, dir, pa, bits, n, k, &p[0]);
    if (!st)
        st = load(x, m, c, dir, pb, bits, n, k, &p[1]);
    if (!st && (p[0].group_size != p[1].group_size || p[0].scale_type != p[1].scale_type ||
                !p[0].bias != !p[1].bias || (p[0].bias && p[0].bias_type != p[1].bias_type)))
        st = mg_error_report(
            MG_ERR_INVALID_ARGUMENT,
            "MLX checkpoint %s: %s and %s differ in group size, scale or bias type", dir, pa, pb);
    mg_mlx_linear j = p[0];
    j.n = 2 * n;
    j.weight = j.scales = j.biases = j.bias = 0;
    uint64_t wb = (uint64_t)n * k * bits / 8, gb = 2ull * n * (k / p[0].group_size);
    uint64_t bb = p[0].bias ? (uint64_t)n * mg_dtype_bytes(p[0].bias_type) : 0;
    mg_devptr *dst[4] = {&j.weight, &j.scales, &j.biases, &j.bias};
    uint64_t sizes[4] = {wb, gb, gb, bb};
    for (int i = 0; !st && i < 4; i++) {
        if (!sizes[i])
            continue;
        mg_devptr src[2][4] = {{p[0].weight, p[0].scales, p[0].biases, p[0].bias},
                               {p[1].weight, p[1].scales, p[1].biases, p[1].bias}};
        if ((st = mg_alloc(x->b, 2 * sizes[i], dst[i])) ||
            (st = mg_copy_d2d(x->b, *dst[i], src[0][i], sizes[i])) ||
            (st = mg_copy_d2d(x->b, *dst[i] + sizes[i], src[1][i], sizes[i])))
            st = mg_error_report(st, "joining %s and %s: %s", pa, pb, mg_last_error());
    }
    mg_mlx_linear_free(x->b, &p[0]);
    mg_mlx_linear_free(x->b, &p[1]);
    if (st)
        mg_mlx_linear_free(x->b, &j);
    else
        *out = j;
    return st;
}

/* The GEMM scratch the largest matrix of x needs, and the bytes of all of them. */
static mg_status finish(mg_fwd_mlx *x) {
    for (size_t i = 0; i < (size_t)x->layers * MX_SLOTS; i++) {
        uint64_t s = mg_mlx_gemm_scratch_bytes(&x->w[i]);
        x->scratch_need = s > x->scratch_need ? s : x->scratch_need;
        x->bytes += mg_mlx_linear_bytes(&x->w[i]);
    }
    return MG_OK;
}

mg_status mg_fwd_mlx_set_scratch(mg_fwd_mlx *x, mg_devptr scratch, uint64_t bytes) {
    if (bytes < x->scratch_need)
        return mg_error_report(MG_ERR_INTERNAL,
                               "MLX weights: the GEMM scratch planned holds %llu bytes, the "
                               "largest matrix needs %llu",
                               (unsigned long long)bytes, (unsigned long long)x->scratch_need);
    x->scratch = scratch;
    return MG_OK;
}

static mg_fwd_mlx *new_mlx(mg_backend *b, const mg_model_shape *sh, uint32_t layers) {
    mg_fwd_mlx *x = calloc(1, sizeof *x);
    if (!x || !(x->w = calloc((size_t)layers * MX_SLOTS, sizeof *x->w))) {
        free(x);
        mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    x->b = b;
    x->sh = *sh;
    x->layers = layers;
    return x;
}

mg_status mg_fwd_mlx_adopt(mg_backend *b, const mg_model_shape *sh, uint32_t layers,
                           mg_mlx_linear *w, mg_fwd_mlx **out) {
    *out = NULL;
    mg_fwd_mlx *x = new_mlx(b, sh, layers);
    if (!x) {
        for (size_t i = 0; i < (size_t)layers * MX_SLOTS; i++)
            mg_mlx_linear_free(b, &w[i]);
        return MG_ERR_OUT_OF_MEMORY;
    }
    memcpy(x->w, w, (size_t)layers * MX_SLOTS * sizeof *w);
    memset(w, 0, (size_t)layers * MX_SLOTS * sizeof *w);
    mg_status st = finish(x);
    if (st) {
        mg_fwd_mlx_destroy(x);
        return st;
    }
    *out = x;
    return MG_OK;
}

mg_status mg_fwd_mlx_create(mg_backend *b, const mg_model_shape *sh, uint32_t layers,
                            const char *dir, uint32_t bits, mg_fwd_mlx **out) {
    *out = NULL;
    if (sh->experts)
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "MLX weights: mixture-of-experts presets are not "
                               "supported yet");
    mg_fwd_mlx *x = new_mlx(b, sh, layers);
    if (!x)
        return MG_ERR_OUT_OF_MEMORY;
    mg_st_model *m = NULL;
    mg_mlx_config *c = NULL;
    mg_status st = mg_st_open(dir, &m);
    if (!st && (st = mg_mlx_config_open(dir, &c)))
        mg_st_close(m), m = NULL;
    if (st) {
        mg_fwd_mlx_destroy(x);
        return mg_error_report(st, "MLX checkpoint %s: %s", dir, mg_last_error());
    }
    uint32_t H = sh->hidden, QD = sh->heads * sh->head_dim, KD = sh->kv_heads * sh->head_dim;
    uint32_t I = sh->intermediate;
    char pa[160], pb[160];
    for (uint32_t l = 0; !st && l < layers; l++) {
        mg_mlx_linear *w = x->w + (size_t)l * MX_SLOTS;
        snprintf(pa, sizeof pa, "model.layers.%u.self_attn.q_proj", l);
        st = load(x, m, c, dir, pa, bits, QD, H, &w[MX_Q]);
        snprintf(pa, sizeof pa, "model.layers.%u.self_attn.k_proj", l);
        snprintf(pb, sizeof pb, "model.layers.%u.self_attn.v_proj", l);
        if (!st)
            st = load_joined(x, m, c, dir, pa, pb, bits, KD, H, &w[MX_KV]);
        snprintf(pa, sizeof pa, "model.layers.%u.self_attn.o_proj", l);
        if (!st)
            st = load(x, m, c, dir, pa, bits, H, QD, &w[MX_O]);
        snprintf(pa, sizeof pa, "model.layers.%u.mlp.gate_proj", l);
        snprintf(pb, sizeof pb, "model.layers.%u.mlp.up_proj", l);
        if (!st)
            st = load_joined(x, m, c, dir, pa, pb, bits, I, H, &w[MX_GATE_UP]);
        snprintf(pa, sizeof pa, "model.layers.%u.mlp.down_proj", l);
        if (!st)
            st = load(x, m, c, dir, pa, bits, H, I, &w[MX_DOWN]);
    }
    mg_st_close(m);
    mg_mlx_config_close(c);
    if (!st)
        st = finish(x);
    if (st) {
        mg_fwd_mlx_destroy(x);
        return st;
    }
    *out = x;
    return MG_OK;
}

mg_status mg_fwd_mlx_shard(mg_fwd_mlx *x, const mg_model_shape *local, uint32_t rank,
                           uint32_t ranks) {
    /* model_tp.h's split: column-parallel layers their rows (k and v, gate and up: each half
     * cut); row-parallel ones their input features, whole quantization groups per rank */
    const mg_fwd_tp_matrix *cuts = mg_fwd_tp_matrices;
    const size_t count = MG_FWD_TP_MATRICES;
    for (uint32_t l = 0; l < x->layers; l++) /* every refusal before the first cut */
        for (size_t i = 0; i < count; i++) {
            const bool columns = cuts[i].axis == MG_COMM_SHARD_COLUMNS;
            const mg_mlx_linear *w = &x->w[(size_t)l * MX_SLOTS + mx_slot(cuts[i].slot)];
            if (!columns && w->n % (cuts[i].parts * ranks) == 0)
                continue;
            if (!columns)
                return mg_error_report(MG_ERR_INTERNAL,
                                       "MLX weights: layer %u's %s has %u rows for %u ranks", l,
                                       cuts[i].name, w->n, ranks);
            if (w->bias)
                return mg_error_report(MG_ERR_UNSUPPORTED,
                                       "MLX weights: layer %u's %s has a bias, which a "
                                       "row-parallel split over %u ranks would add on each",
                                       l, cuts[i].name, ranks);
            if (w->k % ((uint64_t)ranks * w->group_size))
                return mg_error_report(MG_ERR_UNSUPPORTED,
                                       "MLX weights: layer %u's %s has %u input features in groups "
                                       "of %u, which %u ranks cannot share in whole groups",
                                       l, cuts[i].name, w->k, w->group_size, ranks);
        }
    for (uint32_t l = 0; l < x->layers; l++)
        for (size_t i = 0; i < count; i++) {
            mg_mlx_linear *w = &x->w[(size_t)l * MX_SLOTS + mx_slot(cuts[i].slot)];
            const mg_comm_shard_axis axis = cuts[i].axis;
            const size_t scale_row = (size_t)(w->k / w->group_size) * mg_dtype_bytes(w->scale_type);
            mg_status st = mg_fwd_tp_cut_buffer(x->b, &w->weight, w->n, (size_t)w->k * w->bits / 8,
                                                axis, cuts[i].parts, rank, ranks);
            if (!st)
                st = mg_fwd_tp_cut_buffer(x->b, &w->scales, w->n, scale_row, axis, cuts[i].parts,
                                          rank, ranks);
            if (!st)
                st = mg_fwd_tp_cut_buffer(x->b, &w->biases, w->n, scale_row, axis, cuts[i].parts,
                                          rank, ranks);
            if (!st && w->bias) /* column-parallel layers only (refused above otherwise) */
                st = mg_fwd_tp_cut_buffer(x->b, &w->bias, w->n, mg_dtype_bytes(w->bias_type),
                                          MG_COMM_SHARD_ROWS, cuts[i].parts, rank, ranks);
            if (st) /* the layer's buffers are each whole or cut: unusable, freed with x */
                return st;
            if (axis == MG_COMM_SHARD_COLUMNS)
                w->k /= ranks;
            else
                w->n /= ranks;
        }
    x->sh = *local;
    x->scratch_need = x->bytes = 0;
    return finish(x);
}

void mg_fwd_mlx_destroy(mg_fwd_mlx *x) {
    if (!x)
        return;
    for (size_t i = 0; x->w && i < (size_t)x->layers * MX_SLOTS; i++)
        mg_mlx_linear_free(x->b, &x->w[i]);
    free(x->w);
    free(x);
}

uint64_t mg_fwd_mlx_bytes(const mg_fwd_mlx *x) {
    return x ? x->bytes : 0;
}

static const mg_mlx_linear *matrix(const mg_fwd_mlx *x, uint32_t l, uint32_t slot) {
    int i = mx_slot(slot);
    return i < 0 || l >= x->layers ? NULL : &x->w[(size_t)l * MX_SLOTS + i];
}

mg_status mg_fwd_mlx_dequantize(mg_fwd_mlx *x, uint32_t l, uint32_t slot, mg_devptr *out) {
    const mg_mlx_linear *w = matrix(x, l, slot);
    if (!w)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "MLX weights: no matrix %u of layer %u",
                               slot, l);
    /* the BF16 path that runs dequantized matrices adds no bias: refuse rather than drop it */
    if (w->bias)
        return mg_error_report(
            MG_ERR_UNSUPPORTED,
            "MLX weights: matrix %u of layer %u has a bias, which the dequantized "
            "(BF16) path does not apply",
            slot, l);
    mg_status st = mg_alloc(x->b, mg_mlx_gemm_scratch_bytes(w), out);
    if (!st && (st = mg_mlx_dequant(x->b, NULL, w, 0, *out))) {
        mg_free(x->b, *out);
        *out = 0;
    }
    return st ? mg_error_report(st, "dequantizing the MLX weights: %s", mg_last_error()) : MG_OK;
}

static mg_status product(mg_fwd_mlx *x, mg_stream *s, const mg_mlx_linear *w, uint32_t rows,
                         mg_devptr act, mg_devptr out) {
    return rows <= MG_FWD_MLX_GEMV_MAX_ROWS
               ? mg_mlx_gemv(x->b, s, w, 0, rows, act, out)
               : mg_mlx_gemm(x->b, s, w, 0, rows, act, out, x->scratch);
}

mg_status mg_fwd_mlx_linear(mg_fwd_mlx *x, mg_stream *s, uint32_t l, uint32_t slot, uint32_t rows,
                            mg_devptr act, mg_devptr out) {
    const mg_mlx_linear *w = matrix(x, l, slot);
    if (!w)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "MLX weights: no matrix %u of layer %u",
                               slot, l);
    return product(x, s, w, rows, act, out);
}

mg_status mg_fwd_mlx_mlp(mg_fwd_mlx *x, mg_stream *s, uint32_t l, uint32_t rows, mg_devptr act,
                         mg_devptr gate_up, mg_devptr mlp_act, mg_devptr out) {
    const mg_mlx_linear *gu = matrix(x, l, MG_FWD_W_GATE_UP), *down = matrix(x, l, MG_FWD_W_DOWN);
    uint32_t I = x->sh.intermediate;
    mg_status st;
    if (!gu || !down)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "MLX weights: no layer %u", l);
    if (rows <= MG_FWD_MLX_GEMV_MAX_ROWS) {
        mg_mlx_linear gate = half(gu, 0), up = half(gu, 1);
        if (!gu->bias) {
            /* silu(g) * u made once, by the gate_up GEMV, then a plain down GEMV */
            const mg_gemm_fusion silu_mul = {.epilogue = MG_GEMM_EPILOGUE_SILU_MUL};
            const mg_gemm_fusion_tensors none = {0};
            if ((st = mg_mlx_gemv_fused(x->b, s, &gate, &up, 0, rows, act, mlp_act, &silu_mul,
                                        &none)))
                return st;
            return mg_mlx_gemv(x->b, s, down, 0, rows, mlp_act, out);
        }
        /* with biases (added after each product): gate [rows, I] then up [rows, I] in
         * gate_up; the down GEMV makes silu(g) * u */
        mg_devptr g = gate_up, u = gate_up + 2ull * rows * I;
        if ((st = mg_mlx_gemv_gate_up(x->b, s, &gate, &up, 0, rows, act, g, u)))
            return st;
        return mg_mlx_gemv_silu_gate(x->b, s, down, 0, rows, g, u, out);
    }
    if ((st = mg_mlx_gemm(x->b, s, gu, 0, rows, act, gate_up, x->scratch)) ||
        (st = mg_silu_mul_bf16(x->b, s, rows, I, gate_up, 2 * I, mlp_act, I)))
        return st;
    return mg_mlx_gemm(x->b, s, down, 0, rows, mlp_act, out, x->scratch);
}

static uint32_t bits_of(const mg_fwd_config *c) {
    return c->weights == MG_FWD_WEIGHTS_MLX4 ? 4 : 8;
}

const char *mg_fwd_mlx_checkpoint(const mg_fwd_config *c, char *buf, size_t size) {
    if (c->checkpoint)
        return c->checkpoint;
    return mg_fwd_mlx_default_checkpoint(c->preset->name, bits_of(c), buf, size);
}

mg_status mg_fwd_mlx_check_config(mg_backend *b, const mg_fwd_config *c) {
    if (c->preset->shape.experts)
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "--weights %s: preset %s is a mixture of experts; "
                               "MLX weights run dense presets only",
                               mg_fwd_weights_name(c->weights), c->preset->name);
    if (!mg_op_supported(b, MG_OP_MLX_QUANT))
        return mg_error_report(MG_ERR_UNSUPPORTED, "the %s backend cannot run op %s",
                               mg_backend_kind_name(mg_backend_get_kind(b)),
                               mg_op_name(MG_OP_MLX_QUANT));
    return MG_OK;
}

mg_status mg_fwd_mlx_attach(mg_backend *b, const mg_fwd_config *c, mg_fwd_mlx *x,
                            mg_devptr *layer_w, mg_fwd_mlx **out, uint64_t *weight_bytes) {
    *out = NULL;
    mg_status st = MG_OK;
    if (!x) {
        char buf[1024];
        const char *dir = mg_fwd_mlx_checkpoint(c, buf, sizeof buf);
        if (!dir)
            return mg_error_report(MG_ERR_INTERNAL, "MLX weights: no checkpoint to load");
        if ((st = mg_fwd_mlx_create(b, &c->preset->shape, c->preset->layers, dir, bits_of(c), &x)))
            return st;
    }
    if (!c->mlx_dequantized) {
        *weight_bytes += x->bytes;
        *out = x;
        return MG_OK;
    }
    for (uint32_t l = 0; !st && l < x->layers; l++)
        for (uint32_t i = 0; !st && i < MX_SLOTS; i++) {
            const uint32_t slot = mg_fwd_mlx_model_slot(i);
            st = mg_fwd_mlx_dequantize(x, l, slot,
                                       &layer_w[(size_t)l * MG_FWD_LAYER_TENSORS + slot]);
            if (!st)
                *weight_bytes += mg_mlx_gemm_scratch_bytes(matrix(x, l, slot));
        }
    mg_status sync = mg_stream_synchronize(mg_stream_default(b));
    if (!st && sync)
        st = mg_error_report(sync, "dequantizing the MLX weights: %s", mg_last_error());
    mg_fwd_mlx_destroy(x);
    return st;
}
