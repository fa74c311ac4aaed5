/* nvfp4_gemm.c - the NVFP4 GEMM ops (metrale/ops_nvfp4.h): every argument checked once, then
 * our kernels of module "metrale" launched by name, the same on every backend (CUDA:
 * kernels/cuda/nvfp4/nvfp4_gemm.cu; CPU: nvfp4_gemm_reference.c). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend_impl.h"
#include "checked_math.h"
#include "cpu_isa.h"
#include "error.h"
#include "metrale/launch.h"
#include "metrale/ops.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_nvfp4.h"
#include "nvfp4_blackwell.h"
#include "nvfp4_gemm_reference.h"
#include "nvfp4_hopper_layout.h"
#include "op_builtin.h"

/* Warps the small-tile GEMM grid aims at per multiprocessor: enough 16-byte loads in flight to
 * cover the memory latency at decode sizes, where there are few row blocks.
 * METRALE_NVFP4_WARPS_PER_SM overrides it; METRALE_NVFP4_TILE=8 or 16 keeps the small-tile
 * family with at most that tile at any M, 32 or 64 sets the tile family's tile above
 * SMALL_TILE_MAX_ROWS rows per group (tuning knobs for benchmarks). */
#define TARGET_WARPS_PER_SM 16u
/* The most rows per group the small-tile family takes (measured on the H200, bench/results/). */
#define SMALL_TILE_MAX_ROWS 16u
/* Warps per multiprocessor the tile family's K groups aim at. METRALE_NVFP4_TILE_SHAPE="R,G"
 * forces R output rows per CTA and G K groups where such a kernel exists (a tuning knob). */
#define TILE_WARPS_PER_SM 4u
/* The most row blocks a grid's second dimension holds. */
#define MAX_ROW_BLOCKS 65535u

/* ------------------------------------------------------------------ sizes */

static bool shape_ok(uint32_t n, uint32_t k) {
    return n && k && k % 16 == 0;
}

size_t mg_nvfp4_prepared_value_bytes(uint32_t n, uint32_t k) {
    if (!shape_ok(n, k))
        return 0;
    return (size_t)mg_nvfp4_row_blocks(n) * mg_nvfp4_supers(k) * MG_NVFP4_SUPER_BYTES;
}

size_t mg_nvfp4_prepared_scale_bytes(uint32_t n, uint32_t k) {
    if (!shape_ok(n, k))
        return 0;
    return (size_t)mg_nvfp4_row_blocks(n) * mg_nvfp4_supers(k) * MG_NVFP4_SUPER_SCALE_BYTES;
}

/* ------------------------------------------------------------------ argument checks */

static mg_status check_shape(const char *fn, uint32_t n, uint32_t k) {
    if (!n || !k)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty shape n=%u k=%u", fn, n, k);
    if (k % 16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: k=%u is not a multiple of 16 (one E4M3 scale per 16 values)", fn, k);
    if (mg_nvfp4_row_blocks(n) > MAX_ROW_BLOCKS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: n=%u exceeds %u rows", fn, n,
                        MAX_ROW_BLOCKS * MG_NVFP4_BLOCK_ROWS);
    return MG_OK;
}

/* ------------------------------------------------------------------ providers */

/* Whether mg_nvfp4_prepare lays a weight of n x k out for Blackwell on `b`. */
static bool blackwell_layout(mg_backend *b, uint32_t n, uint32_t k) {
#ifdef METRALE_HAVE_CUDA
    return mg_nvfp4_blackwell_layout(b, n, k);
#else
    (void)b, (void)n, (void)k;
    return false;
#endif
}

static mg_status launch_kernel(mg_backend *b, mg_stream *s, const char *name, mg_launch *l) {
    return mg_op_launch_kernels(b, s, &name, l, 1);
}

static mg_status run_tiled(mg_backend *b, mg_stream *s, const mg_nvfp4_gemm_problem *p);
static mg_status launch_gemm(mg_backend *b, mg_stream *s, const mg_nvfp4_gemm_problem *p,
                             const char *name, mg_dim3 grid, mg_dim3 block, uint32_t shared);
static mg_status run_dequant_gemm(mg_backend *b, mg_stream *s, const mg_nvfp4_gemm_problem *p);
static bool dequant_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes);
static bool kernels_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes);

/* Our tiled kernels: every call, on every backend that ships them; a fusion (the small-tile
 * family's fused kernels) where the backend ships that kernel. */
static const mg_nvfp4_provider kernels_provider = {
    .base = MG_OP_KERNELS_PROVIDER_SUPPORTS(mg_nvfp4_cpu_kernels_register, kernels_supports,
                                            MG_NVFP4_KERNEL_PREPARE),
    .run = run_tiled,
};

/* The large-M dense provider: the weight expanded to BF16 in the caller's workspace, then the
 * BF16 GEMM (cuBLASLt). Measured on the H200 (bench/results/): decoding in every tile costs
 * more than one expansion from about 128 rows. */
