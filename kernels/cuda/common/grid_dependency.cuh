// grid_dependency.cuh - programmatic dependent launch from inside a kernel (metrale/launch.h,
// MG_LAUNCH_PROGRAMMATIC). A kernel launched with that flag calls grid_dependency_wait() before
// it reads anything earlier work on the stream writes and before its first store; what it loads
// before the wait must be data no earlier kernel writes (weights, scales). launch_dependents()
// lets the next programmatic kernel of the stream start its own independent loads. Both are
// no-ops below compute capability 9.0 and in kernels launched without the flag.
#ifndef METRALE_GRID_DEPENDENCY_CUH
#define METRALE_GRID_DEPENDENCY_CUH

__device__ __forceinline__ void grid_dependency_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#endif
