/* model_weights.c - the weights of the forward model: generated for a preset (BF16, FP8 with
 * row scales, NVFP4 and MLX quantized at load, or MLX from a checkpoint) or loaded from a real
 * checkpoint (model_checkpoint.h). */
#include "model_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrale/dtype.h"
#include "metrale/mlx.h"
#include "metrale/nvfp4.h"
#include "metrale/ops.h"
#include "metrale/ops_activation.h"
#include "metrale/ops_elementwise.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_kv_cache.h"
#include "metrale/ops_moe.h"
#include "metrale/ops_moe_gemm.h"
#include "metrale/ops_nvfp4.h"
#include "metrale/ops_quantize.h"
#include "metrale/status.h"

/* fn(ctx, first, count) over a part [first, first + count) of a range. */
typedef mg_status (*range_fn)(void *ctx, size_t first, size_t count);

typedef struct range_job {
    range_fn fn;
    void *ctx;
    size_t first, count;
    mg_status st;
} range_job;

static void *range_thread(void *arg) {
    range_job *j = arg;
    j->st = j->count ? j->fn(j->ctx, j->first, j->count) : MG_OK;
    return NULL;
}

/* Runs fn over [0, total) in parts on up to 16 threads (one when total < serial_below), the
 * calling thread included; the first failing part's status. */
static mg_status parallel_ranges(size_t total, size_t serial_below, range_fn fn, void *ctx) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned threads = cpus < 1 ? 1 : cpus > 16 ? 16 : (unsigned)cpus;
    if (total < serial_below)
        threads = 1;
    pthread_t tid[16];
    range_job jobs[16];
    size_t per = (total + threads - 1) / threads;
    unsigned started = 0;
    for (unsigned t = 0; t < threads; t++) {
        size_t first = (size_t)t * per < total ? (size_t)t * per : total;
        jobs[t] = (range_job){fn, ctx, first, total - first < per ? total - first : per, MG_OK};
        if (t == 0 || pthread_create(&tid[t], NULL, range_thread, &jobs[t]) != 0)
            continue;
        started |= 1u << t;
    }
    range_thread(&jobs[0]);
    mg_status st = jobs[0].st;
    for (unsigned t = 1; t < threads; t++) {
        if (started & (1u << t))
            pthread_join(tid[t], NULL);
        else
            range_thread(&jobs[t]);
        if (!st)
            st = jobs[t].st;
    }
    return st;
}

typedef struct fill_job {
    uint64_t seed;
    uint32_t id;
    float offset, scale;
    uint16_t *out;
} fill_job;

static mg_status fill_range(void *ctx, size_t first, size_t count) {
    fill_job *j = ctx;
    mg_fwd_weight_fill(j->seed, j->id, j->offset, j->scale, first, count, j->out + first);
    return MG_OK;
}

/* Generates tensor `id` into `host` (over up to 16 threads); its shape in rows x cols. */
static mg_status generate_tensor(mg_fwd *m, uint32_t id, uint16_t *host, uint32_t *rows_out,
                                 uint32_t *cols_out) {
    uint32_t rows, cols;
    float offset, scale;
    /* the whole model's tensor (a tensor-parallel rank keeps its share: mg_fwd_tp_shard_weights) */
    mg_status st = mg_fwd_tensor_shape(&m->full_sh, m->layers, id, &rows, &cols, &offset, &scale);
    if (st)
        return st;
    *rows_out = rows;
    *cols_out = cols;
    fill_job job = {m->c.seed, id, offset, scale, host};
    return parallel_ranges((size_t)rows * cols, 1u << 20, fill_range, &job);
}

/* Generates tensor `id` on the host and uploads it as BF16. */
static mg_status upload_tensor(mg_fwd *m, uint32_t id, uint16_t *host, mg_devptr *out) {
    uint32_t rows, cols;
    mg_status st = generate_tensor(m, id, host, &rows, &cols);
    if (st)
        return st;
    size_t bytes = (size_t)rows * cols * 2;
    if ((st = mg_alloc(m->b, bytes, out)))
        return mg_fwd_lib_fail(st, "allocating weights");
    if ((st = mg_copy_h2d(m->b, *out, host, bytes)))
        return mg_fwd_lib_fail(st, "uploading weights");
    m->weight_bytes += bytes;
    return MG_OK;
}

typedef struct fp8_job {
    const uint16_t *bf16;
    uint32_t cols;
    uint8_t *codes;
    float *scales;
} fp8_job;

