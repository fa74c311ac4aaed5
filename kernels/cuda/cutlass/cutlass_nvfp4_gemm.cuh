// cutlass_nvfp4_gemm.cuh - the Blackwell NVFP4 GEMMs of one architecture, included once by its
// unit (cutlass_nvfp4_sm100.cu, cutlass_nvfp4_sm120.cu), which defines MG_NVFP4_ARCH_NS first
// (its own namespace, so the two units' kernels and host stubs never meet at link time), then
// DenseGemm and GroupedGemm in it from BlockScaledGemms, then expands
// MG_CUTLASS_NVFP4_ENTRY_POINTS(arch).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <type_traits>

#include <cutlass/cutlass.h>

#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/util/packed_stride.hpp>

#include "bf16.cuh"
#include "cutlass_nvfp4_common.cuh"
#include "fp4_e2m1.cuh"
#include "fp8_e4m3.cuh"

namespace MG_NVFP4_ARCH_NS {

using namespace mg_nvfp4_cutlass;

constexpr int kThreads = 256;

// ---------------------------------------------------------------- activation quantizer

// max finite |x| of the activation into *amax_bits (FP32 bits; non-negative floats order as
// unsigned integers). 8 values per thread; act_pitch a multiple of 8, act 16-byte aligned.
__global__ void act_amax_kernel(const uint4 *act, uint32_t rows, uint32_t k, uint32_t pitch,
                                uint32_t *amax_bits) {
    const uint32_t per_row = k / 8;
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    float m = 0.f;
    if (i < (uint64_t)rows * per_row) {
        const uint64_t r = i / per_row, c = i % per_row;
        const uint4 v = act[(r * pitch) / 8 + c];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        for (int j = 0; j < 4; ++j) {
            const float lo = fabsf(mg_num_bf16_to_f32(w[j] & 0xffffu));
            const float hi = fabsf(mg_num_bf16_to_f32(w[j] >> 16));
            if (isfinite(lo))
                m = fmaxf(m, lo);
            if (isfinite(hi))
                m = fmaxf(m, hi);
        }
    }
    for (int o = 16; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0 && m > 0.f)
        atomicMax(amax_bits, __float_as_uint(m));
}

// mg_nvfp4_global_scale_from_amax: amax / (448 * 6), or 1 when amax is not > 0 or not finite.
__device__ inline float global_from_amax(float amax) {
    return (amax > 0.f && isfinite(amax)) ? amax / 2688.f : 1.f;
}

// The block scale code of scale s (0 when s is not > 0, NaN included).
__device__ inline uint8_t e4m3_code(float s) {
    return s > 0.f ? (uint8_t)mg_num_f32_to_fp8_e4m3(s) : 0;
}

struct QuantizeParams {
    const uint16_t *act;
    uint32_t act_rows, k, pitch, rows, experts;
    const int32_t *sorted_token_ids; // grouped only, or NULL
    const int32_t *expert_offsets;   // grouped only, NULL for dense
    const float *w_global;
    const uint32_t *amax_bits;
    float *alpha;
    uint8_t *codes, *scales;
};

__device__ inline uint32_t clamped_offset(const int32_t *offsets, uint32_t e, uint32_t rows) {
    const int32_t o = offsets[e];
    return o < 0 ? 0u : ((uint32_t)o > rows ? rows : (uint32_t)o);
}

// One thread per 16-value block of an output row: the rule of metrale/nvfp4.h with the global
// multiplier taken from the activation's amax. Grouped: row r belongs to the expert e with
// offsets[e] <= r < offsets[e + 1] and reads activation row sorted_token_ids[r] (zeros when that
// is outside the activation); its scales go to expert e's own tiles.
__global__ void act_quantize_kernel(QuantizeParams p) {
    const uint32_t blocks = p.k / 16;
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const float global = global_from_amax(__uint_as_float(*p.amax_bits));
    if (i < p.experts)
        p.alpha[i] = global * p.w_global[i];
    if (i >= (uint64_t)p.rows * blocks)
        return;
    const uint32_t r = (uint32_t)(i / blocks), b = (uint32_t)(i % blocks);
    uint32_t sf_row = r, src = r;
    if (p.expert_offsets) {
        uint32_t lo = 0, hi = p.experts - 1; // the last e with offsets[e] <= r
        while (lo < hi) {
            const uint32_t mid = (lo + hi + 1) / 2;
            if (clamped_offset(p.expert_offsets, mid, p.rows) <= r)
                lo = mid;
            else
                hi = mid - 1;
        }
        const uint32_t begin = clamped_offset(p.expert_offsets, lo, p.rows);
        if (r < begin || r >= clamped_offset(p.expert_offsets, lo + 1, p.rows))
            return;
        sf_row = moe_sf_row_base(begin, lo) + (r - begin);
        if (p.sorted_token_ids) {
            const int32_t t = p.sorted_token_ids[r];
            src = (t >= 0 && (uint32_t)t < p.act_rows) ? (uint32_t)t : UINT32_MAX;
        }
    }
    uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (src != UINT32_MAX) {
        const uint4 *in = reinterpret_cast<const uint4 *>(p.act + (size_t)src * p.pitch + b * 16);
        const uint4 v0 = in[0], v1 = in[1];
        w[0] = v0.x;
        w[1] = v0.y;
        w[2] = v0.z;
        w[3] = v0.w;
        w[4] = v1.x;
        w[5] = v1.y;
        w[6] = v1.z;
        w[7] = v1.w;
    }
    float x[16], amax = 0.f;
    for (int j = 0; j < 8; ++j) {
        x[2 * j] = mg_num_bf16_to_f32(w[j] & 0xffffu);
        x[2 * j + 1] = mg_num_bf16_to_f32(w[j] >> 16);
    }
    for (int j = 0; j < 16; ++j)
        if (isfinite(x[j]))
            amax = fmaxf(amax, fabsf(x[j]));
    const uint8_t scale = e4m3_code((amax / 6.f) / global);
    const float d = mg_num_fp8_e4m3_to_f32(scale) * global;
    uint32_t packed[2] = {0, 0};
    if (scale != 0) {
        for (int j = 0; j < 16; ++j) {
            const float m = fabsf(x[j]) / d;
            const uint32_t c = mg_num_e2m1_magnitude_code(m);
            const uint32_t nib = c == 0 ? 0u : (c | (signbit(x[j]) ? 8u : 0u));
            packed[j / 8] |= nib << (4 * (j % 8));
        }
    }
    *reinterpret_cast<uint2 *>(p.codes + (size_t)r * (p.k / 2) + b * 8) =
        make_uint2(packed[0], packed[1]);
    p.scales[sf_offset(sf_row, b, blocks)] = scale;
}

// out = silu(gate) * up, 8 BF16 per thread (pitches multiples of 8, rows 16-byte aligned).
__global__ void silu_mul_kernel(const uint4 *gate, const uint4 *up, uint32_t in_pitch, uint4 *out,
                                uint32_t ldc, uint32_t rows, uint32_t n) {
    const uint32_t per_row = (n + 7) / 8;
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (uint64_t)rows * per_row)
        return;
    const uint64_t r = i / per_row, c = i % per_row;
    const uint4 g = gate[r * (in_pitch / 8) + c], u = up[r * (in_pitch / 8) + c];
    const uint32_t gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w};
    uint32_t ow[4];
    for (int j = 0; j < 4; ++j) {
        uint32_t packed = 0;
        for (int h = 0; h < 2; ++h) {
            const float x = mg_num_bf16_to_f32((gw[j] >> (16 * h)) & 0xffffu);
            const float y = mg_num_bf16_to_f32((uw[j] >> (16 * h)) & 0xffffu);
            const float v = x / (1.f + __expf(-x)) * y;
            packed |= mg_num_f32_to_bf16(v) << (16 * h);
        }
        ow[j] = packed;
    }
    const uint32_t valid = n - (uint32_t)c * 8; // the last vector of a row may be partial
    uint4 *dst = out + r * (ldc / 8) + c;
    if (valid >= 8) {
        *dst = make_uint4(ow[0], ow[1], ow[2], ow[3]);
    } else {
        uint16_t *d16 = reinterpret_cast<uint16_t *>(dst);
        for (uint32_t j = 0; j < valid; ++j)
            d16[j] = (uint16_t)(ow[j / 2] >> (16 * (j % 2)));
    }
}

