// test_kernels.cu - small kernels the CUDA backend's tests and benchmarks launch to check
// behaviour the production kernels do not exercise on purpose: device faults, large dynamic
// shared memory, module globals, long-running work and graph argument updates.
#include <stdint.h>

// Writes through `address`: given an unmapped address it raises CUDA_ERROR_ILLEGAL_ADDRESS,
// the sticky fault tests provoke (in a child process: the context is lost afterwards).
extern "C" __global__ void fault_kernel(uint32_t *address) {
    *(volatile uint32_t *)address = 0xdeadbeefu;
}

// out[i] = v for i < n: the kernel whose argument a graph update changes.
extern "C" __global__ void fill_u32(uint32_t *out, uint32_t v, uint32_t n) {
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = v;
}

// Busy for at least `ns` nanoseconds of the global timer: keeps a stream occupied so tests
// can observe work still pending (event queries, staging that must not wait for it).
extern "C" __global__ void spin_kernel(uint64_t ns) {
    uint64_t start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

// Uses `words` 32-bit words of dynamic shared memory (beyond 48 KiB when asked): fills it,
// then writes it back reversed, so every word must have been reachable.
extern "C" __global__ void shared_reverse(uint32_t *out, uint32_t words, uint32_t seed) {
    extern __shared__ uint32_t shared_words[];
    for (uint32_t i = threadIdx.x; i < words; i += blockDim.x)
        shared_words[i] = i * 2654435761u + seed;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < words; i += blockDim.x)
        out[i] = shared_words[words - 1 - i];
}

// A module global for the symbol round trip: host writes it, add_to_symbol adds to it.
__device__ uint32_t mg_test_symbol[64];

extern "C" __global__ void add_to_symbol(uint32_t v) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 64)
        mg_test_symbol[i] += v;
}