static mg_status fp8_rows(void *ctx, size_t first, size_t count) {
    fp8_job *j = ctx;
    return mg_fp8_quantize_rowwise(j->bf16 + first * j->cols, (uint32_t)count, j->cols,
                                   j->codes + first * j->cols, j->scales + first);
}

/* Tensor `id` generated on the host in BF16, quantized there to E4M3 with one scale per row
 * (mg_fp8_quantize_rowwise; model.h) and uploaded as one allocation: the codes [rows, cols]
 * at *codes_out, then the FP32 scales [rows] at the next 16-byte boundary (*scales_out). */
static mg_status upload_fp8_tensor(mg_fwd *m, uint32_t id, uint16_t *host, mg_devptr *codes_out,
                                   mg_devptr *scales_out) {
    uint32_t rows, cols;
    mg_status st = generate_tensor(m, id, host, &rows, &cols);
    if (st)
        return st;
    size_t codes_bytes = ((size_t)rows * cols + 15) & ~(size_t)15,
           bytes = codes_bytes + 4ull * rows;
    uint8_t *codes = malloc(bytes);
    if (!codes)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the FP8 weights");
    fp8_job job = {host, cols, codes, (float *)(codes + codes_bytes)};
    if ((st = parallel_ranges(rows, (1u << 20) / cols + 1, fp8_rows, &job)))
        st = mg_error_report(st, "quantizing weights to FP8: %s", mg_last_error());
    else if ((st = mg_alloc(m->b, bytes, codes_out)))
        st = mg_fwd_lib_fail(st, "allocating FP8 weights");
    else if ((st = mg_copy_h2d(m->b, *codes_out, codes, bytes)))
        st = mg_fwd_lib_fail(st, "uploading FP8 weights");
    free(codes);
    if (st)
        return st;
    *scales_out = *codes_out + codes_bytes;
    m->weight_bytes += bytes;
    return MG_OK;
}

typedef struct mlx_job {
    const uint16_t *bf16;
    uint32_t cols, bits;
    uint32_t *words;
    uint16_t *scales, *biases;
} mlx_job;

static mg_status mlx_rows(void *ctx, size_t first, size_t count) {
    mlx_job *j = ctx;
    const size_t groups = j->cols / MG_FWD_MLX_GROUP;
    return mg_mlx_quantize(j->bf16 + first * j->cols, MG_DTYPE_BF16, (uint32_t)count, j->cols,
                           j->cols, j->bits, MG_FWD_MLX_GROUP,
                           j->words + first * j->cols / (32 / j->bits), j->scales + first * groups,
                           j->biases + first * groups);
}

/* Tensor `id` generated on the host, quantized there to MLX's affine format with `bits`
 * (model_mlx.h: mg_mlx_quantize, groups of MG_FWD_MLX_GROUP, BF16 scales and biases, rows in
 * parallel) and uploaded as one layer of new device buffers. */
static mg_status upload_mlx_tensor(mg_fwd *m, uint32_t id, uint16_t *host, uint32_t bits,
                                   mg_mlx_linear *out) {
    uint32_t rows, cols;
    mg_status st = generate_tensor(m, id, host, &rows, &cols);
    if (st)
        return st;
    const size_t words_bytes = (size_t)rows * cols / 8 * bits,
                 group_bytes = (size_t)rows * (cols / MG_FWD_MLX_GROUP) * 2;
    uint8_t *packed = malloc(words_bytes + 2 * group_bytes);
    if (!packed)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the MLX weights");
    mlx_job job = {host,
                   cols,
                   bits,
                   (uint32_t *)packed,
                   (uint16_t *)(packed + words_bytes),
                   (uint16_t *)(packed + words_bytes + group_bytes)};
    *out = (mg_mlx_linear){.experts = 1,
                           .n = rows,
                           .k = cols,
                           .bits = bits,
                           .group_size = MG_FWD_MLX_GROUP,
                           .scale_type = MG_DTYPE_BF16};
    if ((st = parallel_ranges(rows, (1u << 20) / cols + 1, mlx_rows, &job)))
        st = mg_error_report(st, "quantizing weights to MLX %u-bit: %s", bits, mg_last_error());
    const void *src[3] = {packed, packed + words_bytes, packed + words_bytes + group_bytes};
    mg_devptr *dst[3] = {&out->weight, &out->scales, &out->biases};
    const size_t bytes[3] = {words_bytes, group_bytes, group_bytes};
    for (int i = 0; !st && i < 3; i++)
        if ((st = mg_alloc(m->b, bytes[i], dst[i])) ||
            (st = mg_copy_h2d(m->b, *dst[i], src[i], bytes[i])))
            st = mg_fwd_lib_fail(st, "uploading MLX weights");
    free(packed);
    if (st)
        mg_mlx_linear_free(m->b, out);
    return st;
}

