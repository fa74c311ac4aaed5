// stream_load.cuh - loads of data a kernel reads once (weights streamed from memory): through
// the non-coherent path and past L1 (ld.global.nc.L1::no_allocate), so they do not evict what
// the kernel reuses (activations, scales). Only for memory no kernel writes while it runs.
#ifndef METRALE_STREAM_LOAD_CUH
#define METRALE_STREAM_LOAD_CUH

#include <stdint.h>

__device__ __forceinline__ uint4 load_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint2 load_stream2(const uint2 *p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(p));
    return v;
}

#endif
