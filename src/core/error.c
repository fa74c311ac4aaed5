/* error.c - the thread-local error message and the status names. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char tls_message[MG_ERROR_MESSAGE_BYTES];

const char *mg_status_name(mg_status status) {
    switch (status) {
    case MG_OK:
        return "MG_OK";
    case MG_ERR_INVALID_ARGUMENT:
        return "MG_ERR_INVALID_ARGUMENT";
    case MG_ERR_OUT_OF_MEMORY:
        return "MG_ERR_OUT_OF_MEMORY";
    case MG_ERR_UNAVAILABLE:
        return "MG_ERR_UNAVAILABLE";
    case MG_ERR_UNSUPPORTED:
        return "MG_ERR_UNSUPPORTED";
    case MG_ERR_NOT_FOUND:
        return "MG_ERR_NOT_FOUND";
    case MG_ERR_NOT_READY:
        return "MG_ERR_NOT_READY";
    case MG_ERR_CAPTURING:
        return "MG_ERR_CAPTURING";
    case MG_ERR_BUSY:
        return "MG_ERR_BUSY";
    case MG_ERR_DEVICE:
        return "MG_ERR_DEVICE";
    case MG_ERR_DEVICE_FAULT:
        return "MG_ERR_DEVICE_FAULT";
    case MG_ERR_INTERNAL:
        return "MG_ERR_INTERNAL";
    }
    return "MG_ERR_UNKNOWN";
}

const char *mg_last_error(void) {
    return tls_message;
}

void mg_clear_error(void) {
    tls_message[0] = '\0';
}

void mg_error_save(mg_error_state *saved) {
    memcpy(saved->message, tls_message, sizeof tls_message);
}

void mg_error_restore(const mg_error_state *saved) {
    memcpy(tls_message, saved->message, sizeof tls_message);
}

const char *mg_path_basename(const char *path) {
    if (!path)
        return "";
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

mg_status mg_error_set(mg_status status, const char *file, int line, const char *fmt, ...) {
    /* Format into a local buffer first: arguments may point into tls_message itself
     * (re-raising a stored message). */
    char text[MG_ERROR_MESSAGE_BYTES - 128]; /* leaves room for " at file:line" */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (file)
        snprintf(tls_message, sizeof tls_message, "%s at %.100s:%d", text, mg_path_basename(file),
                 line);
    else
        snprintf(tls_message, sizeof tls_message, "%s", text);
    return status;
}

mg_status mg_error_report(mg_status status, const char *fmt, ...) {
    char text[MG_ERROR_MESSAGE_BYTES]; /* the arguments may point into tls_message */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(tls_message, sizeof tls_message, "%s", text);
    return status ? status : MG_ERR_INTERNAL;
}

void mg_error_append(const char *fmt, ...) {
    size_t used = strlen(tls_message);
    if (used + 1 >= sizeof tls_message)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_message + used, sizeof tls_message - used, fmt, ap);
    va_end(ap);
}

const char *mg_format_bytes(uint64_t bytes, char *buf, size_t buf_bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bytes < 1024) {
        snprintf(buf, buf_bytes, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, buf_bytes, "%.1f %s", v, units[u]);
    return buf;
}