/* The layer matrices quantized at load (model_mlx.h): every layer's q, kv, o, gate_up and down,
 * into a new mg_fwd_mlx. */
static mg_status create_mlx_matrices(mg_fwd *m, uint16_t *host, mg_fwd_mlx **out) {
    const uint32_t bits = m->c.weights == MG_FWD_WEIGHTS_MLX4 ? 4 : 8;
    const size_t count = (size_t)m->layers * MX_SLOTS;
    mg_mlx_linear *w = calloc(count, sizeof *w);
    if (!w)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
    mg_status st = MG_OK;
    for (size_t i = 0; !st && i < count; i++)
        st = upload_mlx_tensor(m,
                               mg_fwd_layer_tensor((uint32_t)(i / MX_SLOTS),
                                                   mg_fwd_mlx_model_slot((uint32_t)(i % MX_SLOTS))),
                               host, bits, &w[i]);
    if (st) {
        for (size_t i = 0; i < count; i++)
            mg_mlx_linear_free(m->b, &w[i]);
    } else {
        st = mg_fwd_mlx_adopt(m->b, &m->full_sh, m->layers, w, out); /* takes w's buffers */
    }
    free(w);
    return st;
}

/* Device staging for quantizing one tensor at a time: its BF16 copy, codes and scales. */
typedef struct fp4_staging {
    mg_devptr bf16, codes, scales;
} fp4_staging;

/* Global scales per NVFP4 weight: one per expert (1 for a dense weight). */
static size_t global_group(const mg_fwd *m) {
    return m->sh.experts ? m->sh.experts : 1;
}

typedef struct amax_job {
    const uint16_t *x;
    uint32_t cols;
    float *row_amax;
} amax_job;

static mg_status amax_rows(void *ctx, size_t first, size_t count) {
    amax_job *j = ctx;
    for (size_t r = first; r < first + count; r++) {
        float amax = 0.0f;
        for (uint32_t c = 0; c < j->cols; c++) {
            float a = fabsf(mg_bf16_to_f32(j->x[r * j->cols + c]));
            if (isfinite(a) && a > amax)
                amax = a;
        }
        j->row_amax[r] = amax;
    }
    return MG_OK;
}

/* mg_nvfp4_global_scale(x, rows, cols, 0), the rows' largest finite |x| found over up to 16
 * threads (a maximum: the same value whatever the split). */
static mg_status global_scale(const uint16_t *x, uint32_t rows, uint32_t cols, float *out) {
    float *row_amax = malloc((size_t)rows * sizeof *row_amax);
    if (!row_amax)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
    amax_job job = {x, cols, row_amax};
    mg_status st = parallel_ranges(rows, (1u << 20) / cols + 1, amax_rows, &job);
    float amax = 0.0f;
    for (uint32_t r = 0; r < rows; r++)
        amax = row_amax[r] > amax ? row_amax[r] : amax;
    free(row_amax);
    *out = mg_nvfp4_global_scale_from_amax(amax);
    return st;
}

/* Tensor `id` (a layer matrix or the LM head) generated on the host, uploaded into the staging
 * buffers, quantized with its global scale (model.h), and prepared into `parts` weights (w_gate_up:
 * gate, then up) of `experts` stacked experts each (rows = experts * parts * n: expert e's part
 * p at rows (e * parts + p) * n), whose global scales (global_group(m) of them per part, all the
 * tensor's) are entries global_index.. of m->fp4_globals. Ordered on the default stream, which
 * the next blocking upload into the staging buffers waits for. */
