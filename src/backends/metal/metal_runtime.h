/*
 * metal_runtime.h - private: the Objective-C runtime and the Metal framework, opened with
 * dlopen at first use so the backend is plain C11 and builds on any OS.
 *
 * Nothing of Apple's headers is included: the few Metal types the backend passes by value
 * are declared here with their documented layout, objects are `mg_id` (an opaque pointer)
 * and every message goes through objc_msgSend cast to the exact signature of the method
 * (MG_MSG below), as Apple requires for arm64. Selectors are registered once, at load.
 *
 * UNVERIFIED ON HARDWARE: this file has only run against the test double of
 * tests/metal/, never against Apple's libobjc and Metal.framework.
 */
#ifndef METRALE_METAL_RUNTIME_H
#define METRALE_METAL_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/gpu.h"

typedef void *mg_id;
typedef const void *mg_sel;
typedef unsigned long mg_nsuint; /* NSUInteger: 64 bits on every Mac Metal runs on */

typedef struct mg_mtl_size { /* MTLSize */
    mg_nsuint width, height, depth;
} mg_mtl_size;

typedef struct mg_ns_range { /* NSRange */
    mg_nsuint location, length;
} mg_ns_range;

/* MTLResourceOptions / MTLCommandBufferStatus values the backend uses. */
#define MG_MTL_STORAGE_MODE_SHARED 0ul /* MTLResourceStorageModeShared << 4 */
#define MG_MTL_CB_STATUS_COMPLETED 4ul
#define MG_MTL_CB_STATUS_ERROR 5ul

/* Every selector the backend sends, registered with sel_registerName at load. */
/* clang-format off */
#define MG_METAL_SELECTORS(X)                                                                      \
    X(alloc, "alloc") X(retain, "retain") X(release, "release")                                   \
    X(initWithUTF8String, "initWithUTF8String:") X(UTF8String, "UTF8String")                      \
    X(localizedDescription, "localizedDescription") X(name, "name")                                \
    X(newCommandQueue, "newCommandQueue") X(newBufferWithLength, "newBufferWithLength:options:")   \
    X(newLibraryWithSource, "newLibraryWithSource:options:error:")                                  \
    X(newFunctionWithName, "newFunctionWithName:")                                                 \
    X(newComputePipelineState, "newComputePipelineStateWithFunction:error:")                        \
    X(newSharedEvent, "newSharedEvent") X(recommendedMaxWorkingSetSize, "recommendedMaxWorkingSetSize") \
    X(currentAllocatedSize, "currentAllocatedSize") X(hasUnifiedMemory, "hasUnifiedMemory")        \
    X(maxThreadgroupMemoryLength, "maxThreadgroupMemoryLength")                                    \
    X(maxTotalThreadsPerThreadgroup, "maxTotalThreadsPerThreadgroup")                              \
    X(contents, "contents") X(commandBuffer, "commandBuffer")                                      \
    X(computeCommandEncoder, "computeCommandEncoder") X(blitCommandEncoder, "blitCommandEncoder")  \
    X(commit, "commit") X(waitUntilCompleted, "waitUntilCompleted") X(status, "status")            \
    X(error, "error") X(encodeSignalEvent, "encodeSignalEvent:value:")                             \
    X(encodeWaitForEvent, "encodeWaitForEvent:value:") X(GPUEndTime, "GPUEndTime")                 \
    X(signaledValue, "signaledValue") X(endEncoding, "endEncoding")                                \
    X(setComputePipelineState, "setComputePipelineState:")                                         \
    X(setBuffer, "setBuffer:offset:atIndex:") X(setBytes, "setBytes:length:atIndex:")              \
    X(setThreadgroupMemoryLength, "setThreadgroupMemoryLength:atIndex:")                           \
    X(dispatchThreadgroups, "dispatchThreadgroups:threadsPerThreadgroup:")                         \
    X(copyFromBuffer, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:")              \
    X(fillBuffer, "fillBuffer:range:value:")
/* clang-format on */

typedef struct mg_metal_runtime {
    /* libobjc */
    mg_id (*objc_getClass)(const char *name);
    mg_sel (*sel_registerName)(const char *name);
    void (*objc_msgSend)(void); /* cast per call: MG_MSG */
    void *(*autorelease_pool_push)(void);
    void (*autorelease_pool_pop)(void *pool);
    /* Metal.framework */
    mg_id (*MTLCreateSystemDefaultDevice)(void);
    mg_id NSString; /* the class */
#define MG_METAL_SEL_FIELD(field, text) mg_sel field;
    struct {
        MG_METAL_SELECTORS(MG_METAL_SEL_FIELD)
    } sel;
#undef MG_METAL_SEL_FIELD
    char objc_path[256], metal_path[256];
} mg_metal_runtime;

/* Opens both libraries once per process (env METRALE_METAL_OBJC_LIBRARY and
 * METRALE_METAL_FRAMEWORK override the paths) and returns the runtime, or NULL with
 * MG_ERR_UNAVAILABLE set and *reason (static storage) saying why. */
const mg_metal_runtime *mg_metal_runtime_load(const char **reason);

/* objc_msgSend as a function of the given signature: MG_MSG(rt, ret, (arg types...)). */
#define MG_MSG(rt, ret, args) ((ret(*) args)(rt)->objc_msgSend)

/* Small helpers over the messages every file sends. */
void mg_metal_release(const mg_metal_runtime *rt, mg_id obj);
mg_id mg_metal_retain(const mg_metal_runtime *rt, mg_id obj);
/* A new NSString (caller releases it), NULL when out of memory. */
mg_id mg_metal_string(const mg_metal_runtime *rt, const char *utf8);
/* The localized description of an NSError into buf ("unknown error" for nil). */
void mg_metal_describe_error(const mg_metal_runtime *rt, mg_id error, char *buf, size_t bytes);
/* Autorelease pool around a call that makes autoreleased objects (a no-op without one). */
void *mg_metal_pool_push(const mg_metal_runtime *rt);
void mg_metal_pool_pop(const mg_metal_runtime *rt, void *pool);

#endif
