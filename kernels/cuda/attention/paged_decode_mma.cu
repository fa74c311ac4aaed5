// paged_decode_mma.cu - split-KV decode attention over BF16 pages with tensor-core MMAs
// (mma.sync m16n8k16), launched by src/ops/attention/attention_paged_decode.c. The FP8 pools'
// kernels are in paged_decode.cu; both share the schedule and the merge of split chunks
// (kernels/cuda/common/paged_decode_abi.h, paged_decode_merge.cuh).
//
// A decode step reads every cached key and value once; with GQA a KV head serves G query
// heads, so the G rows of a request and KV head (qo_len * G rows when a request has several new
// tokens) form one 16-row MMA tile: the scores of 16 keys cost D / 16 MMAs and their values
// D / 8 more, a few instructions per key and head where CUDA cores would need about a hundred.
// That keeps the SMs' issue slots free to stream keys at memory bandwidth.
//
// A CTA (4 warps) takes one work item: a 16-row block and a chunk of its keys. The chunk is
// cut into 16-key tiles dealt round-robin to the warps; each warp streams its tiles through its
// own ring of shared-memory stages with cp.async (K and V rows of 16 keys, XOR-swizzled so that
// ldmatrix reads are free of bank conflicts), loading page ids one tile ahead of the copies
// that need them, and keeps an online softmax over its tiles in registers (the FA2 layout: the
// score fragments become the A operand of the PV MMA). The warps then merge through shared
// memory, and the CTA writes the output, or a partial result that the last CTA of the chunk's
// group merges (paged_decode_merge.cuh).
#include <cuda_bf16.h>
#include <stdint.h>

#include "attention/paged_decode_merge.cuh"
#include "common/bf16.cuh"
#include "common/grid_dependency.cuh"
#include "common/mma_bf16.cuh"

namespace {

using namespace mg_decode;

constexpr int kWarps = MG_DECODE_MMA_THREADS / 32;
constexpr int kTile = 16; // keys per tile (the PV MMA's k)
constexpr int kRows = MG_DECODE_MMA_ROWS;

__device__ __forceinline__ uint32_t smem_address(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// c += a * b, m16n8k16, BF16 in, FP32 accumulate (common/mma_bf16.cuh), A as one array.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    ::mma_bf16(c, a[0], a[1], a[2], a[3], b0, b1);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][D] BF16 tile, swizzled.
template <int D> __device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
    return (uint32_t)(row * D * 2 + ((chunk ^ (row & 7)) * 16));
}

template <int D> struct Stages {
    // Shared memory per warp: kStages x (K tile, V tile), kTile x D BF16 each.
    static constexpr int kTileBytes = kTile * D * 2;
    static constexpr int kStages = MG_DECODE_MMA_SHARED_BYTES(D) / (kWarps * 2 * kTileBytes);
    static_assert(kStages >= 2, "at least double buffering");
};

template <int D>
__device__ __forceinline__ void decode_item_mma(const Args &p, const Schedule &sched,
                                                int item_index, uint32_t kv_head, char *smem,
                                                char *q_smem) {
    constexpr int kChunks = D / 8;                // 16-byte chunks per key row
    constexpr int kKeysPerPass = 32 / kChunks;    // keys one cp.async pass of a warp covers
    constexpr int kPasses = kTile / kKeysPerPass; // passes per tile
    constexpr int kStages = Stages<D>::kStages;
    constexpr int kTileBytes = Stages<D>::kTileBytes;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;

    const Item it = load_item(p, sched, item_index, kv_head);

    // This lane's two rows (g and g + 8): their visible keys [lo, hi].
    int lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
        it.row_range(p, it.row_begin + g + 8 * h, lo[h], hi[h]);

    const float scale = p.soft_cap > 0.0f ? p.sm_scale / p.soft_cap : p.sm_scale * kLog2e;
    const float cap_log2 = p.soft_cap * kLog2e;

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            o[n][e] = 0.0f;
    float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};

    const int tiles = (it.token_end - it.token_begin + kTile - 1) / kTile;
    const int my_tiles = tiles > warp ? (tiles - warp + kWarps - 1) / kWarps : 0;
    char *ring = smem + (size_t)warp * kStages * 2 * kTileBytes;
    const size_t token_stride = (size_t)p.num_kv_heads * D;