mg_status silu_mul(const void *gate, const void *up, uint32_t in_pitch, void *out, uint32_t ldc,
                   uint32_t rows, uint32_t n, cudaStream_t stream, const char *call,
                   mg_plugin_error *err) {
    err->cuda_error = 0;
    err->message[0] = '\0';
    if (!gate || !up || !out || !rows || !n || in_pitch < n || ldc < n || in_pitch % 8 || ldc % 8)
        return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0, "%s: bad arguments", call);
    const uint64_t threads = (uint64_t)rows * ((n + 7) / 8);
    silu_mul_kernel<<<(unsigned)((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        static_cast<const uint4 *>(gate), static_cast<const uint4 *>(up), in_pitch,
        static_cast<uint4 *>(out), ldc, rows, n);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? MG_OK : mg_plugin_cuda_fail(err, e, call);
}

// One thread per byte of an expert's 128x4 scales: sf_position picks the canonical scale it
// holds; padding bytes get 0.
__global__ void prepare_scales_kernel(const uint8_t *in, uint8_t *out, uint32_t n, uint32_t k,
                                      uint32_t experts, size_t out_stride) {
    const uint32_t cols = k / 16;
    const size_t per_expert = sf_bytes(n, k);
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= per_expert * experts)
        return;
    const uint64_t e = i / per_expert, o = i % per_expert;
    uint32_t row, col;
    sf_position(o, cols, &row, &col);
    uint8_t v = 0;
    if (row < n && col < cols) {
        v = in[(e * n + row) * cols + col] & 0x7fu;
        if (v == 0x7fu)
            v = 0;
    }
    out[e * out_stride + o] = v;
}

