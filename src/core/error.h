/*
 * error.h - private: setting the thread-local error message, and small shared helpers for
 * formatting what every message needs (sizes, call sites).
 */
#ifndef METRALE_ERROR_H
#define METRALE_ERROR_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/status.h"

#if defined(__GNUC__)
#define MG_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define MG_PRINTF(fmt_index, first_arg)
#endif

/* Sets this thread's message to the formatted text, followed by " at <file>:<line>" when
 * file is not NULL (only the file's base name is kept), and returns `status` so a failing
 * path reads `return mg_error_set(MG_ERR_..., file, line, "...", ...);`. */
mg_status mg_error_set(mg_status status, const char *file, int line, const char *fmt, ...)
    MG_PRINTF(4, 5);

/* The library's own location: for failures with no better call site. */
#define MG_ERROR(status, ...) mg_error_set((status), __FILE__, __LINE__, __VA_ARGS__)

/* Appends text to the current message (e.g. the kernel that was running). */
void mg_error_append(const char *fmt, ...) MG_PRINTF(1, 2);

/* A copy of this thread's message, so a query that may fail internally (a capability
 * probe, a statistics update) leaves the caller's last error as it was. */
#define MG_ERROR_MESSAGE_BYTES 1024
typedef struct mg_error_state {
    char message[MG_ERROR_MESSAGE_BYTES];
} mg_error_state;
void mg_error_save(mg_error_state *saved);
void mg_error_restore(const mg_error_state *saved);

/* "80.0 GiB", "512 B", "1.5 MiB": binary units, one decimal. Returns buf. */
const char *mg_format_bytes(uint64_t bytes, char *buf, size_t buf_bytes);

/* Base name of a path ("src/core/arena.c" -> "arena.c"). */
const char *mg_path_basename(const char *path);

#endif