    // Page lookup, two tiles ahead of the copies that need it (two register sets, by tile
    // parity): lane l (mod 16) holds the page id and slot of key l of the tile; -1 past the
    // chunk.
    int32_t page_id[2] = {-1, -1}, page_slot[2] = {0, 0};
    auto lookup = [&](int k) {
        const int key = it.token_begin + (warp + k * kWarps) * kTile + (lane % kTile);
        int32_t id = -1, slot = 0;
        if (k < my_tiles && key < it.token_end) {
            const uint32_t page = fast_div((uint32_t)key, p.page_div_mul, p.page_div_shift);
            slot = (int32_t)((uint32_t)key - page * p.page_size);
            id = __ldg(p.kv_indices + it.page_begin + page);
        }
        if (k & 1)
            page_id[1] = id, page_slot[1] = slot;
        else
            page_id[0] = id, page_slot[0] = slot;
    };
    auto issue = [&](int k) {
        char *k_tile = ring + (k % kStages) * 2 * kTileBytes, *v_tile = k_tile + kTileBytes;
        const int32_t my_id = (k & 1) ? page_id[1] : page_id[0];
        const int32_t my_slot = (k & 1) ? page_slot[1] : page_slot[0];
#pragma unroll
        for (int pass = 0; pass < kPasses; pass++) {
            const int key = pass * kKeysPerPass + lane / kChunks, chunk = lane % kChunks;
            const int32_t id = __shfl_sync(0xffffffffu, my_id, key);
            const int32_t slot = __shfl_sync(0xffffffffu, my_slot, key);
            const size_t element = id >= 0 ? ((size_t)id * p.page_size + slot) * token_stride +
                                                 (size_t)kv_head * D + chunk * 8
                                           : 0;
            const uint32_t to = tile_offset<D>(key, chunk);
            copy_async<16>(k_tile + to, reinterpret_cast<const char *>(p.k_pages) + 2 * element,
                           id >= 0);
            copy_async<16>(v_tile + to, reinterpret_cast<const char *>(p.v_pages) + 2 * element,
                           id >= 0);
        }
        copy_commit();
    };

    lookup(0);
    lookup(1);
#pragma unroll
    for (int k = 0; k < kStages - 1; k++) {
        if (k < my_tiles) {
            issue(k);
            lookup(k + 2);
        } else {
            copy_commit();
        }
    }
    // The Q tile [16 rows][D] (zeros past the block's rows), swizzled like the key tiles, loaded
    // while the first key tiles are in flight.
    for (int c = threadIdx.x; c < kRows * kChunks; c += kWarps * 32) {
        const int r = c / kChunks, chunk = c % kChunks;
        const int row = it.row_begin + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row < it.rows_total)
            v = *reinterpret_cast<const uint4 *>(p.q + it.q_offset(p, row) * D + chunk * 8);
        *reinterpret_cast<uint4 *>(q_smem + tile_offset<D>(r, chunk)) = v;
    }
    __syncthreads();

    const uint32_t q_base = smem_address(q_smem);
    for (int k = 0; k < my_tiles; k++) {
        copy_wait<kStages - 2>(); // this lane's copies of tile k have landed
        __syncwarp();             // ... and every lane's (ldmatrix reads across lanes)
        // Refill the stage read in the previous iteration (the warp is past those reads).
        const int ahead = k + kStages - 1;
        if (ahead < my_tiles) {
            issue(ahead);
            lookup(ahead + 2);
        } else {
            copy_commit();
        }
        const int stage = k % kStages;
        const uint32_t k_base = smem_address(ring + stage * 2 * kTileBytes);
        const uint32_t v_base = k_base + kTileBytes;

        // S = Q K^T for the tile's 16 keys: two n-blocks of 8 keys.
        // Fragments are loaded kGroup k-steps at a time before their MMAs, so the loads are in
        // flight together.
        constexpr int kGroup = D / 16 < 4 ? D / 16 : 4;
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int k0 = 0; k0 < D / 16; k0 += kGroup) {
            uint32_t a[kGroup][4], b[kGroup][4];
#pragma unroll
            for (int j = 0; j < kGroup; j++) {
                ldmatrix_x4(a[j], q_base + tile_offset<D>((lane % 8) + ((lane / 8) % 2) * 8,
                                                          (k0 + j) * 2 + lane / 16));
                ldmatrix_x4(b[j], k_base + tile_offset<D>((lane % 8) + (lane / 16) * 8,
                                                          (k0 + j) * 2 + (lane / 8) % 2));
            }
#pragma unroll
            for (int j = 0; j < kGroup; j++) {
                mma_bf16(s[0], a[j], b[j][0], b[j][1]);
                mma_bf16(s[1], a[j], b[j][2], b[j][3]);
            }
        }

        // Online softmax over the tile, rows g (h = 0) and g + 8 (h = 1).
        const int tile_key = it.token_begin + (warp + k * kWarps) * kTile;
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float tile_max = kNegInf;
#pragma unroll
            for (int nb = 0; nb < 2; nb++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = tile_key + nb * 8 + 2 * t4 + e;
                    float x = s[nb][2 * h + e];
                    x = p.soft_cap > 0.0f ? cap_log2 * fast_tanh(x * scale) : x * scale;
                    if (key >= it.token_end || key < lo[h] || key > hi[h])
                        x = kNegInf;
                    s[nb][2 * h + e] = x;
                    tile_max = fmaxf(tile_max, x);
                }
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
            const float m_new = fmaxf(m[h], tile_max);
            if (m_new == kNegInf) {
                alpha[h] = 1.0f;
#pragma unroll
                for (int nb = 0; nb < 2; nb++)
                    s[nb][2 * h] = s[nb][2 * h + 1] = 0.0f;
            } else {
                alpha[h] = exp2f(m[h] - m_new);
                float sum = 0.0f;
#pragma unroll
                for (int nb = 0; nb < 2; nb++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float pe = exp2f(s[nb][2 * h + e] - m_new);
                        s[nb][2 * h + e] = pe;
                        sum += pe;
                    }
                l[h] = l[h] * alpha[h] + sum;
                m[h] = m_new;
            }
        }
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        // O += P V: P (16 rows x 16 keys) from the score fragments.
        const uint32_t pa[4] = {
            mg_num_bf16_pack(s[0][0], s[0][1]), mg_num_bf16_pack(s[0][2], s[0][3]),
            mg_num_bf16_pack(s[1][0], s[1][1]), mg_num_bf16_pack(s[1][2], s[1][3])};
