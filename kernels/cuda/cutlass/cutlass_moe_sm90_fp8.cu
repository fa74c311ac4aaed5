// cutlass_moe_sm90_fp8.cu - the FP8 Hopper grouped MoE GEMM (cutlass_moe_sm90.h), 128x128
// block-scaled weights (DeepSeek-style): the activation rows gathered and quantized to E4M3 in
// the workspace with one scale per (row, 128-wide K block) (the rule of mg_fp8_quantize_1x128),
// weights E4M3 [E, n_w, k] with FP32 scales [E, ceil(n_w/128), ceil(k/128)], BF16 out.
//
// One kernel instantiation: CUTLASS's pointer-array cooperative kernel with block-scaled FP32
// accumulation (KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum, scale
// granularity 1 x 128 x 128), tile 128x128x128 (K tile = the scale block), cluster 1x1x1, the
// same schedule as the BF16 unit. Its scale operands must be M/N-major, so the per-call kernel
// writes the activation scales of expert e as [ceil(k/128)][M_e] at row offset_e, and the weight
// scales transposed to [ceil(k/128)][ceil(n_w/128)] per expert.
//
// The row-wise kind (one scale per row of each operand) is not built here: it needs a second
// instantiation (N granularity 1), which this unit leaves out to keep its compile time.
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
constexpr uint32_t kBlock = 128; // the scale block along K and along the weight rows
using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kBlock, kBlock>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD *, kAlignD,
    ElementD, LayoutD *, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float, void>>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
    cute::tuple<LayoutA *, LayoutSFA *>, kAlignAB, ElementAB, cute::tuple<LayoutB *, LayoutSFB *>,
    kAlignAB, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<mg_moe::ProblemShape, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

constexpr const char *kWhat = "CUTLASS FP8 block-scaled grouped MoE GEMM";

struct Args {
    mg_moe::ExpertArgs<Gemm> gemm;
    const float **ptr_sfa, **ptr_sfb;
    LayoutSFA *layout_sfa;
    LayoutSFB *layout_sfb;
};

struct Carve {
    Args args;
    uint8_t *codes; // E4M3 [rows, k]
    float *sfa;     // per expert [kb][M_e], experts at offset_e * kb
    float *sfb;     // per expert [kb][nb]
    void *cutlass_workspace;
    size_t bytes;
};

__host__ __device__ inline uint32_t blocks_of(uint32_t x) {
    return (x + kBlock - 1) / kBlock;
}

// The expert whose clamped rows hold row r when the offsets are sorted (the last of equal
// offsets); with unsorted offsets any expert, whose range the caller checks.
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

__device__ void write_expert(const mg_cutlass_moe_problem &p, const Args &a, const Carve &c,
                             uint32_t e) {
    a.gemm.write(p, reinterpret_cast<const ElementAB *>(c.codes), e);
    uint32_t begin, count;
    mg_moe::expert_rows(p.expert_offsets, p.rows, e, &begin, &count);
    const uint32_t kb = blocks_of(p.k), nb = blocks_of(p.n_w);
    a.ptr_sfa[e] = c.sfa + (size_t)begin * kb;
    a.ptr_sfb[e] = c.sfb + (size_t)e * nb * kb;
    auto shape = cute::make_shape((int)count, (int)p.n_w, (int)p.k, 1);
    a.layout_sfa[e] = ScaleConfig::tile_atom_to_shape_SFA(shape);
    a.layout_sfb[e] = ScaleConfig::tile_atom_to_shape_SFB(shape);
}

// Block 0 writes the per-expert arguments; every block then transposes its share of the weight
// scales and quantizes its share of the gathered rows, one (row, K block) per half warp: 16
// lanes x 8 values. k is a multiple of 16, so a block's vectors are whole.
__global__ void __launch_bounds__(256) quantize_fp8(mg_cutlass_moe_problem p, Carve c) {
    if (blockIdx.x == 0)
        for (uint32_t e = threadIdx.x; e < p.experts; e += blockDim.x)
            write_expert(p, c.args, c, e);
    const uint32_t kb = blocks_of(p.k), nb = blocks_of(p.n_w);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t scales = (size_t)p.experts * nb * kb;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < scales; i += stride) {
        size_t e = i / ((size_t)nb * kb), within = i % ((size_t)nb * kb);
        uint32_t row_block = (uint32_t)(within / kb), g = (uint32_t)(within % kb);
        c.sfb[e * nb * kb + (size_t)g * nb + row_block] = p.weight_scale[i];
    }
    const uint32_t vectors = p.k / 8, lane = threadIdx.x % 16;
    const size_t items = (size_t)p.rows * kb;
    const size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    // Whole warps iterate together (the max over 16 lanes shuffles across the warp).
    for (size_t pair = warp; pair * 2 < items; pair += stride / 32) {
        size_t item = pair * 2 + (threadIdx.x % 32) / 16;
        bool valid = item < items;
        uint32_t r = valid ? (uint32_t)(item / kb) : 0, g = valid ? (uint32_t)(item % kb) : 0;
        uint32_t v = g * 16 + lane;
        bool active = valid && v < vectors;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (active)
            x = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(p.act) +
                                                (size_t)mg_moe::source_row(p, r) *
                                                    p.act_pitch)[v];
        float scale = mg_fp8::scale_from_amax(mg_fp8::lanes_max(mg_fp8::vector_amax(x, 0.0f), 16));
        if (active)
            reinterpret_cast<uint2 *>(c.codes + (size_t)r * p.k)[v] =
                mg_fp8::quantize_vector(x, scale);
        if (valid && lane == 0) {
            uint32_t e = expert_of_row(p, r), begin, count;
            mg_moe::expert_rows(p.expert_offsets, p.rows, e, &begin, &count);
            if (r >= begin && r < begin + count)
                c.sfa[(size_t)begin * kb + (size_t)g * count + (r - begin)] = scale;
        }
    }
}

