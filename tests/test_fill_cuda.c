/* test_fill_cuda.c - mg_fill_uniform_bf16 and mg_amax_bf16 on the CUDA backend
 * (fill_test_body.h): the same bits as the host's definition. Skips (77) without a usable GPU. */
#include "fill_test_body.h"
#include "test_cuda_util.h"

int main(void) {
    mg_backend *b = cuda_test_open_or_skip("test_fill_cuda");
    test_seed();
    fill_test_run(b);
    mg_backend_close(b);
    return test_finish();
}
