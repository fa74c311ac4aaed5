// copy_async.cuh - cp.async from global to shared memory (sm_80 and later) for our kernels:
// the copy, the commit of a group, and the wait for all but PENDING groups.
#ifndef METRALE_KERNELS_COMMON_COPY_ASYNC_CUH
#define METRALE_KERNELS_COMMON_COPY_ASYNC_CUH

#include <stdint.h>

// cp.async of BYTES (8 or 16) from global to shared memory; an invalid source copies zeros
// (source size 0: nothing is read). 16-byte copies bypass L1 (.cg); 8-byte ones cannot (.ca).
template <int BYTES>
__device__ __forceinline__ void copy_async(char *dst, const char *src, bool valid) {
    const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    const int src_bytes = valid ? BYTES : 0;
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src),
                     "r"(src_bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(to), "l"(src),
                     "r"(src_bytes));
}

__device__ __forceinline__ void copy_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int PENDING> __device__ __forceinline__ void copy_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

#endif
