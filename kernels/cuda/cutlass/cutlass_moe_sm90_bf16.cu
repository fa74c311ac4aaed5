// cutlass_moe_sm90_bf16.cu - the BF16 Hopper grouped MoE GEMM (cutlass_moe_sm90.h): BF16
// activations gathered into the workspace, BF16 weights [E, n_w, k], FP32 accumulation, BF16 out.
//
// One kernel instantiation: CUTLASS's pointer-array TMA warp-specialized COOPERATIVE kernel,
// tile 128x128x64, cluster 1x1x1. Cooperative (both consumer warpgroups on one 128-row tile)
// rather than ping-pong: it is the schedule CUTLASS's FP8 block-scaled grouped kernel is built
// on, so the BF16 and FP8 kinds share one schedule and tile; a 1x1 cluster because expert
// problems are often a single 128-row tile, where multicast across a cluster buys nothing.
#include "cutlass_moe_sm90_common.cuh"

namespace mg_moe_bf16 {

using ElementAB = cutlass::bfloat16_t;
using ElementD = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;    // gathered activations [rows, k]
using LayoutB = cutlass::layout::ColumnMajor; // weights [n_w, k]: K contiguous
using LayoutD = cutlass::layout::RowMajor;    // out [rows, ldd]
constexpr int kAlignAB = 16 / sizeof(ElementAB);
constexpr int kAlignD = 16 / sizeof(ElementD);
using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD *, kAlignD,
    ElementD, LayoutD *, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float, void>>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA *, kAlignAB,
    ElementAB, LayoutB *, kAlignAB, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<mg_moe::ProblemShape, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
using Args = mg_moe::ExpertArgs<Gemm>;

constexpr const char *kWhat = "CUTLASS BF16 grouped MoE GEMM";

// Block 0 writes the per-expert arguments; every block copies its share of the gathered rows
// (16-byte vectors: k is a multiple of 8, act 16-byte aligned with a pitch of 8n elements).
__global__ void gather_bf16(mg_cutlass_moe_problem p, Args args, uint4 *gathered) {
    if (blockIdx.x == 0)
        for (uint32_t e = threadIdx.x; e < p.experts; e += blockDim.x)
            args.write(p, reinterpret_cast<const ElementAB *>(gathered), e);
    const uint32_t vecs = p.k / 8;
    const size_t total = (size_t)p.rows * vecs;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t r = (uint32_t)(i / vecs), v = (uint32_t)(i % vecs);
        const uint4 *src = reinterpret_cast<const uint4 *>(
            static_cast<const uint16_t *>(p.act) + (size_t)mg_moe::source_row(p, r) * p.act_pitch);
        gathered[i] = src[v];
    }
}

struct Carve {
    Args args;
    ElementAB *gathered;
    void *cutlass_workspace;
    size_t bytes;
};

typename Gemm::Arguments make_arguments(const mg_cutlass_moe_problem &p, const Args &a, int device,
                                        int sms) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = sms;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {(int)p.experts, a.shapes, nullptr},
        {a.ptr_a, a.stride_a, a.ptr_b, a.stride_b},
        {{}, nullptr, nullptr, a.ptr_d, a.stride_d},
        hw};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    return args;
}

// The carve of `p`'s workspace (base null: sizes only): arguments, gathered rows, then
// CUTLASS's own workspace.
Carve carve(const mg_cutlass_moe_problem &p, char *base, int device, int sms) {
    Carve l;
    mg_moe::Carver c{base};
    l.args.carve(c, p.experts);
    l.gathered = c.take<ElementAB>((size_t)p.rows * p.k);
    typename Gemm::Arguments args = make_arguments(p, l.args, device, sms);
    l.cutlass_workspace = c.take<char>(Gemm::get_workspace_size(args));
    l.bytes = c.used;
    return l;
}

} // namespace mg_moe_bf16

using namespace mg_moe_bf16;

MG_PLUGIN_EXPORT mg_status mg_cutlass_moe_sm90_bf16_workspace(const mg_cutlass_moe_problem *p,
                                                             size_t *bytes, mg_plugin_error *err) {
    return mg_plugin_guarded("mg_cutlass_moe_sm90_bf16_workspace", "CUTLASS", err, [&] {
        int device, sms;
        mg_status st = mg_moe::current_sm_count(err, &device, &sms);
        if (!st)
            *bytes = carve(*p, nullptr, device, sms).bytes;
        return st;
    });
}

MG_PLUGIN_EXPORT mg_status mg_cutlass_moe_sm90_bf16_run(const mg_cutlass_moe_problem *p,
                                                       void *stream, mg_plugin_error *err) {
    return mg_plugin_guarded("mg_cutlass_moe_sm90_bf16_run", "CUTLASS", err, [&] {
        int device, sms;
        mg_status st = mg_moe::current_sm_count(err, &device, &sms);
        if (st)
            return st;
        if (p->kind != MG_CUTLASS_MOE_BF16)
            return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0, "%s: kind %u is not BF16",
                                  kWhat, p->kind);
        Carve l = carve(*p, static_cast<char *>(p->workspace), device, sms);
        if (l.bytes > p->workspace_bytes)
            return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0,
                                  "%s: workspace of %zu bytes, %zu needed", kWhat,
                                  p->workspace_bytes, l.bytes);
        cudaStream_t s = static_cast<cudaStream_t>(stream);
        gather_bf16<<<mg_moe::gather_blocks((size_t)p->rows * (p->k / 8)), 256, 0, s>>>(
            *p, l.args, reinterpret_cast<uint4 *>(l.gathered));
        if ((st = mg_moe::cuda_check(err, cudaGetLastError(), "gather_bf16 launch")))
            return st;
        typename Gemm::Arguments args = make_arguments(*p, l.args, device, sms);
        return mg_moe::launch<Gemm>(args, l.cutlass_workspace, s, err, kWhat);
    });
}
