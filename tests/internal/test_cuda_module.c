/*
 * test_cuda_module.c - the CUDA module registry on a real device (skipped without one):
 * PTX text (with and without its terminating NUL), a fatbin and, when METRALE_TEST_CUBIN
 * names one, a cubin are loaded by content; functions are looked up and launched; module
 * globals are read and written through mg_module_symbol; unloading a model refuses while a
 * kernel handle is held and afterwards lookups fail; bad images are rejected with a message.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_cuda_util.h"

#ifndef METRALE_HAVE_CUDA
int main(void) {
    printf("test_cuda_module: skipped: built without the CUDA backend\n");
    return TEST_SKIP_EXIT;
}
#else
#include "embedded_kernels.h"

/* out[0] = ptx_value[0] + v, with ptx_value initialised to {1, 2, 3, 4}. */
static const char ptx_text[] = ".version 7.0\n"
                               ".target sm_80\n"
                               ".address_size 64\n"
                               "\n"
                               ".visible .global .align 4 .u32 ptx_value[4] = {1, 2, 3, 4};\n"
                               "\n"
                               ".visible .entry ptx_store(\n"
                               "    .param .u64 ptx_store_param_0,\n"
                               "    .param .u32 ptx_store_param_1\n"
                               ")\n"
                               "{\n"
                               "    .reg .b32 %r<4>;\n"
                               "    .reg .b64 %rd<3>;\n"
                               "    ld.param.u64 %rd1, [ptx_store_param_0];\n"
                               "    ld.param.u32 %r1, [ptx_store_param_1];\n"
                               "    cvta.to.global.u64 %rd2, %rd1;\n"
                               "    ld.global.u32 %r2, [ptx_value];\n"
                               "    add.s32 %r3, %r2, %r1;\n"
                               "    st.global.u32 [%rd2], %r3;\n"
                               "    ret;\n"
                               "}\n";

static uint32_t run_ptx_store(mg_backend *b, mg_kernel *k, mg_devptr out, uint32_t v) {
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, v);
    CHECK_OK(mg_launch_run(b, k, NULL, &l));
    CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
    uint32_t got = 0;
    CHECK_OK(mg_copy_d2h(b, &got, out, 4));
    return got;
}

static void test_ptx(mg_backend *b, mg_devptr out) {
    /* with the NUL, then without it (the loader terminates a copy) */
    CHECK_OK(mg_module_load(b, "model_ptx", "ptx_a", ptx_text, sizeof ptx_text));
    CHECK_OK(mg_module_load(b, "model_ptx", "ptx_b", ptx_text, strlen(ptx_text)));
    for (int m = 0; m < 2; m++) {
        const char *module = m ? "ptx_b" : "ptx_a";
        mg_devptr sym = 0;
        size_t bytes = 0;
        CHECK_OK(mg_module_symbol(b, module, "ptx_value", &sym, &bytes));
        CHECK(sym != 0 && bytes == 16);
        uint32_t init[4] = {0};
        CHECK_OK(mg_copy_d2h(b, init, sym, sizeof init));
        CHECK(init[0] == 1 && init[1] == 2 && init[2] == 3 && init[3] == 4);
        uint32_t base = (uint32_t)test_rand_range(1, 1u << 30);
        CHECK_OK(mg_copy_h2d(b, sym, &base, 4));
        mg_kernel *k = NULL;
        CHECK_OK(mg_kernel_lookup(b, module, "ptx_store", &k));
        if (k) {
            uint32_t v = (uint32_t)test_rand_range(1, 1000);
            CHECK(run_ptx_store(b, k, out, v) == base + v);
            CHECK_OK(mg_kernel_release(k));
        }
        CHECK_STATUS(mg_module_symbol(b, module, "no_such_symbol", &sym, &bytes), MG_ERR_NOT_FOUND);
        CHECK_MESSAGE("no_such_symbol");
    }

    /* A held kernel blocks unloading its model; releasing it lets the unload through. */
    mg_kernel *held = NULL;
    CHECK_OK(mg_kernel_lookup(b, "ptx_a", "ptx_store", &held));
    CHECK_STATUS(mg_module_unload_model(b, "model_ptx"), MG_ERR_BUSY);
    CHECK_OK(mg_kernel_release(held));
    CHECK_OK(mg_module_unload_model(b, "model_ptx"));
    mg_kernel *k = NULL;
    CHECK_STATUS(mg_kernel_lookup(b, "ptx_a", "ptx_store", &k), MG_ERR_NOT_FOUND);
    CHECK_STATUS(mg_module_unload_model(b, "model_ptx"), MG_ERR_NOT_FOUND);

    /* Loading the same model again after the unload works (no stale state). */
    CHECK_OK(mg_module_load(b, "model_ptx", "ptx_a", ptx_text, sizeof ptx_text));
    CHECK_OK(mg_kernel_lookup(b, "ptx_a", "ptx_store", &k));
    if (k) {
        CHECK(run_ptx_store(b, k, out, 7) == 8); /* a fresh module: ptx_value[0] == 1 again */
        CHECK_OK(mg_kernel_release(k));
    }
    CHECK_OK(mg_module_unload_model(b, "model_ptx"));
}