mg_status prepare(const void *codes, const void *scales, uint32_t n, uint32_t k, uint32_t experts,
                  void *values, size_t values_stride, void *scales_out, size_t scales_stride,
                  cudaStream_t stream, const char *call, mg_plugin_error *err) {
    err->cuda_error = 0;
    err->message[0] = '\0';
    const size_t code_bytes = (size_t)n * (k / 2);
    if (!codes || !scales || !values || !scales_out || !n || !k || k % 16 || !experts ||
        values_stride < code_bytes || values_stride % 16 || scales_stride < sf_bytes(n, k) ||
        scales_stride % 16)
        return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0, "%s: bad arguments", call);
    cudaError_t e = cudaMemcpy2DAsync(values, values_stride, codes, code_bytes, code_bytes, experts,
                                      cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess)
        return mg_plugin_cuda_fail(err, e, "cudaMemcpy2DAsync");
    const uint64_t threads = sf_bytes(n, k) * experts;
    prepare_scales_kernel<<<(unsigned)((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        static_cast<const uint8_t *>(scales), static_cast<uint8_t *>(scales_out), n, k, experts,
        scales_stride);
    e = cudaGetLastError();
    return e == cudaSuccess ? MG_OK : mg_plugin_cuda_fail(err, e, call);
}

// ---------------------------------------------------------------- the GEMM types

// The dense and grouped GEMMs of one architecture: nv_float4_t<e2m1> A (row-major, the
// quantized activation) and B (column-major, i.e. the [n, k] K-major weight), FP32 accumulation,
// BF16 D, no C; one tile shape, no cluster; the schedules the unit names.
template <class Arch, class Tile, class DenseEpilogueSchedule, class DenseSchedule,
          class GroupedEpilogueSchedule, class GroupedSchedule>
struct BlockScaledGemms {
    using ElementAB = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
    using ElementD = cutlass::bfloat16_t;
    static constexpr int kAlignAB = 32; // 16 bytes of E2M1
    static constexpr int kAlignD = 8;   // 16 bytes of BF16
    using OpClass = cutlass::arch::OpClassBlockScaledTensorOp;
    using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;

    template <class LayoutA, class LayoutB, class LayoutD, class EpilogueSchedule, class Schedule>
    struct Collectives {
        using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
            Arch, OpClass, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float,
            float, void, LayoutD, kAlignD, ElementD, LayoutD, kAlignD,
            EpilogueSchedule>::CollectiveOp;
        using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
            Arch, OpClass, ElementAB, LayoutA, kAlignAB, ElementAB, LayoutB, kAlignAB, float, Tile,
            Cluster,
            cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
                sizeof(typename Epilogue::SharedStorage))>,
            Schedule>::CollectiveOp;
    };
    using DenseParts = Collectives<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor,
                                   cutlass::layout::RowMajor, DenseEpilogueSchedule, DenseSchedule>;
    using GroupedParts =
        Collectives<cutlass::layout::RowMajor *, cutlass::layout::ColumnMajor *,
                    cutlass::layout::RowMajor *, GroupedEpilogueSchedule, GroupedSchedule>;

    using Dense = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
        cute::Shape<int, int, int, int>, typename DenseParts::Mainloop,
        typename DenseParts::Epilogue, void>>;
    using Grouped =
        cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
            cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>,
            typename GroupedParts::Mainloop, typename GroupedParts::Epilogue>>;
};