static bool dequant_available(mg_backend *b, char *reason, size_t reason_bytes) {
    if (!mg_op_supported(b, MG_OP_GEMM_BF16)) {
        snprintf(reason, reason_bytes, "no BF16 GEMM on this backend");
        return false;
    }
    return true;
}

static const mg_nvfp4_provider dequant_provider = {
    .base = {.name = "dequant_bf16_gemm",
             .backend = MG_BACKEND_CUDA,
             .available = dequant_available,
             .supports = dequant_supports,
             .kernels = MG_OP_KERNEL_NAMES(MG_NVFP4_KERNEL_DEQUANT_BF16)},
    .caller_workspace = true,
    .run = run_dequant_gemm,
};

/* The CPU backend's fast kernel (nvfp4_gemm_cpu_fast.c): every problem, where the CPU has
 * AVX2; within the bound nvfp4_gemm_reference.h states of the reference ("kernels", forcible
 * by name). */
static bool cpu_avx2_available(mg_backend *b, char *reason, size_t reason_bytes) {
    (void)b;
    if (!mg_nvfp4_cpu_avx2_built()) {
        snprintf(reason, reason_bytes, "built for a CPU without AVX2");
        return false;
    }
    return mg_cpu_avx2_available(reason, reason_bytes);
}

static bool cpu_avx2_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes);

static mg_status run_cpu_avx2(mg_backend *b, mg_stream *s, const mg_nvfp4_gemm_problem *p) {
    return launch_gemm(b, s, p, MG_NVFP4_KERNEL_GEMM_AVX2, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1},
                       0);
}

static const mg_nvfp4_provider cpu_avx2_provider = {
    .base = {.name = "cpu_avx2",
             .backend = MG_BACKEND_CPU,
             .available = cpu_avx2_available,
             .supports = cpu_avx2_supports,
             .register_cpu_kernels = mg_nvfp4_cpu_fast_kernels_register},
    .run = run_cpu_avx2,
};

/* On Blackwell (nvfp4_blackwell.h) the native FP4 provider comes first: it takes every call
 * whose weight mg_nvfp4_prepare laid out for it. */
static const mg_op_provider *const dense_providers[] = {
#ifdef METRALE_HAVE_CUDA
    &mg_nvfp4_blackwell_provider.base,
#endif
    &dequant_provider.base, &cpu_avx2_provider.base, &kernels_provider.base, NULL};
static const mg_op_provider *const moe_providers[] = {
#ifdef METRALE_HAVE_CUDA
    &mg_nvfp4_blackwell_provider.base,
#endif
    &cpu_avx2_provider.base, &kernels_provider.base, NULL};

const mg_op_def mg_nvfp4_gemm_op = {MG_OP_NVFP4_GEMM, "nvfp4_gemm", dense_providers};
const mg_op_def mg_nvfp4_moe_gemm_op = {MG_OP_NVFP4_MOE_GEMM, "nvfp4_moe_gemm", moe_providers};

/* ------------------------------------------------------------------ the re-layout */

mg_status mg_nvfp4_prepare(mg_backend *b, mg_stream *s, uint32_t n, uint32_t k, uint32_t experts,
                           mg_devptr codes, mg_devptr scales, mg_devptr prepared_values,
                           mg_devptr prepared_scales) {
    static const char fn[] = "mg_nvfp4_prepare";
    mg_status st;
    if ((st = mg_op_enter(b, fn)) || (st = check_shape(fn, n, k)))
        return st;
    if (!experts)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: experts must be >= 1", fn);
    uint64_t rows = (uint64_t)experts * n;
    mg_op_tensor spans[4] = {
        {"prepared_values", prepared_values, 0, 16, true},
        {"prepared_scales", prepared_scales, 0, 16, true},
        {"codes", codes, 0, 1, false},
        {"scales", scales, 0, 1, false},
    };
    if (!mg_mul_size(mg_nvfp4_prepared_value_bytes(n, k), experts, &spans[0].bytes) ||
        !mg_mul_size(mg_nvfp4_prepared_scale_bytes(n, k), experts, &spans[1].bytes) ||
        !mg_mul_size(rows, k / 2, &spans[2].bytes) || !mg_mul_size(rows, k / 16, &spans[3].bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %u experts of %u x %u overflow", fn, experts,
                        n, k);
    if ((st = mg_op_check_tensors(b, fn, spans, 4, -1, -1)))
        return st;
#ifdef METRALE_HAVE_CUDA
    /* The layout follows the device, not a provider choice: the GEMMs' providers then agree. */
    if (mg_nvfp4_blackwell_layout(b, n, k)) {
        if ((st = mg_nvfp4_blackwell_prepare(b, s, fn, n, k, experts, codes, scales,
                                             prepared_values, prepared_scales)))
            return st;
        mg_op_count_call(b, MG_OP_NVFP4_GEMM, &mg_nvfp4_blackwell_provider.base, false);
        return MG_OK;
    }
#endif
    const mg_op_provider *provider;
    if ((st = mg_op_choose(b, MG_OP_NVFP4_GEMM, NULL, fn, &provider)))
        return st;
    uint64_t words = spans[0].bytes / 4, blocks = (words + 255) / 256;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){(uint32_t)(blocks < 65535 ? blocks : 65535), 1, 1},
                   (mg_dim3){256, 1, 1}, 0);
    mg_launch_arg_ptr(&l, codes);
    mg_launch_arg_ptr(&l, scales);
    mg_launch_arg_ptr(&l, prepared_values);
    mg_launch_arg_ptr(&l, prepared_scales);
    mg_launch_arg_u32(&l, n);
    mg_launch_arg_u32(&l, k);
    mg_launch_arg_u32(&l, experts);
    if ((st = launch_kernel(b, s, MG_NVFP4_KERNEL_PREPARE, &l)))
        return st;
    mg_op_count_call(b, MG_OP_NVFP4_GEMM, provider, false);
    return MG_OK;
}

