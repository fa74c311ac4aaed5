/*
 * host_memory.h - private: how much host memory can be allocated, as the backends report it
 * (the CPU backend's free memory; an integrated CUDA GPU, which shares host memory).
 */
#ifndef METRALE_HOST_MEMORY_H
#define METRALE_HOST_MEMORY_H

#include <stdint.h>

/* MemAvailable of a /proc/meminfo-format file at `path`, in bytes: what the kernel says can
 * be allocated without swapping. 0 when the file cannot be read or has no such line. */
uint64_t mg_host_meminfo_available_bytes(const char *path);

/* MemAvailable of /proc/meminfo, or where that cannot be read the free pages
 * (sysconf(_SC_AVPHYS_PAGES)); 0 when neither is known. */
uint64_t mg_host_available_bytes(void);

#endif
