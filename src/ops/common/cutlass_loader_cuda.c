/* cutlass_loader_cuda.c - loading the CUTLASS plugin for the providers built on it
 * (cutlass_loader.h). */
#include <pthread.h>
#include <stdio.h>

#include "cutlass_loader.h"
#include "error.h"

#define PLUGIN_FILE "libmetrale_gpu_cutlass.so"

static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;
static mg_status plugin_status;
static char plugin_message[512];
static uint32_t plugin_units;

static mg_status load_plugin(void) {
    mg_cutlass_abi_version_fn abi_version = NULL;
    mg_cutlass_built_units_fn built_units = NULL;
    const mg_cuda_plugin_symbol symbols[] = {
        {"mg_cutlass_abi_version", (void **)&abi_version},
        {"mg_cutlass_built_units", (void **)&built_units},
    };
    mg_status st = mg_cuda_plugin_load(PLUGIN_FILE, symbols, sizeof symbols / sizeof symbols[0]);
    if (st)
        return st;
    uint32_t version = abi_version();
    if (version != MG_CUTLASS_ABI_VERSION)
        return MG_ERROR(MG_ERR_UNAVAILABLE, "%s has ABI version %u, this library needs %u",
                        PLUGIN_FILE, version, MG_CUTLASS_ABI_VERSION);
    plugin_units = built_units();
    return MG_OK;
}

static void load_plugin_once(void) {
    plugin_status = load_plugin();
    if (plugin_status)
        snprintf(plugin_message, sizeof plugin_message, "%s", mg_last_error());
}

mg_status mg_cutlass_plugin_resolve(const char *what, uint32_t units,
                                    const mg_cuda_plugin_symbol *symbols, size_t count) {
    pthread_once(&plugin_once, load_plugin_once);
    if (plugin_status)
        return MG_ERROR(plugin_status, "%s: %s", what, plugin_message);
    if ((plugin_units & units) != units)
        return MG_ERROR(MG_ERR_UNAVAILABLE,
                        "%s: %s was built without these kernels (units 0x%x, needed 0x%x; "
                        "cmake/cutlass.cmake)",
                        what, PLUGIN_FILE, plugin_units, units);
    mg_status st = mg_cuda_plugin_load(PLUGIN_FILE, symbols, count);
    if (st) {
        char why[512];
        snprintf(why, sizeof why, "%s", mg_last_error());
        return MG_ERROR(st, "%s: %s", what, why);
    }
    return MG_OK;
}

uint32_t mg_cutlass_plugin_units(void) {
    /* A first load that fails sets this thread's error: an availability query must not. */
    mg_error_state saved;
    mg_error_save(&saved);
    pthread_once(&plugin_once, load_plugin_once);
    mg_error_restore(&saved);
    return plugin_status ? 0 : plugin_units;
}