/* ------------------------------------------------------------------ the GEMMs */

typedef mg_nvfp4_gemm_problem gemm_problem;

/* The fused kernel a problem needs (mg_nvfp4_gemm_fused): gate_up's own SiLU-mul is not one. */
static mg_nvfp4_kernel_fusion kernel_fusion(const gemm_problem *p) {
    return p->fusion.prologue == MG_GEMM_PROLOGUE_RMSNORM        ? MG_NVFP4_KERNEL_NORM
           : p->fusion.epilogue == MG_GEMM_EPILOGUE_RESIDUAL_ADD ? MG_NVFP4_KERNEL_ADD
                                                                 : MG_NVFP4_KERNEL_PLAIN;
}

size_t mg_nvfp4_gemm_workspace_bytes(uint32_t m, uint32_t n, uint32_t k) {
    if (m < MG_NVFP4_BF16_PATH_MIN_M || !shape_ok(n, k))
        return 0;
    return (size_t)n * k * 2;
}

static bool dequant_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    (void)b;
    const gemm_problem *p = call;
    if (!p || p->op != MG_OP_NVFP4_GEMM || p->up || kernel_fusion(p) != MG_NVFP4_KERNEL_PLAIN ||
        p->rows < MG_NVFP4_BF16_PATH_MIN_M || p->act_pitch != p->k || !p->workspace ||
        p->workspace_bytes < mg_nvfp4_gemm_workspace_bytes(p->rows, p->n, p->k)) {
        snprintf(reason, reason_bytes,
                 "needs m >= %u, act_pitch == k, no up weight, no fusion and a workspace of n * k "
                 "* 2 bytes",
                 MG_NVFP4_BF16_PATH_MIN_M);
        return false;
    }
    return true;
}

static mg_status run_dequant_gemm(mg_backend *b, mg_stream *s, const gemm_problem *p) {
    mg_launch l;
    /* A block per row, a thread per 16-element block. */
    mg_launch_init(&l, (mg_dim3){p->n < 65535 ? p->n : 65535, 1, 1}, (mg_dim3){256, 1, 1}, 0);
    mg_launch_arg_ptr(&l, p->w.values);
    mg_launch_arg_ptr(&l, p->w.scales);
    mg_launch_arg_ptr(&l, p->w.global_scale);
    mg_launch_arg_ptr(&l, p->workspace);
    mg_launch_arg_u32(&l, p->n);
    mg_launch_arg_u32(&l, p->k);
    mg_status st = launch_kernel(b, s, MG_NVFP4_KERNEL_DEQUANT_BF16, &l);
    return st ? st
              : mg_gemm_bf16(b, s, p->rows, p->n, p->k, p->act, p->workspace, p->out, MG_DTYPE_BF16,
                             p->ldc);
}

