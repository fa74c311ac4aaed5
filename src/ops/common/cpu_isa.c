/* cpu_isa.c - run-time CPU feature detection for the fast CPU providers (cpu_isa.h). */
#include "cpu_isa.h"

#include <stdio.h>

bool mg_cpu_has_avx2(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    /* __builtin_cpu_supports initialises itself (__builtin_cpu_init runs from a constructor in
     * libgcc), and reads cached bits: cheap enough for every call's available hook. */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

bool mg_cpu_has_avx512(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    return mg_cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

bool mg_cpu_avx512_available(char *reason, size_t reason_bytes) {
    if (mg_cpu_has_avx512())
        return true;
    snprintf(reason, reason_bytes, "this CPU lacks AVX-512 F, BW or VL (or AVX2, FMA, F16C)");
    return false;
}

bool mg_cpu_avx2_available(char *reason, size_t reason_bytes) {
    if (mg_cpu_has_avx2())
        return true;
    snprintf(reason, reason_bytes, "this CPU lacks AVX2, FMA or F16C");
    return false;
}
