/* test_nvfp4_moe_cpu.c - the NVFP4 format tools (metrale/nvfp4.h) and MoE routing helpers
 * (metrale/ops_moe.h) on the CPU backend: importers, helpers and both check groups
 * (nvfp4_moe_tests.h). */
#include "nvfp4_moe_tests.h"

int main(void) {
    test_seed();
    mg_backend *b = NULL;
    if (mg_backend_open(MG_BACKEND_CPU, 0, &b) != MG_OK) {
        fprintf(stderr, "FAIL: cpu backend: %s\n", mg_last_error());
        return 1;
    }
    return run_nvfp4_moe_tests(b);
}