static mg_status check_problem(mg_backend *b, const gemm_problem *p) {
    mg_status st = check_shape(p->fn, p->n, p->k);
    if (st)
        return st;
    if (!p->rows || !p->experts || !p->act_rows)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: rows=%u experts=%u act_rows=%u must be >= 1",
                        p->fn, p->rows, p->experts, p->act_rows);
    if (p->act_pitch < p->k || p->act_pitch % 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: act_pitch=%u must be >= k=%u and a multiple of 8 (16-byte rows)",
                        p->fn, p->act_pitch, p->k);
    if (p->ldc < p->n)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: ldc=%u is less than n=%u", p->fn, p->ldc,
                        p->n);
    size_t vb = mg_nvfp4_prepared_value_bytes(p->n, p->k);
    size_t sb = mg_nvfp4_prepared_scale_bytes(p->n, p->k);
    mg_op_tensor s[14];
    int count = 0;
    s[count++] = (mg_op_tensor){"out", p->out, 0, 2, true};
    if (!mg_matrix_span_bytes(p->rows, p->n, p->ldc, 2, &s[0].bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: out spans more than the address space",
                        p->fn);
    s[count] = (mg_op_tensor){"act", p->act, 0, 16, false};
    if (!mg_matrix_span_bytes(p->act_rows, p->k, p->act_pitch, 2, &s[count++].bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: act spans more than the address space",
                        p->fn);
    const mg_nvfp4_weight *weights[2] = {&p->w, p->up};
    static const char *const names[2][3] = {{"w.values", "w.scales", "w.global_scale"},
                                            {"up->values", "up->scales", "up->global_scale"}};
    for (int i = 0; i < 2 && weights[i]; i++) {
        s[count++] = (mg_op_tensor){names[i][0], weights[i]->values, vb * p->experts, 16, false};
        s[count++] = (mg_op_tensor){names[i][1], weights[i]->scales, sb * p->experts, 16, false};
        s[count++] =
            (mg_op_tensor){names[i][2], weights[i]->global_scale, (size_t)p->experts * 4, 4, false};
    }
    if (p->norm_weight)
        s[count++] =
            (mg_op_tensor){"fusion norm_weight", p->norm_weight, (size_t)p->k * 2, 16, MG_OP_IN};
    /* a residual that is exactly out is out's range; another one is read only */
    if (p->residual && p->residual != p->out)
        s[count++] = (mg_op_tensor){"fusion residual", p->residual, s[0].bytes, 2, MG_OP_IN};
    if (p->workspace && p->workspace_bytes)
        s[count++] = (mg_op_tensor){"workspace", p->workspace, p->workspace_bytes, 16, true};
    if (p->op == MG_OP_NVFP4_MOE_GEMM) {
        s[count++] =
            (mg_op_tensor){"expert_offsets", p->offsets, ((size_t)p->experts + 1) * 4, 4, false};
        if (p->token_ids)
            s[count++] =
                (mg_op_tensor){"sorted_token_ids", p->token_ids, (size_t)p->rows * 4, 4, false};
    }
    /* out and the workspace are written: neither may overlap anything. */
    return mg_op_check_tensors(b, p->fn, s, count, -1, -1);
}

/* The tuning knobs, read from the environment once per process (not on every call). */
static pthread_once_t tuning_once = PTHREAD_ONCE_INIT;
static uint32_t tuning_tile, tuning_target_warps, tuning_rows, tuning_groups;

static void read_tuning(void) {
    const char *w = getenv("METRALE_NVFP4_WARPS_PER_SM"), *t = getenv("METRALE_NVFP4_TILE");
    const char *shape = getenv("METRALE_NVFP4_TILE_SHAPE");
    int tile = t ? atoi(t) : 0;
    tuning_tile = tile == 8 || tile == 16 || tile == 32 || tile == 64 ? (uint32_t)tile : 0;
    tuning_target_warps = w && atoi(w) > 0 ? (uint32_t)atoi(w) : TARGET_WARPS_PER_SM;
    unsigned rows = 0, groups = 0;
    if (shape && sscanf(shape, "%u,%u", &rows, &groups) == 2)
        tuning_rows = rows, tuning_groups = groups;
}

/* A launch of the kernels provider: the kernel, its grid and block. */
typedef struct gemm_variant {
    char name[48];
    uint32_t tiles, row_tiles, threads, shared_bytes;
} gemm_variant;

/* The device's multiprocessors (132 where it does not say) and the most shared memory a block
 * may use (0: it does not say). */
static uint32_t multiprocessors(mg_backend *b, uint32_t *max_shared) {
    mg_device_info info;
    mg_error_state saved;
    mg_error_save(&saved);
    bool known = mg_device_get_info(b, &info) == MG_OK;
    uint32_t sms = known && info.multiprocessors > 0 ? (uint32_t)info.multiprocessors : 132;
    *max_shared = known ? info.max_shared_per_block_optin : 0;
    mg_error_restore(&saved);
    return sms;
}

static uint64_t row_tiles(uint32_t n, uint32_t rows_per_cta) {
    return ((uint64_t)n + rows_per_cta - 1) / rows_per_cta;
}

/* Token tiles of `tile` tokens a problem needs (grouped: a bound on the non-empty tiles of any
 * routing) into *out; refused past a grid's first dimension. */
static mg_status token_tiles(const gemm_problem *p, uint32_t tile, uint64_t *out) {
    *out = p->op == MG_OP_NVFP4_MOE_GEMM
               ? p->rows / tile + (p->experts < p->rows ? p->experts : p->rows)
               : ((uint64_t)p->rows + tile - 1) / tile;
    if (*out > 0x7fffffffu)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %u rows need more token tiles than a grid has", p->fn, p->rows);
    return MG_OK;
}

/* The tile family's variant: 4 row warps (128 output rows, 64 gate_up: each CTA reads its
 * tile's activations once for that many rows), split in two K groups when the grid has fewer
 * than TILE_WARPS_PER_SM warps per multiprocessor; or the shape METRALE_NVFP4_TILE_SHAPE forces. */
static void choose_tile_shape(const gemm_problem *p, uint32_t tile, uint64_t tiles, uint32_t sms,
                              gemm_variant *v) {
    const bool gate_up = p->up != NULL;
    const uint32_t warp_rows = gate_up ? 16 : 32;
    uint32_t wr = 4, kw = 1;
    if (tuning_rows % warp_rows == 0 &&
        mg_nvfp4_tile_variant_exists(tile, tuning_rows / warp_rows, tuning_groups)) {
        wr = tuning_rows / warp_rows, kw = tuning_groups;
    } else if (tiles * row_tiles(p->n, wr * warp_rows) * wr < (uint64_t)TILE_WARPS_PER_SM * sms &&
               mg_nvfp4_supers(p->k) >= 4) {
        kw = 2;
    }
    v->tiles = (uint32_t)tiles;
    v->row_tiles = (uint32_t)row_tiles(p->n, wr * warp_rows);
    v->threads = 32 * wr * kw;
    v->shared_bytes = MG_NVFP4_TILE_SHARED_BYTES(tile, kw);
    mg_nvfp4_gemm_tile_kernel_name(v->name, sizeof v->name, tile, wr * warp_rows, kw, gate_up);
}

/* The variant for a problem. The tile family (each weight decoded once per 32 or 64 tokens)
 * above SMALL_TILE_MAX_ROWS rows per group where its grid of 128-row CTAs covers at least 3/4
 * of the multiprocessors (measured on the H200, bench/results/2026-12-04-h200-nvfp4-tile.md:
 * 1.5x the small-tile family on 64 x 14336 x 4096, 2x on grouped problems of 64 rows per
 * expert, but half its speed where N is 4096-6144 and the grid is a few dozen CTAs). Otherwise
 * the small-tile family, with 8 tokens per tile when groups are mostly that small, and the
 * warps splitting K so the grid has about TARGET_WARPS_PER_SM warps per multiprocessor, each
 * with at least two super-chunks of K. */
static mg_status choose_variant(mg_backend *b, const gemm_problem *p, gemm_variant *v) {
    pthread_once(&tuning_once, read_tuning);
    const bool grouped = p->op == MG_OP_NVFP4_MOE_GEMM, gate_up = p->up != NULL;
    const uint32_t per_group = grouped ? (p->rows + p->experts - 1) / p->experts : p->rows;
    uint32_t max_shared;
    const uint32_t sms = multiprocessors(b, &max_shared), row_blocks = mg_nvfp4_row_blocks(p->n);
    const bool small_forced = tuning_tile == 8 || tuning_tile == 16;
    if (per_group > SMALL_TILE_MAX_ROWS && !small_forced) {
        const uint32_t tile = tuning_tile ? tuning_tile : per_group <= 32 ? 32 : 64;
        uint64_t tiles;
        mg_status st = token_tiles(p, tile, &tiles);
        if (st)
            return st;
        if (tuning_tile || tiles * row_tiles(p->n, gate_up ? 64 : 128) * 4 >= (uint64_t)sms * 3) {
            choose_tile_shape(p, tile, tiles, sms, v);
            /* a device whose blocks cannot have the tile's shared memory (Metal's 32 KiB
             * threadgroups) takes the small-tile family */
            if (!max_shared || v->shared_bytes <= max_shared)
                return MG_OK;
        }
    }
    const uint32_t tile = per_group <= 8 || tuning_tile == 8 ? 8 : 16;
    uint64_t tiles;
    mg_status st = token_tiles(p, tile, &tiles);
    if (st)
        return st;
    uint64_t rbs = (uint64_t)row_blocks * (gate_up ? 2u : 1u);
    uint32_t supers = mg_nvfp4_supers(p->k), max_warps = gate_up ? 4 : 8, k_warps = 1;
    while (k_warps < max_warps &&
           tiles * rbs * k_warps * 2 <= (uint64_t)sms * tuning_target_warps &&
           supers >= k_warps * 4)
        k_warps *= 2;
    v->tiles = (uint32_t)tiles;
    v->row_tiles = row_blocks;
    v->threads = 32 * k_warps * (gate_up ? 2 : 1);
    /* the RMSNorm prologue's normed rows (a dense call of up to one tile: every row) */
    v->shared_bytes = kernel_fusion(p) == MG_NVFP4_KERNEL_NORM
                          ? (uint32_t)mg_nvfp4_normed_bytes(p->rows < tile ? p->rows : tile, p->k)
                          : 0;
    mg_nvfp4_gemm_kernel_name(v->name, sizeof v->name, tile, k_warps, gate_up, kernel_fusion(p));
    return MG_OK;
}

static mg_status run_problem(mg_backend *b, mg_stream *s, const gemm_problem *p) {
    mg_status st;
    const mg_op_provider *chosen;
    if ((st = check_problem(b, p)) || (st = mg_op_choose(b, p->op, p, p->fn, &chosen)))
        return st;
    const mg_nvfp4_provider *provider = (const mg_nvfp4_provider *)chosen;
    if (!provider->blackwell_layout && blackwell_layout(b, p->n, p->k))
        return MG_ERROR(
            MG_ERR_UNSUPPORTED,
            "%s: the weight is in the Blackwell layout, whose GEMM needs ldc a multiple "
            "of 8 (ldc=%u)",
            p->fn, p->ldc);
    if ((st = provider->run(b, s, p)))
        return st;
    mg_op_count_call(b, p->op, chosen, provider->caller_workspace);
    return MG_OK;
}

/* One launch of GEMM kernel `name` (nvfp4_gemm_reference.h's argument list). */
static mg_status launch_gemm(mg_backend *b, mg_stream *s, const gemm_problem *p, const char *name,
                             mg_dim3 grid, mg_dim3 block, uint32_t shared) {
    mg_launch l;
    mg_launch_init(&l, grid, block, shared);
    mg_launch_arg_ptr(&l, p->act);
    mg_launch_arg_u32(&l, p->act_pitch);
    mg_launch_arg_u32(&l, p->act_rows);
    mg_launch_arg_ptr(&l, p->token_ids);
    mg_launch_arg_ptr(&l, p->offsets);
    mg_launch_arg_u32(&l, p->experts);
    mg_launch_arg_u32(&l, p->rows);
    mg_launch_arg_ptr(&l, p->w.values);
    mg_launch_arg_ptr(&l, p->w.scales);
    mg_launch_arg_u64(&l, mg_nvfp4_prepared_value_bytes(p->n, p->k));
    mg_launch_arg_u64(&l, mg_nvfp4_prepared_scale_bytes(p->n, p->k));
    mg_launch_arg_ptr(&l, p->w.global_scale);
    mg_launch_arg_ptr(&l, p->up ? p->up->values : 0);
    mg_launch_arg_ptr(&l, p->up ? p->up->scales : 0);
    mg_launch_arg_ptr(&l, p->up ? p->up->global_scale : 0);
    mg_launch_arg_ptr(&l, p->out);
    mg_launch_arg_u32(&l, p->ldc);
    mg_launch_arg_u32(&l, p->n);
    mg_launch_arg_u32(&l, p->k);
    if (kernel_fusion(p) != MG_NVFP4_KERNEL_PLAIN) {
        mg_launch_arg_ptr(&l, p->norm_weight);
        mg_launch_arg_ptr(&l, p->residual);
        mg_launch_arg_f32(&l, p->fusion.eps);
    }
    return launch_kernel(b, s, name, &l);
}

/* A fusion runs in the small-tile family's fused kernels: a dense problem of up to
 * SMALL_TILE_MAX_ROWS rows in our Hopper layout, on a backend that ships the variant's kernel
 * (the CPU's reference kernels; CUDA's; not Metal's). */
static bool fusion_fits(const gemm_problem *p, char *reason, size_t reason_bytes) {
    if (kernel_fusion(p) != MG_NVFP4_KERNEL_PLAIN &&
        (p->op != MG_OP_NVFP4_GEMM || p->rows > SMALL_TILE_MAX_ROWS)) {
        snprintf(reason, reason_bytes, "runs fusions for dense calls of up to %u rows",
                 SMALL_TILE_MAX_ROWS);
        return false;
    }
    return true;
}

/* The same rule on the CPU's fast kernel, so that a fusion runs wherever the CPU runs it. */
static bool cpu_avx2_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    (void)b;
    return !call || fusion_fits(call, reason, reason_bytes);
}

