/*
 * metrale/safetensors.h - reading safetensors checkpoints (one file, or shards listed by
 * model.safetensors.index.json), memory-mapped and validated before any tensor is handed out.
 *
 *   mg_st_model *m;
 *   if (mg_st_open("/models/qwen3-8b-4bit", &m)) puts(mg_last_error());
 *   mg_st_tensor t;
 *   if (!mg_st_find(m, "model.embed_tokens.weight", &t)) use(t.data, t.bytes);
 *   mg_st_close(m);
 *
 * The format: a u64 little-endian header length N, N bytes of JSON mapping each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data that follows
 * the header) plus an optional "__metadata__" object of strings, then the data.
 *
 * What a caller may rely on:
 *  - Opening checks everything once: the header length against the file size, the JSON (parsed
 *    by jsmn), every dtype (one of the names below), shape (rank <= 8) and offsets (begin <=
 *    end <= data size, end - begin == elements * element size, no overflow), that no two
 *    tensors' bytes overlap, that names are unique and, for shards, that each tensor the index
 *    maps is in its shard. Any violation is MG_ERR_INVALID_ARGUMENT naming the file and the
 *    tensor; a missing file is MG_ERR_NOT_FOUND. Afterwards, every mg_st_tensor's
 *    [data, data + bytes) lies inside the mapped file.
 *  - Data stays mapped read-only until mg_st_close; tensors point into the mapping (nothing is
 *    copied). A model is immutable after opening, so it may be read from several threads.
 *  - Tensor names containing JSON escape sequences are refused (no real checkpoint has them).
 */
#ifndef METRALE_SAFETENSORS_H
#define METRALE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/export.h"
#include "metrale/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mg_st_dtype {
    MG_ST_BOOL = 0,
    MG_ST_U8,
    MG_ST_I8,
    MG_ST_I16,
    MG_ST_U16,
    MG_ST_F16,
    MG_ST_BF16,
    MG_ST_I32,
    MG_ST_U32,
    MG_ST_F32,
    MG_ST_F64,
    MG_ST_I64,
    MG_ST_U64,
    MG_ST_F8_E4M3,
    MG_ST_F8_E5M2,
    MG_ST_DTYPE_COUNT
} mg_st_dtype;

#define MG_ST_MAX_RANK 8

/* The name as the format spells it ("BF16", "U32", ...); "?" for another value. */
MG_API const char *mg_st_dtype_name(mg_st_dtype t);
/* Bytes per element; 0 for another value. */
MG_API size_t mg_st_dtype_bytes(mg_st_dtype t);

typedef struct mg_st_tensor {
    const char *name; /* valid until mg_st_close */
    mg_st_dtype dtype;
    uint32_t rank;
    uint64_t shape[MG_ST_MAX_RANK];
    uint64_t bytes;
    const void *data; /* inside the mapping; NULL when bytes is 0 */
    uint32_t shard;   /* which file of a sharded checkpoint (0 for one file) */
} mg_st_tensor;

typedef struct mg_st_model mg_st_model;

/* Opens `path`: a .safetensors file, a model.safetensors.index.json, or a directory holding
 * either (the index is preferred). */
MG_API mg_status mg_st_open(const char *path, mg_st_model **out);
/* Validates a whole file image held in memory (the bytes are borrowed, not copied: keep them
 * alive until mg_st_close). `what` names it in messages (NULL: "memory"). */
MG_API mg_status mg_st_open_memory(const void *bytes, size_t size, const char *what,
                                   mg_st_model **out);
/* NULL is a no-op. */
MG_API void mg_st_close(mg_st_model *m);

/* Tensors, sorted by name. */
MG_API size_t mg_st_count(const mg_st_model *m);
MG_API mg_status mg_st_get(const mg_st_model *m, size_t index, mg_st_tensor *out);
/* MG_ERR_NOT_FOUND (message names the tensor) when there is no tensor `name`. */
MG_API mg_status mg_st_find(const mg_st_model *m, const char *name, mg_st_tensor *out);
/* The value of `key` in the first file's __metadata__ ("format" is "mlx" for MLX files), or
 * NULL. Valid until mg_st_close. */
MG_API const char *mg_st_metadata(const mg_st_model *m, const char *key);

#ifdef __cplusplus
}
#endif
#endif
