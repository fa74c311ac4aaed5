/* host_memory.c - host memory available for allocation (host_memory.h). */
#include "host_memory.h"

#include <stdio.h>
#include <unistd.h>

uint64_t mg_host_meminfo_available_bytes(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (uint64_t)kib * 1024u;
}

uint64_t mg_host_available_bytes(void) {
    uint64_t available = mg_host_meminfo_available_bytes("/proc/meminfo");
    if (available)
        return available;
    long pages = sysconf(_SC_AVPHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
    return pages > 0 && page_bytes > 0 ? (uint64_t)pages * (uint64_t)page_bytes : 0;
}