// ---------------------------------------------------------------- CUTLASS argument types

template <class Gemm> struct DenseTypes {
    using Args = typename Gemm::Arguments;
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    static_assert(
        std::is_same_v<typename Gemm::GemmKernel::CollectiveMainloop::Sm1xxBlkScaledConfig,
                       SfConfig>,
        "the mainloop reads another scale-factor layout than cutlass_nvfp4_layout.cu");
};

template <class Gemm> struct GroupedTypes {
    using Args = typename Gemm::Arguments;
    using Kernel = typename Gemm::GemmKernel;
    using Shape = typename Kernel::ProblemShape::UnderlyingProblemShape;
    using StrideA = typename Kernel::InternalStrideA;
    using StrideB = typename Kernel::InternalStrideB;
    using StrideD = typename Kernel::InternalStrideD;
    using LayoutSFA = typename Kernel::CollectiveMainloop::InternalLayoutSFA;
    using LayoutSFB = typename Kernel::CollectiveMainloop::InternalLayoutSFB;
    using MainArgs = decltype(Args{}.mainloop);
    using PtrA = std::remove_pointer_t<decltype(MainArgs{}.ptr_A)>;
    using PtrB = std::remove_pointer_t<decltype(MainArgs{}.ptr_B)>;
    using PtrSF = std::remove_pointer_t<decltype(MainArgs{}.ptr_SFA)>;
    using PtrD = std::remove_pointer_t<decltype(Args{}.epilogue.ptr_D)>;
    static_assert(
        std::is_same_v<typename Kernel::CollectiveMainloop::Sm1xxBlkScaledConfig, SfConfig>,
        "the mainloop reads another scale-factor layout than cutlass_nvfp4_layout.cu");

    // The per-expert arrays, one after another in the workspace's group_args part.
    struct Arrays {
        Shape *shapes;
        PtrA *a;
        PtrB *b;
        PtrSF *sfa, *sfb;
        PtrD *d;
        StrideA *stride_a;
        StrideB *stride_b;
        StrideD *stride_d;
        LayoutSFA *layout_sfa;
        LayoutSFB *layout_sfb;
        const float **alpha;
    };
    static Arrays carve(uint8_t *base, uint32_t experts) {
        Arrays r;
        size_t at = 0;
        auto take = [&](auto *&p, size_t one) {
            p = reinterpret_cast<std::remove_reference_t<decltype(p)>>(base + at);
            at += round_up(one * experts, 16);
        };
        take(r.shapes, sizeof(Shape));
        take(r.a, sizeof(PtrA));
        take(r.b, sizeof(PtrB));
        take(r.sfa, sizeof(PtrSF));
        take(r.sfb, sizeof(PtrSF));
        take(r.d, sizeof(PtrD));
        take(r.stride_a, sizeof(StrideA));
        take(r.stride_b, sizeof(StrideB));
        take(r.stride_d, sizeof(StrideD));
        take(r.layout_sfa, sizeof(LayoutSFA));
        take(r.layout_sfb, sizeof(LayoutSFB));
        take(r.alpha, sizeof(float *));
        return r;
    }
    static constexpr size_t kPerExpert = sizeof(Shape) + sizeof(PtrA) + sizeof(PtrB) +
                                         3 * sizeof(void *) + sizeof(StrideA) + sizeof(StrideB) +
                                         sizeof(StrideD) + sizeof(LayoutSFA) + sizeof(LayoutSFB) +
                                         sizeof(void *) + 12 * 16 /* rounding of each array */;
    static_assert(kPerExpert <= kGroupArgBytesPerExpert,
                  "grouped arguments outgrow their workspace");
};

struct GroupSetup {
    const int32_t *expert_offsets;
    uint32_t rows, n, k, ldc, experts;
    const uint8_t *act_codes, *act_scales, *w_codes, *w_scales;
    size_t w_codes_stride, w_scales_stride;
    const float *alpha;
    __nv_bfloat16 *out;
};

