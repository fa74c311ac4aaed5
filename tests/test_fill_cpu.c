/* test_fill_cpu.c - mg_fill_uniform_bf16 and mg_amax_bf16 on the CPU backend (fill_test_body.h). */
#include "fill_test_body.h"

int main(void) {
    test_seed();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (b) {
        fill_test_run(b);
        mg_backend_close(b);
    }
    return test_finish();
}
