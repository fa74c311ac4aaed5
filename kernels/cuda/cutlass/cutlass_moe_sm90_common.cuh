// cutlass_moe_sm90_common.cuh - what the Hopper grouped MoE GEMM units share
// (cutlass_moe_sm90.h): the workspace carve, the per-expert argument rule, the row gather and the
// driving of one CUTLASS pointer-array grouped GEMM. Each unit instantiates it for its kind.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "cutlass_moe_sm90.h"

namespace mg_moe {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using ExpertShape = ProblemShape::UnderlyingProblemShape;

// Every carved range starts at a multiple of 256 bytes from the (256-byte aligned) workspace:
// TMA wants 16-byte aligned operands and 128-byte aligned descriptors.
constexpr size_t kCarveAlign = 256;

// Cuts consecutive ranges out of a workspace; with a null base it only counts (the sizing).
struct Carver {
    char *base;
    size_t used = 0;
    template <class T> T *take(size_t count) {
        size_t at = used;
        used = (used + count * sizeof(T) + kCarveAlign - 1) / kCarveAlign * kCarveAlign;
        return base ? reinterpret_cast<T *>(base + at) : nullptr;
    }
};

// The rows of expert e: offsets clamped into [0, rows] and made non-decreasing, so bad routing
// can neither fault nor overlap (metrale/ops_moe_gemm.h).
__device__ inline void expert_rows(const int32_t *offsets, uint32_t rows, uint32_t e,
                                   uint32_t *begin, uint32_t *count) {
    int64_t lo = offsets[e], hi = offsets[e + 1];
    lo = lo < 0 ? 0 : (lo > rows ? rows : lo);
    hi = hi < lo ? lo : (hi > rows ? rows : hi);
    *begin = (uint32_t)lo;
    *count = (uint32_t)(hi - lo);
}

// The activation row of grouped row r, clamped into [0, act_rows).
__device__ inline uint32_t source_row(const mg_cutlass_moe_problem &p, uint32_t r) {
    int64_t src = p.token_ids ? (int64_t)p.token_ids[r] : (int64_t)r;
    return (uint32_t)(src < 0 ? 0 : (src >= p.act_rows ? p.act_rows - 1 : src));
}

// A row-major stride (ld, 1, 0) of CUTLASS's pointer-array form for one operand.
template <class Stride> __device__ inline Stride row_stride(int64_t ld) {
    Stride s{};
    cute::get<0>(s) = ld;
    return s;
}

template <class Gemm> struct ExpertArgs {
    using ElementA = typename Gemm::ElementA;
    using ElementB = typename Gemm::ElementB;
    using ElementD = typename Gemm::EpilogueOutputOp::ElementOutput;
    using StrideA = typename Gemm::GemmKernel::InternalStrideA;
    using StrideB = typename Gemm::GemmKernel::InternalStrideB;
    using StrideD = typename Gemm::GemmKernel::InternalStrideD;
    ExpertShape *shapes;
    const ElementA **ptr_a;
    const ElementB **ptr_b;
    ElementD **ptr_d;
    StrideA *stride_a;
    StrideB *stride_b;
    StrideD *stride_d;

    void carve(Carver &c, uint32_t experts) {
        shapes = c.take<ExpertShape>(experts);
        ptr_a = c.take<const ElementA *>(experts);
        ptr_b = c.take<const ElementB *>(experts);
        ptr_d = c.take<ElementD *>(experts);
        stride_a = c.take<StrideA>(experts);
        stride_b = c.take<StrideB>(experts);
        stride_d = c.take<StrideD>(experts);
    }

    // Expert e's arguments: an expert without rows is an (0, n_w, k) problem, which the
    // grouped kernel's tile scheduler skips. A is the gathered [rows, k] block.
    __device__ void write(const mg_cutlass_moe_problem &p, const ElementA *gathered,
                          uint32_t e) const {
        uint32_t begin, count;
        expert_rows(p.expert_offsets, p.rows, e, &begin, &count);
        shapes[e] = ExpertShape{(int)count, (int)p.n_w, (int)p.k};
        ptr_a[e] = gathered + (size_t)begin * p.k;
        ptr_b[e] = static_cast<const ElementB *>(p.weight) + (size_t)e * p.n_w * p.k;
        ptr_d[e] = static_cast<ElementD *>(p.d) + (size_t)begin * p.ldd;
        stride_a[e] = row_stride<StrideA>(p.k);
        stride_b[e] = row_stride<StrideB>(p.k);
        stride_d[e] = row_stride<StrideD>(p.ldd);
    }
};

// The grouped GEMM's arguments: `experts` groups with their shapes in device memory (no host
// copy, so nothing is read back), the persistent grid sized for `sms` multiprocessors, out =
// the accumulator (alpha 1, no C operand).
template <class Gemm>
typename Gemm::Arguments
grouped_arguments(const mg_cutlass_moe_problem &p, const ExpertArgs<Gemm> &g,
                  const typename Gemm::GemmKernel::MainloopArguments &mainloop, int device,
                  int sms) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = sms;
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                  {(int)p.experts, g.shapes, nullptr},
                                  mainloop,
                                  {{}, nullptr, nullptr, g.ptr_d, g.stride_d},
                                  hw};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    return args;
}

