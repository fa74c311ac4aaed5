/*
 * test_cuda_no_driver.c - the CUDA backend where no driver can be loaded (METRALE_LIBCUDA
 * points at a file that does not exist, as on a machine without NVIDIA's driver): the probe
 * says unusable and why, opening fails with MG_ERR_UNAVAILABLE and that reason, AUTO falls
 * back to another backend, and nothing crashes. Also the module-image detection by content,
 * which needs no device.
 */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#ifdef METRALE_HAVE_CUDA
#include "cuda_image.h"
#endif

#define MISSING_DRIVER "/nonexistent/metrale-test/libcuda.so.1"

static void test_unavailable(void) {
    mg_backend_probe probe;
    memset(&probe, 0x5A, sizeof probe); /* poisoned: every field must be written */
    CHECK_OK(mg_backend_probe_kind(MG_BACKEND_CUDA, &probe));
    CHECK(!probe.usable);
    CHECK(probe.device_count == 0);
    CHECK(memchr(probe.reason, '\0', sizeof probe.reason) != NULL);
#ifdef METRALE_HAVE_CUDA
    CHECK(probe.compiled_in);
    CHECK(strstr(probe.reason, MISSING_DRIVER) != NULL);
    CHECK(strstr(probe.reason, "not found") != NULL);
#else
    CHECK(!probe.compiled_in);
#endif
    printf("  cuda probe: compiled_in=%d usable=%d reason: %s\n", probe.compiled_in, probe.usable,
           probe.reason);

    /* The probe keeps the caller's last error message. */
    mg_backend *b = (mg_backend *)(uintptr_t)1;
    CHECK_STATUS(mg_backend_open(MG_BACKEND_CUDA, 0, &b), MG_ERR_UNAVAILABLE);
    CHECK(b == NULL);
#ifdef METRALE_HAVE_CUDA
    CHECK_MESSAGE(MISSING_DRIVER);
#endif
    /* Again: the failed load is remembered, not retried into a crash. */
    CHECK_STATUS(mg_backend_open(MG_BACKEND_CUDA, 1, &b), MG_ERR_UNAVAILABLE);
    CHECK_OK(mg_backend_probe_kind(MG_BACKEND_CUDA, &probe));
    CHECK(!probe.usable);

    /* AUTO skips CUDA and opens what is there. */
    mg_backend *any = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_AUTO, 0, &any));
    CHECK(any != NULL && mg_backend_get_kind(any) != MG_BACKEND_CUDA);
    CHECK_OK(mg_backend_close(any));
}

#ifdef METRALE_HAVE_CUDA
static void test_image_detection(void) {
    static const char ptx[] =
        "//\n// Generated\n//\n.version 8.0\n.target sm_90a\n.address_size 64\n";
    CHECK(mg_cuda_image_detect(ptx, sizeof ptx) == MG_CUDA_IMAGE_PTX);  /* with NUL */
    CHECK(mg_cuda_image_detect(ptx, strlen(ptx)) == MG_CUDA_IMAGE_PTX); /* without */
    static const char padded[] = ".target sm_80\n\0\0\0";
    CHECK(mg_cuda_image_detect(padded, sizeof padded) == MG_CUDA_IMAGE_PTX); /* NUL padding */
    static const char text[] = "hello, this is not a kernel\n";
    CHECK(mg_cuda_image_detect(text, sizeof text) == MG_CUDA_IMAGE_UNKNOWN);
    static const char trailing[] = ".version 8.0\n\0garbage";
    CHECK(mg_cuda_image_detect(trailing, sizeof trailing) == MG_CUDA_IMAGE_UNKNOWN);

    unsigned char elf[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
    CHECK(mg_cuda_image_detect(elf, sizeof elf) == MG_CUDA_IMAGE_CUBIN);
    CHECK(mg_cuda_image_detect(elf, 3) == MG_CUDA_IMAGE_UNKNOWN); /* too short for the magic */
    unsigned char fatbin[64] = {0x50, 0xED, 0x55, 0xBA, 1, 0, 0x10, 0};
    CHECK(mg_cuda_image_detect(fatbin, sizeof fatbin) == MG_CUDA_IMAGE_FATBIN);
    unsigned char big_endian[8] = {0xBA, 0x55, 0xED, 0x50};
    CHECK(mg_cuda_image_detect(big_endian, sizeof big_endian) == MG_CUDA_IMAGE_UNKNOWN);

    unsigned char junk[512];
    test_fill_random(junk, sizeof junk);
    junk[0] = 0xFF;
    CHECK(mg_cuda_image_detect(junk, sizeof junk) == MG_CUDA_IMAGE_UNKNOWN);
    CHECK(mg_cuda_image_detect(NULL, 10) == MG_CUDA_IMAGE_UNKNOWN);
    CHECK(mg_cuda_image_detect(ptx, 0) == MG_CUDA_IMAGE_UNKNOWN);
    CHECK(!strcmp(mg_cuda_image_format_name(MG_CUDA_IMAGE_FATBIN), "fatbin"));
    CHECK(!strcmp(mg_cuda_image_format_name(MG_CUDA_IMAGE_UNKNOWN), "unknown"));
}
#endif

int main(void) {
    test_seed();
    /* Before any CUDA call: the driver is looked up once per process. */
    setenv("METRALE_LIBCUDA", MISSING_DRIVER, 1);
    test_unavailable();
#ifdef METRALE_HAVE_CUDA
    test_image_detection();
#endif
    return test_finish();
}
