/* metal_runtime.c - loading libobjc and Metal.framework (metal_runtime.h). */
#include "metal_runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"

#define DEFAULT_OBJC "/usr/lib/libobjc.A.dylib"
#define DEFAULT_METAL "/System/Library/Frameworks/Metal.framework/Metal"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static mg_metal_runtime loaded;
static bool load_ok;
static char load_reason[512];

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

static void load(void) {
    snprintf(loaded.objc_path, sizeof loaded.objc_path, "%s",
             env_or("METRALE_METAL_OBJC_LIBRARY", DEFAULT_OBJC));
    snprintf(loaded.metal_path, sizeof loaded.metal_path, "%s",
             env_or("METRALE_METAL_FRAMEWORK", DEFAULT_METAL));
    /* Never closed: function pointers and classes from them live for the process. RTLD_GLOBAL
     * for libobjc, as the framework (and Foundation behind it) expect one runtime. */
    void *objc = dlopen(loaded.objc_path, RTLD_NOW | RTLD_GLOBAL);
    if (!objc) {
        const char *why = dlerror();
        snprintf(load_reason, sizeof load_reason, "no Objective-C runtime: %s not found: %s",
                 loaded.objc_path, why ? why : "dlopen failed");
        return;
    }
    void *metal = dlopen(loaded.metal_path, RTLD_NOW | RTLD_LOCAL);
    if (!metal) {
        const char *why = dlerror();
        snprintf(load_reason, sizeof load_reason, "no Metal framework: %s not found: %s",
                 loaded.metal_path, why ? why : "dlopen failed");
        return;
    }
    /* Function pointers through a union: ISO C has no object-to-function pointer cast. */
#define RESOLVE(lib, field, symbol)                                                                \
    do {                                                                                           \
        union {                                                                                    \
            void *p;                                                                               \
            __typeof__(loaded.field) fn;                                                           \
        } u = {dlsym(lib, symbol)};                                                                \
        loaded.field = u.fn;                                                                       \
    } while (0)
    RESOLVE(objc, objc_getClass, "objc_getClass");
    RESOLVE(objc, sel_registerName, "sel_registerName");
    RESOLVE(objc, objc_msgSend, "objc_msgSend");
    RESOLVE(objc, autorelease_pool_push, "objc_autoreleasePoolPush");
    RESOLVE(objc, autorelease_pool_pop, "objc_autoreleasePoolPop");
    RESOLVE(metal, MTLCreateSystemDefaultDevice, "MTLCreateSystemDefaultDevice");
#undef RESOLVE
    const char *missing = !loaded.objc_getClass      ? "objc_getClass"
                          : !loaded.sel_registerName ? "sel_registerName"
                          : !loaded.objc_msgSend     ? "objc_msgSend"
                                                     : NULL;
    if (missing) {
        snprintf(load_reason, sizeof load_reason, "%s lacks %s", loaded.objc_path, missing);
        return;
    }
    if (!loaded.MTLCreateSystemDefaultDevice) {
        snprintf(load_reason, sizeof load_reason, "%s lacks MTLCreateSystemDefaultDevice",
                 loaded.metal_path);
        return;
    }
    loaded.NSString = loaded.objc_getClass("NSString");
    if (!loaded.NSString) {
        snprintf(load_reason, sizeof load_reason, "the Objective-C runtime has no NSString class");
        return;
    }
#define MG_METAL_SEL_REGISTER(field, text) loaded.sel.field = loaded.sel_registerName(text);
    MG_METAL_SELECTORS(MG_METAL_SEL_REGISTER)
#undef MG_METAL_SEL_REGISTER
    load_ok = true;
}

const mg_metal_runtime *mg_metal_runtime_load(const char **reason) {
    pthread_once(&load_once, load);
    if (reason)
        *reason = load_ok ? "" : load_reason;
    if (!load_ok) {
        MG_ERROR(MG_ERR_UNAVAILABLE, "metal backend: %s (UNVERIFIED ON HARDWARE)", load_reason);
        return NULL;
    }
    return &loaded;
}

void mg_metal_release(const mg_metal_runtime *rt, mg_id obj) {
    if (obj)
        MG_MSG(rt, void, (mg_id, mg_sel))(obj, rt->sel.release);
}

mg_id mg_metal_retain(const mg_metal_runtime *rt, mg_id obj) {
    return obj ? MG_MSG(rt, mg_id, (mg_id, mg_sel))(obj, rt->sel.retain) : NULL;
}

mg_id mg_metal_string(const mg_metal_runtime *rt, const char *utf8) {
    mg_id s = MG_MSG(rt, mg_id, (mg_id, mg_sel))(rt->NSString, rt->sel.alloc);
    return s ? MG_MSG(rt, mg_id, (mg_id, mg_sel, const char *))(s, rt->sel.initWithUTF8String, utf8)
             : NULL;
}

void mg_metal_describe_error(const mg_metal_runtime *rt, mg_id error, char *buf, size_t bytes) {
    mg_id text =
        error ? MG_MSG(rt, mg_id, (mg_id, mg_sel))(error, rt->sel.localizedDescription) : NULL;
    const char *utf8 =
        text ? MG_MSG(rt, const char *, (mg_id, mg_sel))(text, rt->sel.UTF8String) : NULL;
    snprintf(buf, bytes, "%s", utf8 ? utf8 : "unknown error");
}

void *mg_metal_pool_push(const mg_metal_runtime *rt) {
    return rt->autorelease_pool_push ? rt->autorelease_pool_push() : NULL;
}

void mg_metal_pool_pop(const mg_metal_runtime *rt, void *pool) {
    if (rt->autorelease_pool_pop && pool)
        rt->autorelease_pool_pop(pool);
}