// One thread per expert: its problem (rows_e x n x k; 0 rows for an empty expert, which the
// grouped scheduler gives no tile), operand pointers, strides and scale layouts.
template <class T> __global__ void group_args_kernel(GroupSetup s, typename T::Arrays a) {
    const uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= s.experts)
        return;
    const uint32_t begin = clamped_offset(s.expert_offsets, e, s.rows);
    const uint32_t end = clamped_offset(s.expert_offsets, e + 1, s.rows);
    const int m = end > begin ? (int)(end - begin) : 0;
    const int n = (int)s.n, k = (int)s.k;
    a.shapes[e] = typename T::Shape(m, n, k);
    a.a[e] = reinterpret_cast<typename T::PtrA>(s.act_codes + (size_t)begin * (s.k / 2));
    a.b[e] = reinterpret_cast<typename T::PtrB>(s.w_codes + (size_t)e * s.w_codes_stride);
    a.sfa[e] = reinterpret_cast<typename T::PtrSF>(
        s.act_scales + (size_t)moe_sf_row_base(begin, e) * round_up(s.k / 16, 4));
    a.sfb[e] = reinterpret_cast<typename T::PtrSF>(s.w_scales + (size_t)e * s.w_scales_stride);
    a.d[e] = reinterpret_cast<typename T::PtrD>(s.out + (size_t)begin * s.ldc);
    a.stride_a[e] =
        cutlass::make_cute_packed_stride(typename T::StrideA{}, cute::make_shape(m, k, 1));
    a.stride_b[e] =
        cutlass::make_cute_packed_stride(typename T::StrideB{}, cute::make_shape(n, k, 1));
    typename T::StrideD sd =
        cutlass::make_cute_packed_stride(typename T::StrideD{}, cute::make_shape(m, n, 1));
    cute::get<0>(sd) = (int64_t)s.ldc;
    a.stride_d[e] = sd;
    a.layout_sfa[e] = SfConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
    a.layout_sfb[e] = SfConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
    a.alpha[e] = s.alpha + e;
}

// ---------------------------------------------------------------- host side

mg_status cutlass_fail(mg_plugin_error *err, const char *call, cutlass::Status st) {
    return mg_plugin_fail(err, MG_ERR_INTERNAL, 0, "%s: CUTLASS: %s", call,
                          cutlassGetStatusString(st));
}

mg_status check_args(const mg_cutlass_nvfp4_args *a, bool grouped, const char *call,
                     mg_plugin_error *err) {
    if (!a || !a->act || !a->w_codes || !a->w_scales || !a->w_global || !a->out)
        return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0, "%s: null argument", call);
    if (a->rows == 0 || a->n == 0 || a->n % 8 || a->k == 0 || a->k % 32 || a->ldc < a->n ||
        a->ldc % 8 || a->act_pitch < a->k || a->act_pitch % 8 || a->experts == 0 ||
        a->act_rows == 0)
        return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0,
                              "%s: bad shape (rows %u n %u k %u experts %u act_pitch %u ldc %u)",
                              call, a->rows, a->n, a->k, a->experts, a->act_pitch, a->ldc);
    if (grouped ? !a->expert_offsets : (a->experts != 1 || a->act_rows != a->rows))
        return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0, "%s: bad routing arguments", call);
    if (grouped && (a->w_codes_stride < (size_t)a->n * (a->k / 2) || a->w_codes_stride % 16 ||
                    a->w_scales_stride < sf_bytes(a->n, a->k) || a->w_scales_stride % 16))
        return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0, "%s: bad expert strides %zu, %zu",
                              call, a->w_codes_stride, a->w_scales_stride);
    return MG_OK;
}

mg_status sm_count(int *count, mg_plugin_error *err) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, dev);
    return e == cudaSuccess ? MG_OK : mg_plugin_cuda_fail(err, e, "cudaDeviceGetAttribute");
}

