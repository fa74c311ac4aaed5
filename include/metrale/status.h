/*
 * metrale/status.h - the one status type of the library and its error message.
 *
 * Every fallible call returns an mg_status. MG_OK is zero, so `if (st) ...` reads as "failed".
 * When a call fails it also leaves a message in thread-local storage that names what failed:
 * the library or driver call with its numeric code and text where one exists, the sizes
 * involved, and the caller's file:line where the call was made through a macro that passes
 * it, e.g.
 *
 *   "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory, requested 80.0 GiB at arena.c:120"
 *
 * The message stays until the next failing call on the same thread (successful calls do not
 * clear it) or mg_clear_error(). The library never aborts or exits the process.
 */
#ifndef METRALE_STATUS_H
#define METRALE_STATUS_H

#include "metrale/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mg_status {
    MG_OK = 0,
    MG_ERR_INVALID_ARGUMENT = 1, /* null or foreign handle, bad size, pointer, alignment, shape */
    MG_ERR_OUT_OF_MEMORY = 2,    /* device, host or pinned memory exhausted (or a test cap hit) */
    MG_ERR_UNAVAILABLE = 3,      /* backend or library not present on this machine */
    MG_ERR_UNSUPPORTED = 4,      /* this backend or device lacks the capability or op */
    MG_ERR_NOT_FOUND = 5,        /* module, function, symbol or name lookup failed */
    MG_ERR_NOT_READY = 6,        /* non-blocking query: work not finished yet (not a fault) */
    MG_ERR_CAPTURING = 7,        /* operation not allowed while the stream is being captured */
    MG_ERR_BUSY = 8,             /* object still in use (e.g. unload while handles are held) */
    MG_ERR_DEVICE = 9,           /* a driver or library call failed; the message has its code */
    MG_ERR_DEVICE_FAULT = 10,    /* sticky device fault: the context is unusable from now on */
    MG_ERR_INTERNAL = 11,        /* a bug in this library; please report the message */
} mg_status;

/* Stable upper-case name of a status, e.g. "MG_ERR_OUT_OF_MEMORY". Never NULL. */
MG_API const char *mg_status_name(mg_status status);

/* The message of the last failing call on this thread; "" if none. The text stays until the
 * next failing call on this thread or mg_clear_error() (successful calls leave it); copy it
 * to keep it past that. The pointer itself stays valid for the life of the thread. */
MG_API const char *mg_last_error(void);

/* Forget the message of the last failing call on this thread. */
MG_API void mg_clear_error(void);

/* Sets this thread's message (what mg_last_error returns) to the formatted text and returns
 * `status` (MG_ERR_INTERNAL if `status` is MG_OK), so a layer built on the library reports
 * its own failures through the same channel: `return mg_error_report(MG_ERR_INVALID_ARGUMENT,
 * "%s: no tensor %s", path, name);`. The arguments may include mg_last_error() itself, to
 * wrap the message of a failed call. */
MG_API mg_status mg_error_report(mg_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
