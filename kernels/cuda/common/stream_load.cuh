// stream_load.cuh - loads of data a kernel reads once (weights streamed from memory), past L1
// (L1::no_allocate), so they do not evict what the kernel reuses (activations, scales).
// load_stream / load_stream2 go through the non-coherent path (.nc): only for memory no kernel
// writes while this one runs. ptxas treats .nc data as invariant and may schedule those loads
// across griddepcontrol.wait and bar.sync (CUDA 13.0 moved a prefetch issued before the wait to
// after it), so a load that must be issued before the grid wait uses load_stream_ordered /
// load_stream_ordered2: the same bytes through the coherent path, which stays on its side of it.
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

__device__ __forceinline__ uint4 load_stream_ordered(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint2 load_stream_ordered2(const uint2 *p) {
    uint2 v;
    asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(p));
    return v;
}

#endif