template <class Gemm>
typename Gemm::Arguments dense_arguments(const mg_cutlass_nvfp4_args *a,
                                         const mg_cutlass_nvfp4_workspace_layout &w) {
    using T = DenseTypes<Gemm>;
    uint8_t *ws = static_cast<uint8_t *>(a->workspace);
    const int m = (int)a->rows, n = (int)a->n, k = (int)a->k;
    typename T::Args args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {m, n, k, 1};
    auto &ml = args.mainloop;
    ml.ptr_A = reinterpret_cast<decltype(ml.ptr_A)>(ws ? ws + w.act_codes : nullptr);
    ml.dA = cutlass::make_cute_packed_stride(typename T::StrideA{}, cute::make_shape(m, k, 1));
    ml.ptr_B = reinterpret_cast<decltype(ml.ptr_B)>(a->w_codes);
    ml.dB = cutlass::make_cute_packed_stride(typename T::StrideB{}, cute::make_shape(n, k, 1));
    ml.ptr_SFA = reinterpret_cast<decltype(ml.ptr_SFA)>(ws ? ws + w.act_scales : nullptr);
    ml.layout_SFA = SfConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
    ml.ptr_SFB = reinterpret_cast<decltype(ml.ptr_SFB)>(a->w_scales);
    ml.layout_SFB = SfConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
    auto &ep = args.epilogue;
    ep.thread.alpha = 1.f;
    ep.thread.alpha_ptr = ws ? reinterpret_cast<const float *>(ws + w.alpha) : nullptr;
    ep.thread.beta = 0.f;
    ep.ptr_C = nullptr;
    ep.ptr_D = reinterpret_cast<decltype(ep.ptr_D)>(a->out);
    typename T::StrideD sd =
        cutlass::make_cute_packed_stride(typename T::StrideD{}, cute::make_shape(m, n, 1));
    cute::get<0>(sd) = (int64_t)a->ldc;
    ep.dC = sd;
    ep.dD = sd;
    return args;
}

template <class Gemm>
typename Gemm::Arguments grouped_arguments(const mg_cutlass_nvfp4_args *a,
                                           const mg_cutlass_nvfp4_workspace_layout &w, int sms) {
    using T = GroupedTypes<Gemm>;
    uint8_t *ws = static_cast<uint8_t *>(a->workspace);
    typename T::Arrays arr = T::carve(ws ? ws + w.group_args : nullptr, a->experts);
    typename T::Args args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {(int)a->experts, arr.shapes, nullptr};
    auto &ml = args.mainloop;
    ml.ptr_A = const_cast<decltype(ml.ptr_A)>(arr.a);
    ml.dA = arr.stride_a;
    ml.ptr_B = const_cast<decltype(ml.ptr_B)>(arr.b);
    ml.dB = arr.stride_b;
    ml.ptr_SFA = const_cast<decltype(ml.ptr_SFA)>(arr.sfa);
    ml.layout_SFA = arr.layout_sfa;
    ml.ptr_SFB = const_cast<decltype(ml.ptr_SFB)>(arr.sfb);
    ml.layout_SFB = arr.layout_sfb;
    auto &ep = args.epilogue;
    ep.thread.alpha = 1.f;
    ep.thread.alpha_ptr = nullptr;
    ep.thread.alpha_ptr_array = arr.alpha;
    ep.thread.dAlpha = {cute::_0{}, cute::_0{}, 1};
    ep.thread.beta = 0.f;
    ep.thread.beta_ptr = nullptr;
    ep.ptr_C = nullptr;
    ep.dC = nullptr;
    ep.ptr_D = arr.d;
    ep.dD = arr.stride_d;
    args.hw_info.sm_count = sms;
    return args;
}

template <class Gemm, bool Grouped>
typename Gemm::Arguments arguments(const mg_cutlass_nvfp4_args *a,
                                   const mg_cutlass_nvfp4_workspace_layout &w, int sms) {
    if constexpr (Grouped)
        return grouped_arguments<Gemm>(a, w, sms);
    else
        return dense_arguments<Gemm>(a, w);
}

// Every entry point: exceptions turned into statuses, then the checks, the workspace layout and
// the SM count before `body(w, sms)`.
template <bool Grouped, class Body>
mg_status guarded_call(const mg_cutlass_nvfp4_args *a, const char *call, mg_plugin_error *err,
                       Body &&body) {
    return mg_plugin_guarded(call, "CUTLASS", err, [&]() -> mg_status {
        mg_status st = check_args(a, Grouped, call, err);
        if (st)
            return st;
        mg_cutlass_nvfp4_workspace_layout w;
        if (workspace_layout(a->rows, a->experts, a->k, Grouped, &w) != MG_OK)
            return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0, "%s: bad shape", call);
        int sms = 0;
        if ((st = sm_count(&sms, err)))
            return st;
        return body(w, sms);
    });
}

