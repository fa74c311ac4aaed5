/*
 * metrale/export.h - MG_API, the mark of every function of the public API.
 *
 * The shared library is compiled with hidden visibility by default (-fvisibility=hidden), so
 * only functions declared with MG_API are exported from libmetrale_gpu.so; everything else in
 * the library stays internal to it. In the static library the mark changes nothing for the
 * program that links it.
 */
#ifndef METRALE_EXPORT_H
#define METRALE_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define MG_API __attribute__((visibility("default")))
#else
#define MG_API
#endif

#endif
