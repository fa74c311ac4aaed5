/* cuda_plugin.c - dlopen of the CUDA kernel plugins next to the library or executable
 * (cuda_plugin.h). */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_backend.h"
#include "cuda_plugin.h"
#include "error.h"

#define MG_CUDA_PLUGIN_MAX 8

typedef struct loaded_plugin {
    char file_name[128];
    void *handle;
} loaded_plugin;

static pthread_mutex_t plugins_lock = PTHREAD_MUTEX_INITIALIZER;
static loaded_plugin plugins[MG_CUDA_PLUGIN_MAX];

/* Directory part of `path` into `dir` ("" when there is none). */
static void directory_of(const char *path, char *dir, size_t dir_bytes) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= dir_bytes)
        n = 0;
    memcpy(dir, path, n);
    dir[n] = '\0';
}

/* Appends `text` to the NUL-terminated `buf` of `cap` bytes, after "; " when buf is not empty;
 * what does not fit is cut (the list of tried paths is a message, not data). */
static void append_cut(char *buf, size_t cap, const char *text) {
    size_t used = strlen(buf);
    const char *parts[2] = {used ? "; " : "", text};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(parts[i]);
        if (n > cap - 1 - used)
            n = cap - 1 - used;
        memcpy(buf + used, parts[i], n);
        used += n;
        buf[used] = '\0';
    }
}

/* Tries dir/file_name; appends what happened to `tried`. */
static void *try_open(const char *dir, const char *file_name, char *tried, size_t tried_bytes) {
    char path[PATH_MAX];
    const size_t dir_len = strlen(dir), name_len = strlen(file_name);
    if (!dir_len || dir_len + 1 + name_len >= sizeof path)
        return NULL;
    memcpy(path, dir, dir_len);
    path[dir_len] = '/';
    memcpy(path + dir_len + 1, file_name, name_len + 1);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        append_cut(tried, tried_bytes, why ? why : path);
    }
    return h;
}

static mg_status open_plugin(const char *file_name, void **out) {
    char tried[1024] = "";
    char dir[PATH_MAX];
    void *h = NULL;
    const char *env = getenv("METRALE_CUDA_PLUGIN_DIR");
    if (env && *env) {
        h = try_open(env, file_name, tried, sizeof tried);
    } else {
        Dl_info info;
        if (dladdr((void *)&mg_cuda_plugin_load, &info) && info.dli_fname) {
            directory_of(info.dli_fname, dir, sizeof dir);
            h = try_open(dir, file_name, tried, sizeof tried);
        }
        if (!h) {
            char exe[PATH_MAX];
            ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
            if (n > 0) {
                exe[n] = '\0';
                directory_of(exe, dir, sizeof dir);
                h = try_open(dir, file_name, tried, sizeof tried);
            }
        }
    }
    if (!h)
        return MG_ERROR(MG_ERR_UNAVAILABLE, "CUDA kernel plugin %s could not be loaded (%s)%s",
                        file_name, *tried ? tried : "no directory to search",
                        env && *env ? "" : "; set METRALE_CUDA_PLUGIN_DIR to its directory");
    *out = h;
    return MG_OK;
}

mg_status mg_cuda_plugin_load(const char *file_name, const mg_cuda_plugin_symbol *symbols,
                              size_t count) {
    if (!file_name || strlen(file_name) >= sizeof plugins[0].file_name)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_cuda_plugin_load: bad plugin name");
    pthread_mutex_lock(&plugins_lock);
    void *handle = NULL;
    loaded_plugin *free_slot = NULL;
    for (size_t i = 0; i < MG_CUDA_PLUGIN_MAX; i++) {
        if (plugins[i].handle && strcmp(plugins[i].file_name, file_name) == 0)
            handle = plugins[i].handle;
        else if (!plugins[i].handle && !free_slot)
            free_slot = &plugins[i];
    }
    mg_status st = MG_OK;
    if (!handle) {
        if (!free_slot)
            st = MG_ERROR(MG_ERR_INTERNAL, "mg_cuda_plugin_load: more than %d plugins",
                          MG_CUDA_PLUGIN_MAX);
        else if (!(st = open_plugin(file_name, &handle))) {
            snprintf(free_slot->file_name, sizeof free_slot->file_name, "%s", file_name);
            free_slot->handle = handle;
        }
    }
    pthread_mutex_unlock(&plugins_lock);
    for (size_t i = 0; !st && i < count; i++) {
        dlerror();
        void *sym = dlsym(handle, symbols[i].name);
        if (!sym)
            st = MG_ERROR(MG_ERR_NOT_FOUND, "CUDA kernel plugin %s lacks symbol %s", file_name,
                          symbols[i].name);
        else
            *symbols[i].slot = sym;
    }
    return st;
}

mg_status mg_cuda_plugin_failure(mg_cuda_context *ctx, mg_status st, int32_t cuda_error,
                                 const char *message, const char *what) {
    if (cuda_error >= 700) {
        st = mg_cuda_result(ctx, (CUresult)cuda_error, what, __FILE__, __LINE__);
        mg_error_append(" [%s]", message);
        return st;
    }
    return MG_ERROR(st, "%s: %s", what, message);
}