template <class Gemm, bool Grouped>
mg_status workspace_bytes(const mg_cutlass_nvfp4_args *a, size_t *bytes, const char *call,
                          mg_plugin_error *err) {
    return guarded_call<Grouped>(
        a, call, err, [&](const mg_cutlass_nvfp4_workspace_layout &w, int sms) -> mg_status {
            if (!bytes)
                return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0, "%s: null bytes", call);
            *bytes = w.fixed_bytes + Gemm::get_workspace_size(arguments<Gemm, Grouped>(a, w, sms));
            return MG_OK;
        });
}

// Zero the amax and the activation scales (their padding must read as 0), measure the amax,
// quantize, build the grouped arguments, then run CUTLASS: all on `stream`, nothing allocated,
// nothing waited for, so the call may be captured.
template <class Gemm, bool Grouped>
mg_status run(const mg_cutlass_nvfp4_args *a, cudaStream_t stream, const char *call,
              mg_plugin_error *err) {
    return guarded_call<Grouped>(
        a, call, err, [&](const mg_cutlass_nvfp4_workspace_layout &w, int sms) -> mg_status {
            uint8_t *ws = static_cast<uint8_t *>(a->workspace);
            if (!ws || (uintptr_t)ws % 256)
                return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0,
                                      "%s: workspace null or not 256-byte aligned", call);
            auto args = arguments<Gemm, Grouped>(a, w, sms);
            const size_t own = Gemm::get_workspace_size(args);
            if (a->workspace_bytes < w.fixed_bytes + own)
                return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0,
                                      "%s: workspace of %zu bytes, %zu needed", call,
                                      a->workspace_bytes, w.fixed_bytes + own);
            cudaError_t e = cudaMemsetAsync(ws + w.amax, 0, 4, stream);
            if (e == cudaSuccess)
                e = cudaMemsetAsync(ws + w.act_scales, 0, w.act_scale_bytes, stream);
            if (e != cudaSuccess)
                return mg_plugin_cuda_fail(err, e, "cudaMemsetAsync");

            const uint64_t vectors = (uint64_t)a->act_rows * (a->k / 8);
            act_amax_kernel<<<(unsigned)((vectors + kThreads - 1) / kThreads), kThreads, 0,
                              stream>>>(static_cast<const uint4 *>(a->act), a->act_rows, a->k,
                                        a->act_pitch, reinterpret_cast<uint32_t *>(ws + w.amax));
            QuantizeParams q;
            q.act = static_cast<const uint16_t *>(a->act);
            q.act_rows = a->act_rows;
            q.k = a->k;
            q.pitch = a->act_pitch;
            q.rows = a->rows;
            q.experts = a->experts;
            q.sorted_token_ids = Grouped ? a->sorted_token_ids : nullptr;
            q.expert_offsets = Grouped ? a->expert_offsets : nullptr;
            q.w_global = a->w_global;
            q.amax_bits = reinterpret_cast<const uint32_t *>(ws + w.amax);
            q.alpha = reinterpret_cast<float *>(ws + w.alpha);
            q.codes = ws + w.act_codes;
            q.scales = ws + w.act_scales;
            uint64_t threads = (uint64_t)a->rows * (a->k / 16);
            if (threads < a->experts)
                threads = a->experts;
            act_quantize_kernel<<<(unsigned)((threads + kThreads - 1) / kThreads), kThreads, 0,
                                  stream>>>(q);
            if constexpr (Grouped) {
                using T = GroupedTypes<Gemm>;
                GroupSetup g;
                g.expert_offsets = a->expert_offsets;
                g.rows = a->rows;
                g.n = a->n;
                g.k = a->k;
                g.ldc = a->ldc;
                g.experts = a->experts;
                g.act_codes = ws + w.act_codes;
                g.act_scales = ws + w.act_scales;
                g.w_codes = static_cast<const uint8_t *>(a->w_codes);
                g.w_scales = static_cast<const uint8_t *>(a->w_scales);
                g.w_codes_stride = a->w_codes_stride;
                g.w_scales_stride = a->w_scales_stride;
                g.alpha = reinterpret_cast<const float *>(ws + w.alpha);
                g.out = static_cast<__nv_bfloat16 *>(a->out);
                group_args_kernel<T><<<(a->experts + 127) / 128, 128, 0, stream>>>(
                    g, T::carve(ws + w.group_args, a->experts));
            }
            if ((e = cudaGetLastError()) != cudaSuccess)
                return mg_plugin_cuda_fail(err, e, "kernel launch");

            Gemm gemm;
            cutlass::Status cs = gemm.can_implement(args);
            if (cs != cutlass::Status::kSuccess)
                return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0,
                                      "%s: CUTLASS cannot run it: %s", call,
                                      cutlassGetStatusString(cs));
            cs = gemm.initialize(args, ws + w.cutlass, stream);
            if (cs == cutlass::Status::kSuccess)
                cs = gemm.run(stream);
            if (cs != cutlass::Status::kSuccess) {
                e = cudaGetLastError();
                if (e != cudaSuccess)
                    return mg_plugin_cuda_fail(err, e, call);
                return cutlass_fail(err, call, cs);
            }
            return MG_OK;
        });
}

} // namespace MG_NVFP4_ARCH_NS

