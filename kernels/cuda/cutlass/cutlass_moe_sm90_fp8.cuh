// cutlass_moe_sm90_fp8.cuh - the FP8 Hopper grouped MoE GEMMs (cutlass_moe_sm90.h), one unit per
// kind instantiating FP8Unit<kind>: cutlass_moe_sm90_fp8.cu (128x128 block-scaled weights,
// DeepSeek-style) and cutlass_moe_sm90_fp8_rowwise.cu (one scale per weight row).
//
// Both run CUTLASS's pointer-array cooperative kernel with block-scaled FP32 accumulation
// (KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum), tile 128x128x128 (the K tile
// is the 128-wide scale block), cluster 1x1x1: the BF16 unit's schedule. The per-call kernel
// gathers the activation rows and quantizes them to E4M3 in the workspace, by the rule of
// metrale/ops_quantize.h (bit-identical to the CPU reference), and writes the scales in the
// M/N-major layouts the kernel reads:
//  - block-scaled: scale granularity 1 x 128 x 128. One activation scale per (row, 128-wide K
//    block) (mg_fp8_quantize_1x128's rule), expert e's as [ceil(k/128)][M_e] at row offset_e;
//    the weight scales [E, ceil(n_w/128), ceil(k/128)] transposed to [ceil(k/128)][ceil(n_w/128)]
//    per expert.
//  - row-wise: the same kernel with granularity 1 x 1 x 128 (per-row operands, K blocks of 128).
//    One activation scale per row (mg_fp8_quantize_rowwise's rule) and one per weight row
//    ([E, n_w]), each repeated over the K blocks, so every 128-wide partial sum is scaled by
//    act_scale(r) * weight_scale(j): the row-wise product up to FP32 rounding.
#pragma once

#include "cutlass_moe_sm90_common.cuh"
#include "fp8_e4m3.cuh"

namespace mg_moe_fp8 {

using ElementAB = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignAB = 16;
constexpr int kAlignD = 16 / sizeof(ElementD);
constexpr uint32_t kBlock = 128; // the K block of every scale, and the weight row block
using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;

__host__ __device__ inline uint32_t blocks_of(uint32_t x) {
    return (x + kBlock - 1) / kBlock;
}

// The expert whose clamped rows hold row r when the offsets are sorted (the last of equal
// offsets); with unsorted offsets some expert, whose range the caller checks.
__device__ inline uint32_t expert_of_row(const mg_cutlass_moe_problem &p, uint32_t r) {
    uint32_t lo = 0, hi = p.experts - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        int64_t o = p.expert_offsets[mid];
        if ((o < 0 ? 0 : o) <= (int64_t)r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// Row r's activation scale for K block g into expert e's [kb][M_e] block (nothing when r is
// outside e's rows: bad routing).
__device__ inline void store_act_scale(const mg_cutlass_moe_problem &p, float *sfa, uint32_t r,
                                       uint32_t g, float scale) {
    uint32_t begin, count;
    mg_moe::expert_rows(p.expert_offsets, p.rows, expert_of_row(p, r), &begin, &count);
    if (r >= begin && r < begin + count)
        sfa[(size_t)begin * blocks_of(p.k) + (size_t)g * count + (r - begin)] = scale;
}

__device__ inline const uint4 *act_row(const mg_cutlass_moe_problem &p, uint32_t r) {
    return reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(p.act) +
                                           (size_t)mg_moe::source_row(p, r) * p.act_pitch);
}

// The output side, the same for both kinds. At namespace scope: CUTLASS's epilogue builder
// with no C operand does not compile inside a class template (a dependent name it uses
// without `typename`).
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD *, kAlignD,
    ElementD, LayoutD *, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float, void>>::CollectiveOp;

} // namespace mg_moe_fp8

// The kernel types of one kind as a (non-template) struct `Name`: activation scale granularity
// 1 x 128 (rows x K), weight scale granularity ScaleN x 128.
#define MG_MOE_FP8_GEMM(Name, ScaleN)                                                              \
    struct Name {                                                                                  \
        using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, ScaleN, 128>;             \
        using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());                               \
        using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());                               \
        using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<                    \
            cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, mg_moe_fp8::ElementAB,            \
            cute::tuple<mg_moe_fp8::LayoutA *, LayoutSFA *>, mg_moe_fp8::kAlignAB,                 \
            mg_moe_fp8::ElementAB, cute::tuple<mg_moe_fp8::LayoutB *, LayoutSFB *>,                \
            mg_moe_fp8::kAlignAB, float, mg_moe_fp8::TileShape, mg_moe_fp8::ClusterShape,          \
            cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(                    \
                sizeof(typename mg_moe_fp8::Epilogue::SharedStorage))>,                            \
            cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum>::       \
            CollectiveOp;                                                                          \
        using Gemm =                                                                               \
            cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<      \
                mg_moe::ProblemShape, Mainloop, mg_moe_fp8::Epilogue>>;                            \
    };