static mg_status quantize_tensor(mg_fwd *m, uint32_t id, uint16_t *host, const fp4_staging *sg,
                                 uint32_t experts, uint32_t parts, mg_nvfp4_weight *out,
                                 size_t global_index) {
    uint32_t rows, cols;
    mg_status st = generate_tensor(m, id, host, &rows, &cols);
    if (st)
        return st;
    size_t group = global_group(m);
    float global = 1.0f;
    if ((st = global_scale(host, rows, cols, &global)))
        return st;
    float *globals = malloc(group * sizeof *globals);
    if (!globals)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
    for (size_t i = 0; i < group; i++)
        globals[i] = global;
    mg_stream *s0 = mg_stream_default(m->b);
    for (uint32_t p = 0; !st && p < parts; p++)
        st = mg_copy_h2d(m->b, m->fp4_globals + 4 * (global_index + p * group), globals,
                         group * sizeof *globals);
    if (st || (st = mg_copy_h2d(m->b, sg->bf16, host, (size_t)rows * cols * 2)) ||
        (st = mg_nvfp4_quantize(m->b, s0, rows, cols, 0, sg->bf16,
                                m->fp4_globals + 4 * global_index, sg->codes, sg->scales)))
        st = mg_fwd_lib_fail(st, "quantizing weights to NVFP4");
    uint32_t n = rows / (experts * parts);
    size_t vb = mg_nvfp4_prepared_value_bytes(n, cols), sb = mg_nvfp4_prepared_scale_bytes(n, cols);
    size_t codes_bytes = mg_nvfp4_packed_bytes(n, cols),
           scale_bytes = mg_nvfp4_scale_bytes(n, cols);
    for (uint32_t p = 0; !st && p < parts; p++) {
        mg_devptr base, g = m->fp4_globals + 4 * (global_index + p * group);
        if ((st = mg_alloc(m->b, experts * (vb + sb), &base))) {
            st = mg_fwd_lib_fail(st, "allocating NVFP4 weights");
            break;
        }
        out[p] =
            (mg_nvfp4_weight){.values = base, .scales = base + experts * vb, .global_scale = g};
        m->weight_bytes += experts * (vb + sb);
        if (m->sh.experts)
            m->expert_bytes += experts * (vb + sb);
        for (uint32_t e = 0; !st && e < experts; e++) {
            uint64_t block = (uint64_t)e * parts + p;
            if ((st = mg_nvfp4_prepare(m->b, s0, n, cols, 1, sg->codes + block * codes_bytes,
                                       sg->scales + block * scale_bytes, out[p].values + e * vb,
                                       out[p].scales + e * sb)))
                st = mg_fwd_lib_fail(st, "preparing NVFP4 weights");
        }
    }
    free(globals);
    return st;
}

/* The layer matrices and the LM head in NVFP4 (model.h): staging sized for the largest, one
 * tensor at a time. */
static mg_status create_nvfp4_matrices(mg_fwd *m, uint16_t *host, size_t largest_matrix) {
    size_t count = (size_t)m->layers * FP4_SLOTS, group = global_group(m);
    uint32_t experts = m->sh.experts ? m->sh.experts : 1;
    m->fp4 = calloc(count, sizeof *m->fp4);
    if (!m->fp4)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
    fp4_staging sg = {0};
    mg_status st = mg_alloc(m->b, 4 * (count + 1) * group, &m->fp4_globals);
    if (!st)
        m->weight_bytes += 4 * (count + 1) * group;
    if (!st)
        st = mg_alloc(m->b, largest_matrix * 2, &sg.bf16);
    if (!st)
        st = mg_alloc(m->b, largest_matrix / 2, &sg.codes);
    if (!st)
        st = mg_alloc(m->b, largest_matrix / MG_NVFP4_BLOCK, &sg.scales);
    if (st)
        st = mg_fwd_lib_fail(st, "allocating the NVFP4 staging buffers");
    static const struct {
        uint32_t slot, fp4, parts;
        bool expert; /* one per expert in a MoE model */
    } matrices[] = {{MG_FWD_WQ, FP4_Q, 1, false},
                    {MG_FWD_WKV, FP4_KV, 1, false},
                    {MG_FWD_WO, FP4_O, 1, false},
                    {MG_FWD_W_GATE_UP, FP4_GATE, 2, true},
                    {MG_FWD_W_DOWN, FP4_DOWN, 1, true}};
    for (uint32_t l = 0; !st && l < m->layers; l++)
        for (size_t i = 0; !st && i < sizeof matrices / sizeof matrices[0]; i++) {
            size_t at = (size_t)l * FP4_SLOTS + matrices[i].fp4;
            st = quantize_tensor(m, mg_fwd_layer_tensor(l, matrices[i].slot), host, &sg,
                                 matrices[i].expert ? experts : 1, matrices[i].parts, m->fp4 + at,
                                 at * group);
        }
    if (!st)
        st = quantize_tensor(m, MG_FWD_TENSOR_LM_HEAD, host, &sg, 1, 1, &m->lm_head_fp4,
                             count * group);
    /* the staging buffers are freed only after the queued quantize and prepare calls ran */
    mg_status sync = mg_stream_synchronize(mg_stream_default(m->b));
    if (!st && sync)
        st = mg_fwd_lib_fail(sync, "quantizing weights to NVFP4");
    mg_devptr staging[] = {sg.bf16, sg.codes, sg.scales};
    for (size_t i = 0; i < 3; i++)
        if (staging[i])
            mg_free(m->b, staging[i]);
    return st;
}