// The entry points of one architecture, named mg_cutlass_nvfp4_<arch>_*.
#define MG_CUTLASS_NVFP4_ENTRY_POINTS(arch)                                                        \
    MG_PLUGIN_EXPORT mg_status mg_cutlass_nvfp4_##arch##_gemm_workspace(                           \
        const mg_cutlass_nvfp4_args *a, size_t *bytes, mg_plugin_error *err) {                     \
        return MG_NVFP4_ARCH_NS::workspace_bytes<MG_NVFP4_ARCH_NS::DenseGemm, false>(              \
            a, bytes, "mg_cutlass_nvfp4_" #arch "_gemm", err);                                     \
    }                                                                                              \
    MG_PLUGIN_EXPORT mg_status mg_cutlass_nvfp4_##arch##_moe_gemm_workspace(                       \
        const mg_cutlass_nvfp4_args *a, size_t *bytes, mg_plugin_error *err) {                     \
        return MG_NVFP4_ARCH_NS::workspace_bytes<MG_NVFP4_ARCH_NS::GroupedGemm, true>(             \
            a, bytes, "mg_cutlass_nvfp4_" #arch "_moe_gemm", err);                                 \
    }                                                                                              \
    MG_PLUGIN_EXPORT mg_status mg_cutlass_nvfp4_##arch##_gemm(                                     \
        const mg_cutlass_nvfp4_args *a, void *stream, mg_plugin_error *err) {                      \
        return MG_NVFP4_ARCH_NS::run<MG_NVFP4_ARCH_NS::DenseGemm, false>(                          \
            a, static_cast<cudaStream_t>(stream), "mg_cutlass_nvfp4_" #arch "_gemm", err);         \
    }                                                                                              \
    MG_PLUGIN_EXPORT mg_status mg_cutlass_nvfp4_##arch##_moe_gemm(                                 \
        const mg_cutlass_nvfp4_args *a, void *stream, mg_plugin_error *err) {                      \
        return MG_NVFP4_ARCH_NS::run<MG_NVFP4_ARCH_NS::GroupedGemm, true>(                         \
            a, static_cast<cudaStream_t>(stream), "mg_cutlass_nvfp4_" #arch "_moe_gemm", err);     \
    }                                                                                              \
    MG_PLUGIN_EXPORT mg_status mg_cutlass_nvfp4_##arch##_prepare(                                  \
        const void *codes, const void *scales, uint32_t n, uint32_t k, uint32_t experts,           \
        void *values, size_t values_stride, void *scales_out, size_t scales_stride, void *stream,  \
        mg_plugin_error *err) {                                                                    \
        return MG_NVFP4_ARCH_NS::prepare(                                                          \
            codes, scales, n, k, experts, values, values_stride, scales_out, scales_stride,        \
            static_cast<cudaStream_t>(stream), "mg_cutlass_nvfp4_" #arch "_prepare", err);         \
    }                                                                                              \
    MG_PLUGIN_EXPORT mg_status mg_cutlass_nvfp4_##arch##_silu_mul(                                 \
        const void *gate, const void *up, uint32_t in_pitch, void *out, uint32_t ldc,              \
        uint32_t rows, uint32_t n, void *stream, mg_plugin_error *err) {                           \
        return MG_NVFP4_ARCH_NS::silu_mul(gate, up, in_pitch, out, ldc, rows, n,                   \
                                          static_cast<cudaStream_t>(stream),                       \
                                          "mg_cutlass_nvfp4_" #arch "_silu_mul", err);             \
    }