static bool kernels_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    const gemm_problem *p = call;
    if (!p || kernel_fusion(p) == MG_NVFP4_KERNEL_PLAIN)
        return true;
    if (!fusion_fits(p, reason, reason_bytes))
        return false;
    if (blackwell_layout(b, p->n, p->k)) {
        snprintf(reason, reason_bytes, "runs no fusion on a weight in the Blackwell layout");
        return false;
    }
    gemm_variant v;
    mg_error_state saved;
    mg_error_save(&saved);
    uint32_t max_shared;
    multiprocessors(b, &max_shared);
    const bool chosen = choose_variant(b, p, &v) == MG_OK;
    mg_error_restore(&saved);
    if (!chosen) {
        snprintf(reason, reason_bytes, "has no kernel for this shape");
        return false;
    }
    if (max_shared && v.shared_bytes > max_shared) {
        snprintf(reason, reason_bytes,
                 "needs %u bytes of shared memory for the normed rows (k=%u), the device allows %u",
                 v.shared_bytes, p->k, max_shared);
        return false;
    }
    return mg_op_ships_kernel(b, v.name, reason, reason_bytes);
}

/* The kernels provider's GEMM: one launch of the variant that fits the problem. */
static mg_status run_tiled(mg_backend *b, mg_stream *s, const gemm_problem *p) {
    gemm_variant v;
    mg_status st = choose_variant(b, p, &v);
    return st ? st
              : launch_gemm(b, s, p, v.name, (mg_dim3){v.tiles, v.row_tiles, 1},
                            (mg_dim3){v.threads, 1, 1}, v.shared_bytes);
}

