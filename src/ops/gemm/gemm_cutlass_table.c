/* gemm_cutlass_table.c - the measured BF16 GEMM shapes where CUTLASS beats cuBLASLt
 * (gemm_cutlass_table.h).
 *
 * How the rows are made: on an H200 (idle, default clocks) run
 *
 *     build/metrale-gpu bench gemm_providers
 *
 * which times, for every shape of `bench gemm` and the Llama-3-8B projections at M from 1 to
 * 8192, cuBLASLt and each CUTLASS configuration under graph replay with the weights rotated
 * past L2 (tools/metrale-gpu/bench_gemm_providers.c), and prints one C row per shape where a
 * CUTLASS configuration is faster than cuBLASLt by at least its --min-margin (default 3 %, above
 * the run-to-run noise of graph replay). Paste those rows below, merging adjacent M into one
 * range only where every M of the range was measured with the same winner. Re-measure after a
 * CUDA, cuBLASLt or CUTLASS upgrade.
 *
 * Measured on 2026-11-30 (H200, driver 580.159.04, CUDA 13.0, --iters 10 --m 1,8,64,256,1024,
 * 4096,8192 over the Llama-3-8B shapes; bench/results/2026-11-30-h200-cutlass.md): cuBLASLt won
 * 25 of the 28 shapes, by 1.2-2x at M <= 8 and by 12-26 % at M >= 4096. CUTLASS won three, all
 * at mid M: 256x4096x4096 by 18 %, 64x14336x4096 by 4 % and 256x4096x14336 by 5 %. Only the
 * first is kept; the other two margins are within what one 10-iteration run can tell apart. */
#include <string.h>

#include "gemm_cutlass_table.h"

static const mg_gemm_cutlass_row table[] = {
    /* {m_min, m_max, n, k, config, margin}: rows from `bench gemm_providers` go here. */
    {256, 256, 4096, 4096, MG_CUTLASS_DENSE_PINGPONG_64X128,
     1.18f},                                           /* cuBLASLt 17.7 us, CUTLASS 15.0 us */
    {0, 0, 0, 0, MG_CUTLASS_DENSE_COOP_128X128, 0.0f}, /* end (m_max 0 matches nothing) */
};

int mg_gemm_cutlass_table_lookup(uint32_t m, uint32_t n, uint32_t k) {
    for (const mg_gemm_cutlass_row *r = table; r->m_max; r++)
        if (m >= r->m_min && m <= r->m_max && n == r->n && k == r->k)
            return (int)r->config;
    return -1;
}

static const char *const config_names[MG_CUTLASS_DENSE_CONFIG_COUNT] = {
    [MG_CUTLASS_DENSE_COOP_128X128] = "coop_128x128",
    [MG_CUTLASS_DENSE_COOP_128X256] = "coop_128x256",
    [MG_CUTLASS_DENSE_PINGPONG_64X128] = "pingpong_64x128",
};

int mg_gemm_cutlass_config_count(void) {
    return MG_CUTLASS_DENSE_CONFIG_COUNT;
}

const char *mg_gemm_cutlass_config_name(int config) {
    return config >= 0 && config < MG_CUTLASS_DENSE_CONFIG_COUNT ? config_names[config] : "?";
}

int mg_gemm_cutlass_config_parse(const char *name) {
    for (int i = 0; name && i < MG_CUTLASS_DENSE_CONFIG_COUNT; i++)
        if (!strcmp(name, config_names[i]))
            return i;
    return -1;
}