typename Gemm::Arguments make_arguments(const mg_cutlass_moe_problem &p, const Args &a, int device,
                                        int sms) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = sms;
    const mg_moe::ExpertArgs<Gemm> &g = a.gemm;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {(int)p.experts, g.shapes, nullptr},
        {g.ptr_a, g.stride_a, g.ptr_b, g.stride_b, a.ptr_sfa, a.layout_sfa, a.ptr_sfb,
         a.layout_sfb},
        {{}, nullptr, nullptr, g.ptr_d, g.stride_d},
        hw};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    return args;
}

Carve carve(const mg_cutlass_moe_problem &p, char *base, int device, int sms) {
    Carve c;
    mg_moe::Carver w{base};
    c.args.gemm.carve(w, p.experts);
    c.args.ptr_sfa = w.take<const float *>(p.experts);
    c.args.ptr_sfb = w.take<const float *>(p.experts);
    c.args.layout_sfa = w.take<LayoutSFA>(p.experts);
    c.args.layout_sfb = w.take<LayoutSFB>(p.experts);
    c.codes = w.take<uint8_t>((size_t)p.rows * p.k);
    c.sfa = w.take<float>((size_t)p.rows * blocks_of(p.k));
    c.sfb = w.take<float>((size_t)p.experts * blocks_of(p.n_w) * blocks_of(p.k));
    typename Gemm::Arguments args = make_arguments(p, c.args, device, sms);
    c.cutlass_workspace = w.take<char>(Gemm::get_workspace_size(args));
    c.bytes = w.used;
    return c;
}

} // namespace mg_moe_fp8

using namespace mg_moe_fp8;

MG_PLUGIN_EXPORT mg_status mg_cutlass_moe_sm90_fp8_workspace(const mg_cutlass_moe_problem *p,
                                                            size_t *bytes, mg_plugin_error *err) {
    return mg_plugin_guarded("mg_cutlass_moe_sm90_fp8_workspace", "CUTLASS", err, [&] {
        int device, sms;
        mg_status st = mg_moe::current_sm_count(err, &device, &sms);
        if (!st)
            *bytes = carve(*p, nullptr, device, sms).bytes;
        return st;
    });
}

MG_PLUGIN_EXPORT mg_status mg_cutlass_moe_sm90_fp8_run(const mg_cutlass_moe_problem *p,
                                                      void *stream, mg_plugin_error *err) {
    return mg_plugin_guarded("mg_cutlass_moe_sm90_fp8_run", "CUTLASS", err, [&] {
        if (p->kind != MG_CUTLASS_MOE_FP8_BLOCKSCALED)
            return mg_plugin_fail(err, MG_ERR_UNSUPPORTED, 0,
                                  "%s: only 128x128 block-scaled weights are built (kind %u)",
                                  kWhat, p->kind);
        int device, sms;
        mg_status st = mg_moe::current_sm_count(err, &device, &sms);
        if (st)
            return st;
        Carve c = carve(*p, static_cast<char *>(p->workspace), device, sms);
        if (c.bytes > p->workspace_bytes)
            return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0,
                                  "%s: workspace of %zu bytes, %zu needed", kWhat,
                                  p->workspace_bytes, c.bytes);
        cudaStream_t s = static_cast<cudaStream_t>(stream);
        size_t work = (size_t)p->rows * blocks_of(p->k) * 16;
        quantize_fp8<<<mg_moe::gather_blocks(work), 256, 0, s>>>(*p, c);
        if ((st = mg_moe::cuda_check(err, cudaGetLastError(), "quantize_fp8 launch")))
            return st;
        typename Gemm::Arguments args = make_arguments(*p, c.args, device, sms);
        return mg_moe::launch<Gemm>(args, c.cutlass_workspace, s, err, kWhat);
    });
}
