/*
 * gguf.h - private to src/model: a reader of GGUF files (llama.cpp's single-file checkpoint
 * format, versions 2 and 3): the metadata key/value pairs, the tensor infos and each tensor's
 * bytes, read from a read-only memory map of the file.
 *
 *   mg_gguf *g;
 *   mg_gguf_open("SmolLM2-135M-Instruct.Q4_1.gguf", &g);
 *   const mg_gguf_kv *arch = mg_gguf_find(g, "general.architecture");   // a string
 *   const mg_gguf_tensor *t = mg_gguf_tensor_find(g, "blk.0.attn_q.weight");
 *   // t->type, t->dims (dims[0] is the row length), t->data, t->bytes
 *   mg_gguf_close(g);
 *
 * The layout (little-endian): "GGUF", version u32, tensor count u64, key/value count u64; the
 * pairs (key: u64 length + bytes; value type u32; value, arrays as element type u32, count u64,
 * then the elements); the tensor infos (name, dimension count u32 <= 4, dims u64 each, ggml
 * type u32, offset u64 from the data section); the data section at the next multiple of
 * `general.alignment` (default 32) after the infos.
 *
 * What a caller may rely on: every count, length, offset and size is checked against the file
 * before it is used (MG_ERR_INVALID_ARGUMENT with a one-line message in mg_last_error naming the
 * file and what is wrong: truncation, an absurd count, a tensor past the end, an offset that
 * is not aligned, a duplicate tensor name, a byte size that overflows); nothing is read out of
 * bounds; a failed open leaves nothing allocated or mapped. Tensor types the reader does not
 * know the block size of are refused at open, naming the tensor and the type number. String
 * values point into the map and are not NUL-terminated. The handle is read-only after open and
 * may be shared between threads.
 */
#ifndef METRALE_MODEL_GGUF_H
#define METRALE_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/status.h"

/* ggml's tensor types, by their numbers in the file. */
typedef enum mg_gguf_type {
    MG_GGUF_F32 = 0,
    MG_GGUF_F16 = 1,
    MG_GGUF_Q4_0 = 2,
    MG_GGUF_Q4_1 = 3,
    MG_GGUF_Q5_0 = 6,
    MG_GGUF_Q5_1 = 7,
    MG_GGUF_Q8_0 = 8,
    MG_GGUF_Q8_1 = 9,
    MG_GGUF_Q2_K = 10,
    MG_GGUF_Q3_K = 11,
    MG_GGUF_Q4_K = 12,
    MG_GGUF_Q5_K = 13,
    MG_GGUF_Q6_K = 14,
    MG_GGUF_Q8_K = 15,
    MG_GGUF_BF16 = 30,
} mg_gguf_type;

/* "Q4_1" etc.; "type <n>" style names are not returned: NULL for a number the reader does not
 * know. */
const char *mg_gguf_type_name(uint32_t type);
/* Elements per block and bytes per block of `type`; false for an unknown type. */
bool mg_gguf_type_block(uint32_t type, uint32_t *elements, uint32_t *bytes);

/* Metadata value types. */
typedef enum mg_gguf_value_type {
    MG_GGUF_U8 = 0,
    MG_GGUF_I8 = 1,
    MG_GGUF_U16 = 2,
    MG_GGUF_I16 = 3,
    MG_GGUF_U32 = 4,
    MG_GGUF_I32 = 5,
    MG_GGUF_F32V = 6,
    MG_GGUF_BOOL = 7,
    MG_GGUF_STRING = 8,
    MG_GGUF_ARRAY = 9,
    MG_GGUF_U64 = 10,
    MG_GGUF_I64 = 11,
    MG_GGUF_F64 = 12,
} mg_gguf_value_type;

typedef struct mg_gguf_kv {
    const char *key; /* into the map, key_len bytes */
    size_t key_len;
    uint32_t type; /* mg_gguf_value_type */
    /* Scalars: the value's bytes in the map. Strings: str / str_len. Arrays: elem_type, count
     * and, for arrays of strings, strings[i] / string_lens[i] (an index built at open); other
     * arrays' elements start at `value` (packed, little-endian). */
    const uint8_t *value;
    const char *str;
    size_t str_len;
    uint32_t elem_type;
    uint64_t count;
    const char **strings;
    uint64_t *string_lens;
} mg_gguf_kv;

typedef struct mg_gguf_tensor {
    const char *name; /* NUL-terminated copy */
    uint32_t type;    /* mg_gguf_type */
    uint32_t n_dims;
    uint64_t dims[4]; /* dims[0]: elements per row; unused dims are 1 */
    uint64_t elements;
    const uint8_t *data; /* into the map */
    uint64_t bytes;
} mg_gguf_tensor;

typedef struct mg_gguf mg_gguf;

mg_status mg_gguf_open(const char *path, mg_gguf **out);
/* The same over `size` bytes at `data`, which must outlive the handle (the fuzz target's
 * entry); `what` names the data in messages. */
mg_status mg_gguf_open_memory(const void *data, size_t size, const char *what, mg_gguf **out);
/* NULL is a no-op. */
void mg_gguf_close(mg_gguf *g);

uint32_t mg_gguf_version(const mg_gguf *g);
uint64_t mg_gguf_file_bytes(const mg_gguf *g);

size_t mg_gguf_kv_count(const mg_gguf *g);
const mg_gguf_kv *mg_gguf_kv_at(const mg_gguf *g, size_t i);
/* The pair whose key is `key`, or NULL. */
const mg_gguf_kv *mg_gguf_find(const mg_gguf *g, const char *key);

/* Typed reads of a pair; false (and *out untouched) when the key is missing or its type does
 * not convert exactly: any integer type into u64 when non-negative; f32 or f64 into a double;
 * strings as NUL-terminated copies into buf (false when longer than size - 1). */
bool mg_gguf_get_u64(const mg_gguf *g, const char *key, uint64_t *out);
bool mg_gguf_get_f64(const mg_gguf *g, const char *key, double *out);
bool mg_gguf_get_bool(const mg_gguf *g, const char *key, bool *out);
bool mg_gguf_get_string(const mg_gguf *g, const char *key, char *buf, size_t size);

size_t mg_gguf_tensor_count(const mg_gguf *g);
const mg_gguf_tensor *mg_gguf_tensor_at(const mg_gguf *g, size_t i);
const mg_gguf_tensor *mg_gguf_tensor_find(const mg_gguf *g, const char *name);

#endif