namespace mg_moe_fp8 {

// One kind's unit for mg_moe::unit_run / unit_workspace; Types from MG_MOE_FP8_GEMM.
template <uint32_t Kind, class Types> struct FP8Unit {
    static constexpr bool kRowwise = Kind == MG_CUTLASS_MOE_FP8_ROWWISE;
    static constexpr uint32_t kKind = Kind;
    static constexpr const char *kWhat = kRowwise ? "CUTLASS FP8 row-wise grouped MoE GEMM"
                                                  : "CUTLASS FP8 block-scaled grouped MoE GEMM";
    using ScaleConfig = typename Types::ScaleConfig;
    using LayoutSFA = typename Types::LayoutSFA;
    using LayoutSFB = typename Types::LayoutSFB;
    using Gemm = typename Types::Gemm;

    struct Carve {
        mg_moe::ExpertArgs<Gemm> gemm;
        const float **ptr_sfa, **ptr_sfb;
        LayoutSFA *layout_sfa;
        LayoutSFB *layout_sfb;
        uint8_t *codes; // E4M3 [rows, k]
        float *sfa;     // per expert [kb][M_e], expert e at row offset_e * kb
        float *sfb;     // per expert [kb][scale rows of the weight]
        void *cutlass_workspace;
        size_t bytes;
    };

    // Weight scale rows per expert: n_w (row-wise) or its 128-row blocks.
    __host__ __device__ static uint32_t weight_scale_rows(const mg_cutlass_moe_problem &p) {
        return kRowwise ? p.n_w : blocks_of(p.n_w);
    }

    __device__ static void write_expert(const mg_cutlass_moe_problem &p, const Carve &c,
                                        uint32_t e) {
        c.gemm.write(p, reinterpret_cast<const ElementAB *>(c.codes), e);
        uint32_t begin, count;
        mg_moe::expert_rows(p.expert_offsets, p.rows, e, &begin, &count);
        const uint32_t kb = blocks_of(p.k);
        c.ptr_sfa[e] = c.sfa + (size_t)begin * kb;
        c.ptr_sfb[e] = c.sfb + (size_t)e * weight_scale_rows(p) * kb;
        auto shape = cute::make_shape((int)count, (int)p.n_w, (int)p.k, 1);
        c.layout_sfa[e] = ScaleConfig::tile_atom_to_shape_SFA(shape);
        c.layout_sfb[e] = ScaleConfig::tile_atom_to_shape_SFB(shape);
    }

    static typename Gemm::Arguments make_arguments(const mg_cutlass_moe_problem &p, const Carve &c,
                                                   int device, int sms) {
        const mg_moe::ExpertArgs<Gemm> &g = c.gemm;
        return mg_moe::grouped_arguments<Gemm>(p, g,
                                               {g.ptr_a, g.stride_a, g.ptr_b, g.stride_b, c.ptr_sfa,
                                                c.layout_sfa, c.ptr_sfb, c.layout_sfb},
                                               device, sms);
    }

    static Carve carve(const mg_cutlass_moe_problem &p, char *base, int device, int sms) {
        Carve c;
        mg_moe::Carver w{base};
        c.gemm.carve(w, p.experts);
        c.ptr_sfa = w.take<const float *>(p.experts);
        c.ptr_sfb = w.take<const float *>(p.experts);
        c.layout_sfa = w.take<LayoutSFA>(p.experts);
        c.layout_sfb = w.take<LayoutSFB>(p.experts);
        c.codes = w.take<uint8_t>((size_t)p.rows * p.k);
        c.sfa = w.take<float>((size_t)p.rows * blocks_of(p.k));
        c.sfb = w.take<float>((size_t)p.experts * weight_scale_rows(p) * blocks_of(p.k));
        typename Gemm::Arguments args = make_arguments(p, c, device, sms);
        c.cutlass_workspace = w.take<char>(Gemm::get_workspace_size(args));
        c.bytes = w.used;
        return c;
    }

    static void prepare(const mg_cutlass_moe_problem &p, const Carve &c, cudaStream_t s);
};

// Block 0 writes the per-expert arguments; every block lays out its share of the weight scales
// (block-scaled: transposed; row-wise: repeated over the K blocks), then quantizes its share of
// the gathered rows: block-scaled, one (row, K block) per half warp (16 lanes x 8 values: k is a
// multiple of 16, so a block's vectors are whole); row-wise, one row per warp, read twice (the
// amax, then the codes; the second read hits L2).
template <class Unit>
__global__ void __launch_bounds__(256)
    quantize_fp8(mg_cutlass_moe_problem p, typename Unit::Carve c) {
    if (blockIdx.x == 0)
        for (uint32_t e = threadIdx.x; e < p.experts; e += blockDim.x)
            Unit::write_expert(p, c, e);
    const uint32_t kb = blocks_of(p.k), srows = Unit::weight_scale_rows(p);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t per_expert = (size_t)srows * kb;
    // Only the experts that have rows: the GEMM reads no other expert's scales, and a decode
    // step routes its few tokens to a few of many experts.
    for (uint32_t e = 0; e < p.experts; e++) {
        uint32_t begin, count;
        mg_moe::expert_rows(p.expert_offsets, p.rows, e, &begin, &count);
        if (!count)
            continue;
        for (size_t within = thread; within < per_expert; within += stride) {
            uint32_t g = (uint32_t)(within / srows), row = (uint32_t)(within % srows);
            size_t src =
                Unit::kRowwise ? (size_t)e * srows + row : ((size_t)e * srows + row) * kb + g;
            c.sfb[e * per_expert + (size_t)g * srows + row] = p.weight_scale[src];
        }
    }
    const uint32_t vectors = p.k / 8, warp_lane = threadIdx.x % 32;
    const size_t warp = thread / 32, warps = stride / 32;
    if (Unit::kRowwise) {
        for (size_t r = warp; r < p.rows; r += warps) {
            const uint4 *row = act_row(p, (uint32_t)r);
            float amax = 0.0f;
            for (uint32_t v = warp_lane; v < vectors; v += 32)
                amax = mg_fp8::vector_amax(row[v], amax);
            float scale = mg_fp8::scale_from_amax(mg_fp8::lanes_max(amax, 32));
            uint2 *codes = reinterpret_cast<uint2 *>(c.codes + r * p.k);
            for (uint32_t v = warp_lane; v < vectors; v += 32)
                codes[v] = mg_fp8::quantize_vector(row[v], scale);
            for (uint32_t g = warp_lane; g < kb; g += 32)
                store_act_scale(p, c.sfa, (uint32_t)r, g, scale);
        }
        return;
    }
    const uint32_t lane = threadIdx.x % 16;
    const size_t items = (size_t)p.rows * kb;
    // Whole warps iterate together (the max over 16 lanes shuffles across the warp).
    for (size_t pair = warp; pair * 2 < items; pair += warps) {
        size_t item = pair * 2 + warp_lane / 16;
        bool valid = item < items;
        uint32_t r = valid ? (uint32_t)(item / kb) : 0, g = valid ? (uint32_t)(item % kb) : 0;
        uint32_t v = g * 16 + lane;
        bool active = valid && v < vectors;
        uint4 x = active ? act_row(p, r)[v] : make_uint4(0, 0, 0, 0);
        float scale = mg_fp8::scale_from_amax(mg_fp8::lanes_max(mg_fp8::vector_amax(x, 0.0f), 16));
        if (active)
            reinterpret_cast<uint2 *>(c.codes + (size_t)r * p.k)[v] =
                mg_fp8::quantize_vector(x, scale);
        if (valid && lane == 0)
            store_act_scale(p, c.sfa, r, g, scale);
    }
}

template <uint32_t Kind, class Types>
void FP8Unit<Kind, Types>::prepare(const mg_cutlass_moe_problem &p, const Carve &c,
                                   cudaStream_t s) {
    size_t threads = kRowwise ? (size_t)p.rows * 32 : (size_t)p.rows * blocks_of(p.k) * 16;
    // Enough threads for one expert's weight scales too (each thread copies a few per expert).
    size_t scale_threads = (size_t)weight_scale_rows(p) * blocks_of(p.k) / 4;
    threads = scale_threads > threads ? scale_threads : threads;
    quantize_fp8<FP8Unit<Kind, Types>><<<mg_moe::gather_blocks(threads), 256, 0, s>>>(p, c);
}

} // namespace mg_moe_fp8