#pragma unroll
        for (int n0 = 0; n0 < D / 8; n0 += 2 * kGroup) {
            uint32_t b[kGroup][4];
#pragma unroll
            for (int j = 0; j < kGroup; j++)
                ldmatrix_x4_trans(b[j], v_base + tile_offset<D>((lane % 8) + ((lane / 8) % 2) * 8,
                                                                n0 + 2 * j + lane / 16));
#pragma unroll
            for (int j = 0; j < kGroup; j++) {
                mma_bf16(o[n0 + 2 * j], pa, b[j][0], b[j][1]);
                mma_bf16(o[n0 + 2 * j + 1], pa, b[j][2], b[j][3]);
            }
        }
    }
    copy_wait<0>();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    __syncthreads(); // every warp is done with its ring: it becomes the merge scratch

    // Each warp's [16 rows][D] output and (max, sum) per row, then the CTA's merge.
    float *scratch_o = reinterpret_cast<float *>(smem);
    float *scratch_ml = scratch_o + kWarps * kRows * D;
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float *dst = scratch_o + (warp * kRows + g + 8 * h) * D + n * 8 + 2 * t4;
            dst[0] = o[n][2 * h];
            dst[1] = o[n][2 * h + 1];
        }
    if (t4 == 0)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            scratch_ml[(warp * kRows + g + 8 * h) * 2] = m[h];
            scratch_ml[(warp * kRows + g + 8 * h) * 2 + 1] = l[h];
        }
    __syncthreads();
    finish_item<D, kRows, kWarps>(p, it, item_index, kv_head, scratch_o, scratch_ml,
                                  reinterpret_cast<float *>(smem), 1.0f);
}

template <int D> __device__ void decode_kernel_mma(const mg_decode_params &params) {
    extern __shared__ __align__(128) char smem[]; // MG_DECODE_MMA_SHARED_BYTES(D)
    __shared__ __align__(128) char q_smem[kRows * D * 2];
    const Args p(params);
    const Schedule sched = schedule_of(params);
    for (int item = blockIdx.x; item < sched.num_items; item += gridDim.x)
        decode_item_mma<D>(p, sched, item, blockIdx.y, smem, q_smem);
}

} // namespace

#define MG_PAGED_DECODE_MMA_KERNEL(D)                                                              \
    extern "C" __global__ void __launch_bounds__(MG_DECODE_MMA_THREADS)                            \
        paged_decode_bf16_d##D(const mg_decode_params p) {                                         \
        grid_dependency_wait();                                                                    \
        decode_kernel_mma<D>(p);                                                                   \
    }

MG_PAGED_DECODE_MMA_KERNEL(64)
MG_PAGED_DECODE_MMA_KERNEL(128)
MG_PAGED_DECODE_MMA_KERNEL(256)
