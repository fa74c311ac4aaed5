/*
 * test_files.h - the tests' one way of reading a whole file: test_read_file(path, &len) returns
 * a malloc'd copy with a NUL after the last byte (so text files read as strings) and sets *len
 * (len may be NULL); NULL when the file cannot be opened or read.
 */
#ifndef METRALE_TEST_FILES_H
#define METRALE_TEST_FILES_H

#include <stdio.h>
#include <stdlib.h>

static inline char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *p = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n + 1) : NULL;
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (!p)
        return NULL;
    p[n] = 0;
    if (len)
        *len = (size_t)n;
    return p;
}

#endif