/* A dense call's problem (one group of m rows); the workspace and fusion fields zero. */
static gemm_problem dense_problem(const char *fn, uint32_t m, uint32_t n, uint32_t k, mg_devptr act,
                                  uint32_t act_pitch, const mg_nvfp4_weight *w,
                                  const mg_nvfp4_weight *up, mg_devptr out, uint32_t ldc) {
    return (gemm_problem){.fn = fn,
                          .op = MG_OP_NVFP4_GEMM,
                          .experts = 1,
                          .rows = m,
                          .act_rows = m,
                          .n = n,
                          .k = k,
                          .act_pitch = act_pitch,
                          .ldc = ldc,
                          .act = act,
                          .out = out,
                          .w = *w,
                          .up = up};
}

static mg_status dense(mg_backend *b, mg_stream *s, const char *fn, uint32_t m, uint32_t n,
                       uint32_t k, mg_devptr act, uint32_t act_pitch, const mg_nvfp4_weight *w,
                       const mg_nvfp4_weight *up, mg_devptr out, uint32_t ldc, mg_devptr workspace,
                       size_t workspace_bytes) {
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!w)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL weight", fn);
    gemm_problem p = dense_problem(fn, m, n, k, act, act_pitch, w, up, out, ldc);
    p.workspace = workspace;
    p.workspace_bytes = workspace_bytes;
    return run_problem(b, s, &p);
}