bool mg_fwd_is_quantized_matrix(uint32_t slot) {
    return slot == MG_FWD_WQ || slot == MG_FWD_WKV || slot == MG_FWD_WO ||
           slot == MG_FWD_W_GATE_UP || slot == MG_FWD_W_DOWN;
}

mg_status mg_fwd_join_qkv(mg_fwd *m) {
    const mg_model_shape *sh = &m->sh;
    /* FP8: codes of one byte, each matrix's allocation holding its row scales after the codes
     * (upload_fp8_tensor); the joined one holds q's codes, kv's, then q's scales, kv's */
    const bool fp8 = m->fp8_scales != NULL;
    const size_t q_rows = (size_t)sh->heads * sh->head_dim,
                 kv_rows = (size_t)2 * sh->kv_heads * sh->head_dim;
    const size_t q_bytes = q_rows * sh->hidden * (fp8 ? 1 : 2),
                 kv_bytes = kv_rows * sh->hidden * (fp8 ? 1 : 2);
    const size_t codes_bytes = fp8 ? (q_bytes + kv_bytes + 15) & ~(size_t)15 : q_bytes + kv_bytes;
    const size_t bytes = codes_bytes + (fp8 ? 4 * (q_rows + kv_rows) : 0);
    for (uint32_t l = 0; l < m->layers; l++) {
        mg_devptr *w = &m->layer_w[(size_t)l * MG_FWD_LAYER_TENSORS];
        mg_devptr *scales = fp8 ? &m->fp8_scales[(size_t)l * MG_FWD_LAYER_TENSORS] : NULL;
        mg_devptr joined = 0;
        mg_status st = mg_alloc(m->b, bytes, &joined);
        if (st)
            return mg_fwd_lib_fail(st, "allocating the joined q and kv matrices");
        if ((st = mg_copy_d2d(m->b, joined, w[MG_FWD_WQ], q_bytes)) ||
            (st = mg_copy_d2d(m->b, joined + q_bytes, w[MG_FWD_WKV], kv_bytes)) ||
            (fp8 &&
             ((st = mg_copy_d2d(m->b, joined + codes_bytes, scales[MG_FWD_WQ], 4 * q_rows)) ||
              (st = mg_copy_d2d(m->b, joined + codes_bytes + 4 * q_rows, scales[MG_FWD_WKV],
                                4 * kv_rows))))) {
            mg_free(m->b, joined);
            return mg_fwd_lib_fail(st, "joining the q and kv matrices");
        }
        /* Until every layer is joined a joined layer's kv slot is 0, so that mg_fwd_destroy
         * frees each allocation once whichever layer failed. */
        mg_free(m->b, w[MG_FWD_WQ]);
        mg_free(m->b, w[MG_FWD_WKV]);
        w[MG_FWD_WQ] = joined;
        w[MG_FWD_WKV] = 0;
        if (fp8) {
            scales[MG_FWD_WQ] = joined + codes_bytes;
            scales[MG_FWD_WKV] = 0;
        }
    }
    for (uint32_t l = 0; l < m->layers; l++) {
        mg_devptr *w = &m->layer_w[(size_t)l * MG_FWD_LAYER_TENSORS];
        w[MG_FWD_WKV] = w[MG_FWD_WQ] + q_bytes;
        if (fp8) {
            mg_devptr *scales = &m->fp8_scales[(size_t)l * MG_FWD_LAYER_TENSORS];
            scales[MG_FWD_WKV] = scales[MG_FWD_WQ] + 4 * q_rows;
        }
    }
    m->qkv_joined = true;
    return MG_OK;
}

