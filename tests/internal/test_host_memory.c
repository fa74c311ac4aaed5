/*
 * test_host_memory.c - the one MemAvailable reader both backends use (src/core/host_memory.h):
 * the line is found wherever it is in the file, in kB, with other lines around it; a file
 * without it, or no file, reads 0; the live value is nonzero on Linux and is what the CPU
 * backend reports as free memory (at most its total).
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "host_memory.h"
#include "test_util.h"

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

int main(void) {
    test_seed();
    char path[] = "/tmp/metrale-meminfo-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return test_finish();
    close(fd);

    unsigned long long kib = test_rand_range(1, 1ull << 40);
    char text[512];
    snprintf(text, sizeof text,
             "MemTotal:       263842808 kB\n"
             "MemFree:          1234567 kB\n"
             "MemAvailable:   %llu kB\n"
             "Buffers:           876543 kB\n",
             kib);
    write_file(path, text);
    CHECK(mg_host_meminfo_available_bytes(path) == (uint64_t)kib * 1024u);

    write_file(path, "MemTotal:       263842808 kB\nMemFree:          1234567 kB\n");
    CHECK(mg_host_meminfo_available_bytes(path) == 0); /* MemFree is not MemAvailable */
    write_file(path, "");
    CHECK(mg_host_meminfo_available_bytes(path) == 0);
    unlink(path);
    CHECK(mg_host_meminfo_available_bytes(path) == 0);

    uint64_t live = mg_host_available_bytes();
    CHECK(live > 0);
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (b) {
        uint64_t free_bytes = 0, total_bytes = 0;
        CHECK_OK(mg_memory_free_bytes(b, &free_bytes, &total_bytes));
        /* read a moment apart: equal within what other processes allocate meanwhile */
        uint64_t again = mg_host_available_bytes();
        uint64_t lo = live < again ? live : again, hi = live < again ? again : live;
        if (lo > total_bytes) /* the backend caps what it reports at physical memory */
            lo = total_bytes;
        if (hi > total_bytes)
            hi = total_bytes;
        CHECK(free_bytes + (256u << 20) >= lo && free_bytes <= hi + (256u << 20));
        CHECK(free_bytes <= total_bytes);
        CHECK_OK(mg_backend_close(b));
    }
    return test_finish();
}
