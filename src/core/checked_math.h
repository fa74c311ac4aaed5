/*
 * checked_math.h - private: overflow-checked size arithmetic. Every byte span an op checks
 * against its buffers is computed here, so a huge shape is an error, never a small span that
 * passes the range check and a kernel that writes past the buffer.
 */
#ifndef METRALE_CHECKED_MATH_H
#define METRALE_CHECKED_MATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* a * b, false on overflow. */
static inline bool mg_mul_size(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

/* Bytes from the first element of a row-major matrix to one past its last:
 * ((rows - 1) * pitch + cols) * element_bytes, with rows >= 1 and cols <= pitch. False on
 * overflow. */
static inline bool mg_matrix_span_bytes(uint64_t rows, uint64_t cols, uint64_t pitch,
                                        uint64_t element_bytes, size_t *out) {
    size_t elements;
    if (rows == 0)
        return mg_mul_size(0, 0, out);
    return mg_mul_size((size_t)(rows - 1), (size_t)pitch, &elements) &&
           !__builtin_add_overflow(elements, (size_t)cols, &elements) &&
           mg_mul_size(elements, (size_t)element_bytes, out);
}

#endif