/* The vector_add fatbin embedded in the library, loaded again as a user module. */
static void test_fatbin(mg_backend *b) {
    const mg_embedded_kernel_image *image = NULL;
    for (const mg_embedded_kernel_image *e = mg_embedded_kernel_images; e->name; e++)
        if (!strcmp(e->name, "vector_add"))
            image = e;
    CHECK(image != NULL);
    if (!image)
        return;
    CHECK_OK(mg_module_load(b, "model_fatbin", "va", image->image, *image->bytes));
    mg_kernel *k = NULL;
    CHECK_OK(mg_kernel_lookup(b, "va", "vector_add", &k));
    uint32_t n = (uint32_t)test_rand_range(1, 5000);
    float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
    mg_devptr dx = 0, dy = 0, dz = 0;
    CHECK_OK(mg_alloc(b, n * 4, &dx));
    CHECK_OK(mg_alloc(b, n * 4, &dy));
    CHECK_OK(mg_alloc(b, n * 4, &dz));
    if (k && x && y && z) {
        for (uint32_t i = 0; i < n; i++) {
            x[i] = (float)(test_rand() % 1000) * 0.25f;
            y[i] = (float)(test_rand() % 1000) * -0.5f;
        }
        CHECK_OK(mg_copy_h2d(b, dx, x, n * 4));
        CHECK_OK(mg_copy_h2d(b, dy, y, n * 4));
        CHECK_OK(mg_memset(b, dz, 0xFF, n * 4));
        CHECK_OK(cuda_test_vector_add(b, k, NULL, dx, dy, dz, n));
        CHECK_OK(mg_copy_d2h(b, z, dz, n * 4));
        size_t wrong = 0;
        for (uint32_t i = 0; i < n; i++)
            wrong += z[i] != x[i] + y[i];
        CHECK(wrong == 0);
        CHECK_OK(mg_kernel_release(k));
    }
    CHECK_OK(mg_module_unload_model(b, "model_fatbin"));
    mg_free(b, dx);
    mg_free(b, dy);
    mg_free(b, dz);
    free(x);
    free(y);
    free(z);
}