mg_status mg_nvfp4_gemm(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, uint32_t k,
                        mg_devptr act, uint32_t act_pitch, const mg_nvfp4_weight *w, mg_devptr out,
                        uint32_t ldc) {
    return dense(b, s, "mg_nvfp4_gemm", m, n, k, act, act_pitch, w, NULL, out, ldc, 0, 0);
}

mg_status mg_nvfp4_gemm_with_workspace(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n,
                                       uint32_t k, mg_devptr act, uint32_t act_pitch,
                                       const mg_nvfp4_weight *w, mg_devptr out, uint32_t ldc,
                                       mg_devptr workspace, size_t workspace_bytes) {
    if (!workspace && workspace_bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_nvfp4_gemm_with_workspace: workspace is null but workspace_bytes = %zu",
                        workspace_bytes);
    return dense(b, s, "mg_nvfp4_gemm_with_workspace", m, n, k, act, act_pitch, w, NULL, out, ldc,
                 workspace, workspace_bytes);
}

mg_status mg_nvfp4_gemm_gate_up(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, uint32_t k,
                                mg_devptr act, uint32_t act_pitch, const mg_nvfp4_weight *gate,
                                const mg_nvfp4_weight *up, mg_devptr out, uint32_t ldc) {
    if (!up)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_nvfp4_gemm_gate_up: NULL up weight");
    return dense(b, s, "mg_nvfp4_gemm_gate_up", m, n, k, act, act_pitch, gate, up, out, ldc, 0, 0);
}

/* ------------------------------------------------------------------ fusion */

/* "prologue rmsnorm + epilogue residual_add" and the like, into buf. */
static void fusion_text(const mg_gemm_fusion *f, char *buf, size_t bytes) {
    const bool pro = f->prologue != MG_GEMM_PROLOGUE_NONE,
               epi = f->epilogue != MG_GEMM_EPILOGUE_NONE;
    snprintf(buf, bytes, "%s%s%s%s%s", pro ? "prologue " : "",
             pro ? mg_gemm_prologue_name(f->prologue) : "", pro && epi ? " + " : "",
             epi ? "epilogue " : "", epi ? mg_gemm_epilogue_name(f->epilogue) : "");
}

/* The fusion's kinds and eps against the form (gate_up or not); no operands. */
static mg_status check_fusion(const char *fn, const mg_gemm_fusion *f, bool gate_up) {
    if ((unsigned)f->prologue >= MG_GEMM_PROLOGUE_COUNT ||
        (unsigned)f->epilogue >= MG_GEMM_EPILOGUE_COUNT)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: unknown fusion (prologue %d, epilogue %d)",
                        fn, (int)f->prologue, (int)f->epilogue);
    char text[80];
    fusion_text(f, text, sizeof text);
    if (f->epilogue == MG_GEMM_EPILOGUE_ARGMAX || f->epilogue == MG_GEMM_EPILOGUE_KV_APPEND)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "%s: fusion %s is not run with NVFP4 weights (mg_gemm runs it for BF16 "
                        "and FP8 weights)",
                        fn, text);
    if (gate_up != (f->epilogue == MG_GEMM_EPILOGUE_SILU_MUL))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        gate_up ? "%s: the gate_up form (an up weight) needs epilogue silu_mul, "
                                  "not %s"
                                : "%s: fusion %s needs the up weight (the gate_up form)",
                        fn, gate_up && f->epilogue == MG_GEMM_EPILOGUE_NONE ? "none" : text);
    if (f->prologue == MG_GEMM_PROLOGUE_RMSNORM && !(f->eps > 0.0f && isfinite(f->eps)))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: fusion %s needs eps > 0 and finite, got %g",
                        fn, text, (double)f->eps);
    return MG_OK;
}