inline mg_status cuda_check(mg_plugin_error *err, cudaError_t e, const char *call) {
    return e == cudaSuccess ? MG_OK : mg_plugin_cuda_fail(err, e, call);
}

inline mg_status current_sm_count(mg_plugin_error *err, int *device, int *sms) {
    mg_status st = cuda_check(err, cudaGetDevice(device), "cudaGetDevice");
    if (!st)
        st = cuda_check(err, cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *device),
                        "cudaDeviceGetAttribute(multiprocessors)");
    return st;
}

// Whether CUTLASS can run `args` (nothing is launched): MG_ERR_UNSUPPORTED with its reason.
template <class Gemm>
mg_status check(Gemm &gemm, typename Gemm::Arguments &args, mg_plugin_error *err,
                const char *what) {
    cutlass::Status s = gemm.can_implement(args);
    if (s != cutlass::Status::kSuccess)
        return mg_plugin_fail(err, MG_ERR_UNSUPPORTED, 0, "%s: CUTLASS refuses the problem: %s",
                              what, cutlass::cutlassGetStatusString(s));
    return MG_OK;
}

// Initializes and launches checked `args` on `stream` with `workspace` (capture-safe: the
// initialization writes the TMA descriptors into the workspace with stream-ordered work).
template <class Gemm>
mg_status launch(Gemm &gemm, typename Gemm::Arguments &args, void *workspace, cudaStream_t stream,
                 mg_plugin_error *err, const char *what) {
    cutlass::Status s = gemm.initialize(args, workspace, stream);
    if (s == cutlass::Status::kSuccess)
        s = gemm.run(stream);
    if (s != cutlass::Status::kSuccess) {
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return mg_plugin_cuda_fail(err, e, what);
        return mg_plugin_fail(err, MG_ERR_DEVICE, 0, "%s: CUTLASS: %s", what,
                              cutlass::cutlassGetStatusString(s));
    }
    return cuda_check(err, cudaGetLastError(), what);
}

// Blocks of the gather kernels: enough to fill an H200 with 16-byte copies, no more.
inline unsigned gather_blocks(size_t vectors) {
    size_t blocks = (vectors + 255) / 256;
    return (unsigned)(blocks < 1 ? 1 : (blocks > 2048 ? 2048 : blocks));
}

// The two entry points of a unit. `Unit` provides: Gemm; kKind (MG_CUTLASS_MOE_*) and kWhat;
// Carve (with bytes and cutlass_workspace) and carve(p, base, device, sms), which cuts the
// workspace (base null: sizes only); prepare(p, carve, stream), which launches our kernel (gather
// or quantize, per-expert arguments); make_arguments(p, carve, device, sms).
template <class Unit>
mg_status unit_workspace(const char *call, const mg_cutlass_moe_problem *p, size_t *bytes,
                         mg_plugin_error *err) {
    return mg_plugin_guarded(call, "CUTLASS", err, [&] {
        int device, sms;
        mg_status st = current_sm_count(err, &device, &sms);
        if (!st)
            *bytes = Unit::carve(*p, nullptr, device, sms).bytes;
        return st;
    });
}

template <class Unit>
mg_status unit_run(const char *call, const mg_cutlass_moe_problem *p, void *stream,
                   mg_plugin_error *err) {
    return mg_plugin_guarded(call, "CUTLASS", err, [&] {
        if (p->kind != Unit::kKind)
            return mg_plugin_fail(err, MG_ERR_UNSUPPORTED, 0, "%s: kind %u is not this unit's",
                                  Unit::kWhat, p->kind);
        int device, sms;
        mg_status st = current_sm_count(err, &device, &sms);
        if (st)
            return st;
        typename Unit::Carve c = Unit::carve(*p, static_cast<char *>(p->workspace), device, sms);
        if (c.bytes > p->workspace_bytes)
            return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0,
                                  "%s: workspace of %zu bytes, %zu needed", Unit::kWhat,
                                  p->workspace_bytes, c.bytes);
        // CUTLASS's verdict first, so a refused problem launches and writes nothing.
        typename Unit::Gemm gemm;
        typename Unit::Gemm::Arguments args = Unit::make_arguments(*p, c, device, sms);
        if ((st = check(gemm, args, err, Unit::kWhat)))
            return st;
        cudaStream_t s = static_cast<cudaStream_t>(stream);
        Unit::prepare(*p, c, s);
        if ((st = cuda_check(err, cudaGetLastError(), Unit::kWhat)))
            return st;
        return launch(gemm, args, c.cutlass_workspace, s, err, Unit::kWhat);
    });
}

} // namespace mg_moe
