/*
 * test_cuda_driver_failures.c - how the CUDA backend reports driver failures, against a fake
 * driver table (no device needed; skipped when built without the CUDA backend):
 *  - mg_cuda_free: a context that cannot be made current is an error naming cuCtxSetCurrent,
 *    except after teardown (results 4, 201, 709), where the memory is already gone (MG_OK);
 *    neither frees anything;
 *  - opening reads the device attributes: a required one the driver cannot answer fails,
 *    naming it; an optional one (managed memory, mapped host memory) counts as absent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#ifndef METRALE_HAVE_CUDA
int main(void) {
    printf("test_cuda_driver_failures: skipped: built without the CUDA backend\n");
    return 77;
}
#else
#include "cuda_internal.h"

static CUresult set_current_result;
static int mem_free_calls;
static CUdevice_attribute failing_attribute = (CUdevice_attribute)-1;

static CUresult fake_ctx_get_current(CUcontext *ctx) {
    *ctx = NULL; /* never current: every entry has to set it */
    return CUDA_SUCCESS;
}

static CUresult fake_ctx_set_current(CUcontext ctx) {
    (void)ctx;
    return set_current_result;
}

static CUresult fake_mem_free(CUdeviceptr p) {
    (void)p;
    mem_free_calls++;
    return CUDA_SUCCESS;
}

static CUresult fake_device_get_name(char *name, int len, CUdevice d) {
    (void)d;
    snprintf(name, (size_t)len, "fake device");
    return CUDA_SUCCESS;
}

static CUresult fake_device_total_mem(size_t *bytes, CUdevice d) {
    (void)d;
    *bytes = (size_t)80 << 30;
    return CUDA_SUCCESS;
}

/* Every attribute answers 100 + its number, except the failing one. */
static CUresult fake_device_get_attribute(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    if (a == failing_attribute)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 100 + (int)a;
    return CUDA_SUCCESS;
}

static mg_cuda_driver fake;

static mg_cuda_context *fake_context(void) {
    mg_cuda_context *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->drv = &fake;
    c->primary = (CUcontext)(uintptr_t)0x1000;
    c->ordinal = 3;
    pthread_mutex_init(&c->fault_lock, NULL);
    return c;
}

static void test_free_paths(mg_cuda_context *c) {
    set_current_result = CUDA_SUCCESS;
    mem_free_calls = 0;
    CHECK_OK(mg_cuda_free(c, 0x10000, MG_ALLOC_DEVICE));
    CHECK(mem_free_calls == 1);

    const CUresult gone[] = {CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_INVALID_CONTEXT,
                             CUDA_ERROR_CONTEXT_IS_DESTROYED};
    for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) {
        set_current_result = gone[i];
        mem_free_calls = 0;
        CHECK_OK(mg_cuda_free(c, 0x10000, MG_ALLOC_DEVICE));
        CHECK(mem_free_calls == 0);
    }

    const CUresult failures[] = {CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_PERMITTED,
                                 CUDA_ERROR_UNKNOWN};
    for (size_t i = 0; i < sizeof failures / sizeof failures[0]; i++) {
        set_current_result = failures[i];
        mem_free_calls = 0;
        mg_status st = mg_cuda_free(c, 0x10000, MG_ALLOC_DEVICE);
        CHECK(st != MG_OK);
        CHECK_MESSAGE("cuCtxSetCurrent");
        CHECK_MESSAGE("CUDA device 3");
        char code[16];
        snprintf(code, sizeof code, "(%d)", (int)failures[i]);
        CHECK_MESSAGE(code);
        CHECK(mem_free_calls == 0);
    }
    set_current_result = CUDA_SUCCESS;
}

static void test_device_attributes(mg_cuda_context *c) {
    failing_attribute = (CUdevice_attribute)-1;
    CHECK_OK(mg_cuda_read_device_info(c));
    CHECK(strcmp(c->info.name, "fake device") == 0);
    CHECK(c->info.multiprocessors == 100 + CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    CHECK(c->info.cc_major == 100 + CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    CHECK(c->info.cc_minor == 100 + CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    CHECK(c->info.l2_bytes == 100 + CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
    CHECK(c->info.max_shared_per_block_optin ==
          100 + CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    CHECK(c->managed_memory && c->map_host_memory);

    const struct {
        CUdevice_attribute a;
        const char *name;
    } required[] = {
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "MULTIPROCESSOR_COUNT"},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "COMPUTE_CAPABILITY_MAJOR"},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "COMPUTE_CAPABILITY_MINOR"},
        {CU_DEVICE_ATTRIBUTE_INTEGRATED, "INTEGRATED"},
        {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "L2_CACHE_SIZE"},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
         "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"},
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        failing_attribute = required[i].a;
        CHECK(mg_cuda_read_device_info(c) != MG_OK);
        CHECK_MESSAGE("cuDeviceGetAttribute");
        CHECK_MESSAGE(required[i].name);
        CHECK_MESSAGE("CUDA device 3");
    }
    failing_attribute = CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY;
    CHECK_OK(mg_cuda_read_device_info(c));
    CHECK(!c->managed_memory && c->map_host_memory);
    failing_attribute = CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY;
    CHECK_OK(mg_cuda_read_device_info(c));
    CHECK(c->managed_memory && !c->map_host_memory);
    failing_attribute = (CUdevice_attribute)-1;
}

int main(void) {
    fake.CtxGetCurrent = fake_ctx_get_current;
    fake.CtxSetCurrent = fake_ctx_set_current;
    fake.MemFree = fake_mem_free;
    fake.DeviceGetName = fake_device_get_name;
    fake.DeviceTotalMem = fake_device_total_mem;
    fake.DeviceGetAttribute = fake_device_get_attribute;
    fake.driver_version = 13000;
    mg_cuda_context *c = fake_context();
    CHECK(c != NULL);
    if (c) {
        test_free_paths(c);
        test_device_attributes(c);
        pthread_mutex_destroy(&c->fault_lock);
        free(c);
    }
    return test_finish();
}
#endif