/* Every operand the fusion reads given, and none it does not. */
static mg_status check_fusion_tensors(const char *fn, const mg_gemm_fusion *f,
                                      const mg_gemm_fusion_tensors *t) {
    const bool norm = f->prologue == MG_GEMM_PROLOGUE_RMSNORM;
    const bool add = f->epilogue == MG_GEMM_EPILOGUE_RESIDUAL_ADD;
    char text[80];
    fusion_text(f, text, sizeof text);
    const char *missing = norm && !t->norm_weight ? "norm_weight"
                          : add && !t->residual   ? "residual"
                                                  : NULL;
    if (missing)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: fusion %s needs tensors->%s", fn, text,
                        missing);
    const char *unused = !norm && t->norm_weight ? "norm_weight"
                         : !add && t->residual   ? "residual"
                         : t->argmax_ids         ? "argmax_ids"
                         : t->kv_cache           ? "kv_cache"
                         : t->kv_append          ? "kv_append"
                                                 : NULL;
    if (unused)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: tensors->%s is given but fusion %s does not read it (pass 0)", fn,
                        unused, text[0] ? text : "none");
    return MG_OK;
}

mg_status mg_nvfp4_gemm_fused(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, uint32_t k,
                              mg_devptr act, uint32_t act_pitch, const mg_nvfp4_weight *w,
                              const mg_nvfp4_weight *up, mg_devptr out, uint32_t ldc,
                              const mg_gemm_fusion *fusion, const mg_gemm_fusion_tensors *tensors) {
    static const char fn[] = "mg_nvfp4_gemm_fused";
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!w || !fusion || !tensors)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn,
                        !w        ? "weight"
                        : !fusion ? "fusion"
                                  : "tensors");
    if ((st = check_fusion(fn, fusion, up != NULL)) ||
        (st = check_fusion_tensors(fn, fusion, tensors)))
        return st;
    gemm_problem p = dense_problem(fn, m, n, k, act, act_pitch, w, up, out, ldc);
    p.fusion = *fusion;
    p.norm_weight = tensors->norm_weight;
    p.residual = tensors->residual;
    return run_problem(b, s, &p);
}

mg_status mg_nvfp4_gemm_fusion_supported(mg_backend *b, uint32_t m, uint32_t n, uint32_t k,
                                         bool gate_up, const mg_gemm_fusion *fusion) {
    static const char fn[] = "mg_nvfp4_gemm_fusion_supported";
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!fusion)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL fusion", fn);
    if ((st = check_shape(fn, n, k)) || (st = check_fusion(fn, fusion, gate_up)))
        return st;
    if (!m)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: m must be >= 1", fn);
    /* the supports hooks read the shape, the form and the fusion, never the operands */
    static const mg_nvfp4_weight no_weight;
    gemm_problem p =
        dense_problem(fn, m, n, k, 0, k, &no_weight, gate_up ? &no_weight : NULL, 0, n);
    p.fusion = *fusion;
    const mg_op_provider *provider;
    return mg_op_choose(b, MG_OP_NVFP4_GEMM, &p, fn, &provider);
}

mg_status mg_nvfp4_moe_gemm(mg_backend *b, mg_stream *s, const mg_nvfp4_moe_desc *d,
                            const mg_nvfp4_moe_tensors *t) {
    static const char fn[] = "mg_nvfp4_moe_gemm";
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!d || !t)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, d ? "tensors" : "descriptor");
    if (!t->expert_offsets)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: expert_offsets is null", fn);
    gemm_problem p = {.fn = fn,
                      .op = MG_OP_NVFP4_MOE_GEMM,
                      .experts = d->experts,
                      .rows = d->rows,
                      .act_rows = d->act_rows,
                      .n = d->n,
                      .k = d->k,
                      .act_pitch = d->act_pitch ? d->act_pitch : d->k,
                      .ldc = d->ldc ? d->ldc : d->n,
                      .act = t->act,
                      .token_ids = t->sorted_token_ids,
                      .offsets = t->expert_offsets,
                      .out = t->out,
                      .w = t->w,
                      .up = t->up};
    return run_problem(b, s, &p);
}