/* A cubin built for this GPU by the run script (nvcc -cubin), when one is given. */
static void test_cubin(mg_backend *b) {
    const char *path = getenv("METRALE_TEST_CUBIN");
    if (!path || !*path) {
        printf("  cubin: not tested (METRALE_TEST_CUBIN names no file)\n");
        return;
    }
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *image = malloc((size_t)size);
    CHECK(image && fread(image, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    CHECK(size > 4 && image[0] == 0x7f && image[1] == 'E');
    CHECK_OK(mg_module_load(b, "model_cubin", "cubin_kernels", image, (size_t)size));
    mg_kernel *k = NULL;
    CHECK_OK(mg_kernel_lookup(b, "cubin_kernels", "fill_u32", &k));
    mg_devptr p = 0;
    CHECK_OK(mg_alloc(b, 4096, &p));
    if (k) {
        CHECK_OK(cuda_test_fill_u32(b, k, NULL, p, 0xC0B1u, 1000));
        uint32_t got[1001];
        CHECK_OK(mg_memset(b, p + 4000, 0, 4));
        CHECK_OK(mg_copy_d2h(b, got, p, sizeof got));
        size_t wrong = 0;
        for (int i = 0; i < 1000; i++)
            wrong += got[i] != 0xC0B1u;
        CHECK(wrong == 0 && got[1000] == 0);
        CHECK_OK(mg_kernel_release(k));
    }
    CHECK_OK(mg_free(b, p));
    CHECK_OK(mg_module_unload_model(b, "model_cubin"));
    free(image);
    printf("  cubin: %s loaded and launched\n", path);
}

/* The built-in module's global, written by the host and incremented by a kernel. */
static void test_builtin_symbol(mg_backend *b) {
    mg_devptr sym = 0;
    size_t bytes = 0;
    CHECK_OK(mg_module_symbol(b, "metrale", "mg_test_symbol", &sym, &bytes));
    CHECK(bytes == 64 * 4);
    mg_kernel *k = cuda_test_kernel(b, "add_to_symbol");
    if (!sym || !k)
        return;
    uint32_t before[64], after[64];
    for (int i = 0; i < 64; i++)
        before[i] = (uint32_t)test_rand();
    CHECK_OK(mg_copy_h2d(b, sym, before, sizeof before));
    uint32_t v = (uint32_t)test_rand();
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){64, 1, 1}, 0);
    mg_launch_arg_u32(&l, v);
    CHECK_OK(mg_launch_run(b, k, NULL, &l));
    CHECK_OK(mg_copy_d2h(b, after, sym, sizeof after));
    size_t wrong = 0;
    for (int i = 0; i < 64; i++)
        wrong += after[i] != before[i] + v;
    CHECK(wrong == 0);
    CHECK_OK(mg_kernel_release(k));
    CHECK_STATUS(mg_module_unload_model(b, "metrale"), MG_ERR_NOT_FOUND);
}

static void test_bad_images(mg_backend *b) {
    unsigned char junk[256];
    test_fill_random(junk, sizeof junk);
    junk[0] = 0x01; /* neither ELF nor fatbin magic; binary, so not PTX */
    CHECK_STATUS(mg_module_load(b, "model_bad", "junk", junk, sizeof junk),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("neither PTX");
    static const char broken_ptx[] = ".version 7.0\n.target sm_80\n.address_size 64\n"
                                     ".visible .entry broken( { this is not ptx }\n";
    mg_status st = mg_module_load(b, "model_bad", "broken", broken_ptx, sizeof broken_ptx);
    CHECK(st != MG_OK);
    CHECK_MESSAGE("cuModuleLoadDataEx");
    CHECK_MESSAGE("broken");
    mg_kernel *k = NULL;
    CHECK_STATUS(mg_kernel_lookup(b, "metrale", "no_such_kernel", &k), MG_ERR_NOT_FOUND);
    CHECK_MESSAGE("no_such_kernel");
    CHECK_STATUS(mg_kernel_lookup(b, "no_such_module", "vector_add", &k), MG_ERR_NOT_FOUND);
    /* nothing of the failed loads stayed registered */
    CHECK_STATUS(mg_module_unload_model(b, "model_bad"), MG_ERR_NOT_FOUND);
}

int main(void) {
    test_seed();
    mg_backend *b = cuda_test_open_or_skip("test_cuda_module");
    CHECK(mg_backend_supports(b, MG_CAP_MODULES));
    mg_devptr out = 0;
    CHECK_OK(mg_alloc(b, 16, &out));
    test_ptx(b, out);
    test_fatbin(b);
    test_cubin(b);
    test_builtin_symbol(b);
    test_bad_images(b);
    CHECK_OK(mg_free(b, out));
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
#endif
