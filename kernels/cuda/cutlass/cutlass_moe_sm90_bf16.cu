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
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA *, kAlignAB, ElementAB,
    LayoutB *, kAlignAB, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<mg_moe::ProblemShape, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
using Args = mg_moe::ExpertArgs<Gemm>;

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

struct Unit {
    using Gemm = mg_moe_bf16::Gemm;
    static constexpr uint32_t kKind = MG_CUTLASS_MOE_BF16;
    static constexpr const char *kWhat = "CUTLASS BF16 grouped MoE GEMM";

    struct Carve {
        Args args;
        ElementAB *gathered;
        void *cutlass_workspace;
        size_t bytes;
    };

    static typename Gemm::Arguments make_arguments(const mg_cutlass_moe_problem &p, const Carve &c,
                                                   int device, int sms) {
        const Args &a = c.args;
        return mg_moe::grouped_arguments<Gemm>(p, a, {a.ptr_a, a.stride_a, a.ptr_b, a.stride_b},
                                               device, sms);
    }

    // Arguments, gathered rows [rows, k], then CUTLASS's own workspace.
    static Carve carve(const mg_cutlass_moe_problem &p, char *base, int device, int sms) {
        Carve c;
        mg_moe::Carver w{base};
        c.args.carve(w, p.experts);
        c.gathered = w.take<ElementAB>((size_t)p.rows * p.k);
        typename Gemm::Arguments args = make_arguments(p, c, device, sms);
        c.cutlass_workspace = w.take<char>(Gemm::get_workspace_size(args));
        c.bytes = w.used;
        return c;
    }

    static void prepare(const mg_cutlass_moe_problem &p, const Carve &c, cudaStream_t s) {
        gather_bf16<<<mg_moe::gather_blocks((size_t)p.rows * (p.k / 8)), 256, 0, s>>>(
            p, c.args, reinterpret_cast<uint4 *>(c.gathered));
    }
};

} // namespace mg_moe_bf16

MG_PLUGIN_EXPORT mg_status mg_cutlass_moe_sm90_bf16_workspace(const mg_cutlass_moe_problem *p,
                                                              size_t *bytes, mg_plugin_error *err) {
    return mg_moe::unit_workspace<mg_moe_bf16::Unit>("mg_cutlass_moe_sm90_bf16_workspace", p, bytes,
                                                     err);
}

MG_PLUGIN_EXPORT mg_status mg_cutlass_moe_sm90_bf16_run(const mg_cutlass_moe_problem *p,
                                                        void *stream, mg_plugin_error *err) {
    return mg_moe::unit_run<mg_moe_bf16::Unit>("mg_cutlass_moe_sm90_bf16_run", p, stream, err);
}
