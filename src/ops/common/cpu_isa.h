/*
 * cpu_isa.h - shared by the ops' fast CPU providers: which vector extensions this CPU has,
 * detected once at run time (__builtin_cpu_supports), so one binary built for the baseline
 * x86-64 (or any other architecture) runs everywhere and uses AVX2 where it is present.
 *
 * A provider whose code is compiled with __attribute__((target("avx2,fma,f16c"))) may call it
 * only when mg_cpu_has_avx2() is true: its available hook says so, and the op registry then
 * never chooses or accepts it (forcing it by name fails with the hook's reason).
 */
#ifndef METRALE_OPS_CPU_ISA_H
#define METRALE_OPS_CPU_ISA_H

#include <stdbool.h>
#include <stddef.h>

/* AVX2, FMA and F16C together (every x86 CPU with AVX2 since 2013 has all three). False on
 * other architectures and on compilers without the target attribute. */
bool mg_cpu_has_avx2(void);

/* The providers' available hook for code that needs mg_cpu_has_avx2(): the reason on false. */
bool mg_cpu_avx2_available(char *reason, size_t reason_bytes);

/* AVX-512 F, BW and VL on top of mg_cpu_has_avx2() (code compiled with
 * target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")), and its available hook. */
bool mg_cpu_has_avx512(void);
bool mg_cpu_avx512_available(char *reason, size_t reason_bytes);

#endif