mg_status mg_fwd_create_weights(mg_fwd *m) {
    const mg_model_shape *s = &m->full_sh;
    size_t largest = (size_t)s->vocab * s->hidden;
    size_t matrix = (size_t)(s->experts ? s->experts : 1) * 2 * s->intermediate * s->hidden;
    size_t q = (size_t)s->heads * s->head_dim * s->hidden;
    if (q > matrix)
        matrix = q;
    if (matrix > largest)
        largest = matrix;
    bool fp4 = m->c.weights == MG_FWD_WEIGHTS_NVFP4, fp8 = m->c.weights == MG_FWD_WEIGHTS_FP8;
    bool mlx = m->c.weights == MG_FWD_WEIGHTS_MLX8 || m->c.weights == MG_FWD_WEIGHTS_MLX4;
    if (m->ckpt) {
        m->layer_w = calloc((size_t)m->layers * MG_FWD_LAYER_TENSORS, sizeof *m->layer_w);
        m->layer_extra = calloc((size_t)m->layers * MG_FWD_EXTRA_TENSORS, sizeof *m->layer_extra);
        if (!m->layer_w || !m->layer_extra)
            return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
        mg_fwd_checkpoint_weights gw;
        mg_status st =
            mg_fwd_checkpoint_load(m->b, m->ckpt, &m->arch, m->layer_w, m->layer_extra, &gw);
        m->embedding = gw.embedding; /* what was loaded, freed with the model on failure */
        m->final_norm = gw.final_norm;
        m->lm_head = gw.lm_head;
        m->mlx = gw.mlx;
        m->fp4 = gw.fp4; /* an NVFP4 directory's matrices (model_hf_nvfp4.h) */
        m->lm_head_fp4 = gw.lm_head_fp4;
        m->weight_bytes = gw.bytes;
        return st;
    }
    uint16_t *host = malloc(largest * 2);
    m->layer_w = calloc((size_t)m->layers * MG_FWD_LAYER_TENSORS, sizeof *m->layer_w);
    if (fp8)
        m->fp8_scales = calloc((size_t)m->layers * MG_FWD_LAYER_TENSORS, sizeof *m->fp8_scales);
    if (!host || !m->layer_w || (fp8 && !m->fp8_scales)) {
        free(host);
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
    }
    mg_status st = upload_tensor(m, MG_FWD_TENSOR_EMBEDDING, host, &m->embedding);
    if (!st)
        st = upload_tensor(m, MG_FWD_TENSOR_FINAL_NORM, host, &m->final_norm);
    if (!st && fp8)
        st = upload_fp8_tensor(m, MG_FWD_TENSOR_LM_HEAD, host, &m->lm_head, &m->lm_head_scales);
    else if (!st && !fp4)
        st = upload_tensor(m, MG_FWD_TENSOR_LM_HEAD, host, &m->lm_head);
    for (uint32_t l = 0; !st && l < m->layers; l++)
        for (uint32_t slot = 0; !st && slot < MG_FWD_LAYER_TENSORS; slot++) {
            uint32_t id = mg_fwd_layer_tensor(l, slot);
            /* the experts' BF16 or FP8 matrices count as expert bytes (the NVFP4 ones are
             * counted where they are quantized) */
            bool expert_matrix = s->experts && (slot == MG_FWD_W_GATE_UP || slot == MG_FWD_W_DOWN);
            uint64_t before = m->weight_bytes;
            if (fp8 && mg_fwd_is_quantized_matrix(slot)) /* the same matrices as NVFP4's */
                st = upload_fp8_tensor(m, id, host, layer_tensor(m, l, slot),
                                       &m->fp8_scales[(size_t)l * MG_FWD_LAYER_TENSORS + slot]);
            else if ((!(fp4 || mlx) || !mg_fwd_is_quantized_matrix(slot)) &&
                     (slot != MG_FWD_ROUTER || s->experts))
                st = upload_tensor(m, id, host, layer_tensor(m, l, slot));
            if (expert_matrix && !fp4)
                m->expert_bytes += m->weight_bytes - before;
        }
    if (!st && fp4)
        st = create_nvfp4_matrices(m, host, largest);
    if (!st && mlx) {
        char buf[1024];
        mg_fwd_mlx *x = NULL; /* NULL: the checkpoint's, loaded by attach */
        if (!mg_fwd_mlx_checkpoint(&m->c, buf, sizeof buf))
            st = create_mlx_matrices(m, host, &x);
        if (!st)
            st = mg_fwd_mlx_attach(m->b, &m->c, x, m->layer_w, &m->mlx, &m->weight_bytes);
    }
    free(host);
    return st;
}
