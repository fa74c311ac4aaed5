/* safetensors.c - the safetensors reader (metrale/safetensors.h): files memory-mapped, headers
 * parsed by jsmn (mlx_json.h) and validated in full before a model is returned. */
#include "metrale/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "mlx_json.h"

/* safetensors' own reference reader refuses headers above 100 MB. */
#define MAX_HEADER_BYTES (100u << 20)

static const struct {
    const char *name;
    size_t bytes;
} dtypes[MG_ST_DTYPE_COUNT] = {
    [MG_ST_BOOL] = {"BOOL", 1}, [MG_ST_U8] = {"U8", 1},           [MG_ST_I8] = {"I8", 1},
    [MG_ST_I16] = {"I16", 2},   [MG_ST_U16] = {"U16", 2},         [MG_ST_F16] = {"F16", 2},
    [MG_ST_BF16] = {"BF16", 2}, [MG_ST_I32] = {"I32", 4},         [MG_ST_U32] = {"U32", 4},
    [MG_ST_F32] = {"F32", 4},   [MG_ST_F64] = {"F64", 8},         [MG_ST_I64] = {"I64", 8},
    [MG_ST_U64] = {"U64", 8},   [MG_ST_F8_E4M3] = {"F8_E4M3", 1}, [MG_ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *mg_st_dtype_name(mg_st_dtype t) {
    return (unsigned)t < MG_ST_DTYPE_COUNT ? dtypes[t].name : "?";
}

size_t mg_st_dtype_bytes(mg_st_dtype t) {
    return (unsigned)t < MG_ST_DTYPE_COUNT ? dtypes[t].bytes : 0;
}

typedef struct shard {
    char *what; /* the path, or the caller's name for a memory image */
    const uint8_t *bytes;
    size_t size;
    bool mapped;
} shard;

typedef struct meta_entry {
    char *key, *value;
} meta_entry;

struct mg_st_model {
    shard *shards;
    uint32_t shard_count;
    mg_st_tensor *tensors; /* sorted by name after opening; names owned */
    size_t count, capacity;
    meta_entry *meta; /* the first file's __metadata__ */
    size_t meta_count;
};

/* ------------------------------------------------------------------ one header */

static mg_status grow(mg_st_model *m) {
    if (m->count < m->capacity)
        return MG_OK;
    size_t cap = m->capacity ? m->capacity * 2 : 64;
    mg_st_tensor *t = realloc(m->tensors, cap * sizeof *t);
    if (!t)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "safetensors: no host memory for %zu tensors", cap);
    m->tensors = t;
    m->capacity = cap;
    return MG_OK;
}

static char *copy_token(const mg_json_doc *doc, int i) {
    size_t n = (size_t)(doc->tokens[i].end - doc->tokens[i].start);
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, doc->text + doc->tokens[i].start, n);
        s[n] = '\0';
    }
    return s;
}

static mg_status read_metadata(mg_st_model *m, const mg_json_doc *doc, int obj, const char *what) {
    const mg_json_token *t = &doc->tokens[obj];
    /* MLX writes "__metadata__": null when there is none. */
    if (t->type == MG_JSON_PRIMITIVE && t->end - t->start == 4 &&
        !memcmp(doc->text + t->start, "null", 4))
        return MG_OK;
    if (t->type != MG_JSON_OBJECT)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: __metadata__ is not an object", what);
    bool keep = m->shard_count == 1; /* only the first file's metadata is kept */
    int i = obj + 1;
    for (int k = 0; k < doc->tokens[obj].size; k++, i = mg_json_skip(doc, i + 1)) {
        if (i + 1 >= doc->count || doc->tokens[i + 1].type != MG_JSON_STRING)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: __metadata__ value %d is not a string",
                            what, k);
        if (!keep)
            continue;
        meta_entry *e = realloc(m->meta, (m->meta_count + 1) * sizeof *e);
        if (!e)
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory for metadata", what);
        m->meta = e;
        e[m->meta_count] = (meta_entry){copy_token(doc, i), copy_token(doc, i + 1)};
        if (!e[m->meta_count].key || !e[m->meta_count].value) {
            free(e[m->meta_count].key);
            free(e[m->meta_count].value);
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory for metadata", what);
        }
        m->meta_count++;
    }
    return MG_OK;
}

static bool parse_dtype(const mg_json_doc *doc, int i, mg_st_dtype *out) {
    for (int d = 0; d < MG_ST_DTYPE_COUNT; d++)
        if (mg_json_equals(doc, i, dtypes[d].name))
            return *out = (mg_st_dtype)d, true;
    return false;
}

/* One tensor's entry (the object at `obj`) into t; data_size is the bytes after the header. */
static mg_status parse_entry(const mg_json_doc *doc, int obj, const char *what, const char *name,
                             uint64_t data_size, const uint8_t *data, mg_st_tensor *t,
                             uint64_t offsets[2]) {
    if (doc->tokens[obj].type != MG_JSON_OBJECT)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: tensor %s: entry is not an object", what,
                        name);
    int dt = mg_json_member(doc, obj, "dtype"), sh = mg_json_member(doc, obj, "shape"),
        off = mg_json_member(doc, obj, "data_offsets");
    if (dt < 0 || sh < 0 || off < 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: tensor %s: missing %s", what, name,
                        dt < 0   ? "dtype"
                        : sh < 0 ? "shape"
                                 : "data_offsets");
    if (!parse_dtype(doc, dt, &t->dtype))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: tensor %s: unknown dtype", what, name);
    if (doc->tokens[sh].type != MG_JSON_ARRAY || doc->tokens[sh].size > MG_ST_MAX_RANK)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: tensor %s: shape is not an array of at most %d sizes", what, name,
                        MG_ST_MAX_RANK);
    t->rank = (uint32_t)doc->tokens[sh].size;
    uint64_t elements = 1;
    for (uint32_t r = 0; r < t->rank; r++) {
        if (!mg_json_u64(doc, sh + 1 + (int)r, &t->shape[r]))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: tensor %s: shape[%u] is not a non-negative integer", what, name,
                            r);
        if (__builtin_mul_overflow(elements, t->shape[r], &elements))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: tensor %s: shape overflows", what, name);
    }
    if (doc->tokens[off].type != MG_JSON_ARRAY || doc->tokens[off].size != 2 ||
        !mg_json_u64(doc, off + 1, &offsets[0]) || !mg_json_u64(doc, off + 2, &offsets[1]))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: tensor %s: data_offsets is not [begin, end] of integers", what, name);
    if (offsets[0] > offsets[1] || offsets[1] > data_size)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: tensor %s: data_offsets [%llu, %llu] out of range (data holds %llu "
                        "bytes%s)",
                        what, name, (unsigned long long)offsets[0], (unsigned long long)offsets[1],
                        (unsigned long long)data_size,
                        offsets[1] > data_size ? "; truncated file?" : "");
    uint64_t bytes;
    if (__builtin_mul_overflow(elements, (uint64_t)dtypes[t->dtype].bytes, &bytes) ||
        bytes != offsets[1] - offsets[0])
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: tensor %s: %llu bytes between its offsets, its dtype %s and shape "
                        "need %llu",
                        what, name, (unsigned long long)(offsets[1] - offsets[0]),
                        dtypes[t->dtype].name, (unsigned long long)bytes);
    t->bytes = bytes;
    t->data = bytes ? data + offsets[0] : NULL;
    return MG_OK;
}

typedef struct span {
    uint64_t begin, end;
    const char *name;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Parses the file image of shard `index` and appends its tensors. */
static mg_status parse_shard(mg_st_model *m, uint32_t index) {
    const shard *sh = &m->shards[index];
    const char *what = sh->what;
    if (sh->size < 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: truncated file: %zu bytes, less than the 8-byte header length", what,
                        sh->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | sh->bytes[i];
    if (n > MAX_HEADER_BYTES || n > sh->size - 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: header length %llu exceeds the %zu bytes after it%s", what,
                        (unsigned long long)n, sh->size - 8,
                        n > MAX_HEADER_BYTES ? " (or the 100 MB limit)" : "; truncated file?");
    mg_json_doc doc;
    char label[PATH_MAX + 32];
    snprintf(label, sizeof label, "%s: header", what);
    mg_status st = mg_json_parse((const char *)sh->bytes + 8, (size_t)n, label, &doc);
    if (st)
        return st;
    const uint8_t *data = sh->bytes + 8 + n;
    uint64_t data_size = sh->size - 8 - n;
    span *spans = malloc(((size_t)doc.tokens[0].size + 1) * sizeof *spans);
    size_t span_count = 0;
    if (!spans)
        st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory", what);
    int i = 1;
    for (int k = 0; !st && k < doc.tokens[0].size; k++, i = mg_json_skip(&doc, i + 1)) {
        if (i + 1 >= doc.count) {
            st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: header member %d has no value", what, k);
            break;
        }
        if (!mg_json_plain_string(&doc, i)) {
            st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                          "%s: tensor name %d has a JSON escape sequence (not supported)", what, k);
            break;
        }
        if (mg_json_equals(&doc, i, "__metadata__")) {
            st = read_metadata(m, &doc, i + 1, what);
            continue;
        }
        if ((st = grow(m)))
            break;
        mg_st_tensor *t = &m->tensors[m->count];
        memset(t, 0, sizeof *t);
        char *name = copy_token(&doc, i);
        if (!name) {
            st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory", what);
            break;
        }
        uint64_t offsets[2];
        st = parse_entry(&doc, i + 1, what, name, data_size, data, t, offsets);
        if (st) {
            free(name);
            break;
        }
        t->name = name;
        t->shard = index;
        m->count++;
        if (offsets[1] > offsets[0])
            spans[span_count++] = (span){offsets[0], offsets[1], name};
    }
    if (!st) {
        qsort(spans, span_count, sizeof *spans, span_cmp);
        for (size_t k = 1; k < span_count; k++)
            if (spans[k].begin < spans[k - 1].end) {
                st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                              "%s: tensors %s and %s have overlapping data_offsets", what,
                              spans[k - 1].name, spans[k].name);
                break;
            }
    }
    free(spans);
    mg_json_free(&doc);
    return st;
}

/* ------------------------------------------------------------------ model */

static int tensor_cmp(const void *a, const void *b) {
    return strcmp(((const mg_st_tensor *)a)->name, ((const mg_st_tensor *)b)->name);
}

static mg_status finish(mg_st_model *m) {
    if (m->count > 1) /* a file may hold no tensor (then the array is NULL) */
        qsort(m->tensors, m->count, sizeof *m->tensors, tensor_cmp);
    for (size_t i = 1; i < m->count; i++)
        if (!strcmp(m->tensors[i].name, m->tensors[i - 1].name))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: tensor %s appears twice",
                            m->shards[m->tensors[i].shard].what, m->tensors[i].name);
    return MG_OK;
}

void mg_st_close(mg_st_model *m) {
    if (!m)
        return;
    for (size_t i = 0; i < m->count; i++)
        free((char *)m->tensors[i].name);
    for (uint32_t i = 0; i < m->shard_count; i++) {
        if (m->shards[i].mapped && m->shards[i].size)
            munmap((void *)m->shards[i].bytes, m->shards[i].size);
        free(m->shards[i].what);
    }
    for (size_t i = 0; i < m->meta_count; i++) {
        free(m->meta[i].key);
        free(m->meta[i].value);
    }
    free(m->meta);
    free(m->shards);
    free(m->tensors);
    free(m);
}

static mg_status add_shard(mg_st_model *m, const char *what, uint32_t *index) {
    shard *s = realloc(m->shards, (m->shard_count + 1) * sizeof *s);
    if (!s)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "safetensors: no host memory");
    m->shards = s;
    memset(&s[m->shard_count], 0, sizeof *s);
    s[m->shard_count].what = strdup(what);
    if (!s[m->shard_count].what)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "safetensors: no host memory");
    *index = m->shard_count++;
    return MG_OK;
}

mg_status mg_st_open_memory(const void *bytes, size_t size, const char *what, mg_st_model **out) {
    if (!out || (!bytes && size))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_st_open_memory: NULL %s",
                        out ? "bytes" : "out");
    *out = NULL;
    mg_st_model *m = calloc(1, sizeof *m);
    if (!m)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_st_open_memory: no host memory");
    uint32_t index;
    mg_status st = add_shard(m, what ? what : "memory", &index);
    if (!st) {
        m->shards[index].bytes = bytes;
        m->shards[index].size = size;
        st = parse_shard(m, index);
    }
    if (!st)
        st = finish(m);
    if (st) {
        mg_st_close(m);
        return st;
    }
    *out = m;
    return MG_OK;
}

/* Maps `path` read-only into shard `index`. */
static mg_status map_file(mg_st_model *m, uint32_t index, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return MG_ERROR(errno == ENOENT ? MG_ERR_NOT_FOUND : MG_ERR_INVALID_ARGUMENT,
                        "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    mg_status st = MG_OK;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode))
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: not a regular file", path);
    else if (sb.st_size > 0) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
            st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: mmap failed: %s", path, strerror(errno));
        else {
            m->shards[index].bytes = p;
            m->shards[index].size = (size_t)sb.st_size;
            m->shards[index].mapped = true;
        }
    }
    close(fd);
    return st;
}

static mg_status open_file(mg_st_model *m, const char *path, uint32_t *index) {
    mg_status st = add_shard(m, path, index);
    if (!st)
        st = map_file(m, *index, path);
    return st ? st : parse_shard(m, *index);
}

static char *read_text(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = -1;
    if (!fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
        *size = (size_t)n;
    } else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* The directory part of `path` (with its slash), into dir. */
static void dir_of(const char *path, char *dir, size_t bytes) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) + 1 : 0;
    snprintf(dir, bytes, "%.*s", (int)n, path);
}

static mg_status open_index(mg_st_model *m, const char *path) {
    size_t size;
    char *text = read_text(path, &size);
    if (!text)
        return MG_ERROR(errno == ENOENT ? MG_ERR_NOT_FOUND : MG_ERR_INVALID_ARGUMENT,
                        "%s: cannot read: %s", path, strerror(errno));
    mg_json_doc doc;
    mg_status st = mg_json_parse(text, size, path, &doc);
    if (st) {
        free(text);
        return st;
    }
    int map = mg_json_member(&doc, 0, "weight_map");
    if (map < 0 || doc.tokens[map].type != MG_JSON_OBJECT)
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: no weight_map object", path);
    char dir[PATH_MAX], file[PATH_MAX], full[2 * PATH_MAX];
    dir_of(path, dir, sizeof dir);
    /* Open each file the map names, the first time it is named. */
    int i = map + 1;
    for (int k = 0; !st && k < doc.tokens[map].size; k++, i = mg_json_skip(&doc, i + 1)) {
        if (!mg_json_copy(&doc, i + 1, file, sizeof file) || strstr(file, "..") || file[0] == '/') {
            st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                          "%s: weight_map entry %d is not a file name inside the directory", path,
                          k);
            break;
        }
        snprintf(full, sizeof full, "%s%s", dir, file);
        uint32_t s = 0;
        while (s < m->shard_count && strcmp(m->shards[s].what, full))
            s++;
        if (s == m->shard_count)
            st = open_file(m, full, &s);
    }
    if (!st)
        st = finish(m);
    /* Each mapped name must be in the file the map names. */
    i = map + 1;
    for (int k = 0; !st && k < doc.tokens[map].size; k++, i = mg_json_skip(&doc, i + 1)) {
        char name[1024];
        mg_st_tensor t;
        if (!mg_json_copy(&doc, i, name, sizeof name)) {
            st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: weight_map key %d is not a plain name",
                          path, k);
            break;
        }
        mg_json_copy(&doc, i + 1, file, sizeof file);
        snprintf(full, sizeof full, "%s%s", dir, file);
        if ((st = mg_st_find(m, name, &t)))
            st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: tensor %s is mapped to %s, which lacks it",
                          path, name, file);
        else if (strcmp(m->shards[t.shard].what, full))
            st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: tensor %s is mapped to %s but is in %s",
                          path, name, file, m->shards[t.shard].what);
    }
    mg_json_free(&doc);
    free(text);
    return st;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

mg_status mg_st_open(const char *path, mg_st_model **out) {
    if (!path || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_st_open: NULL %s", path ? "out" : "path");
    *out = NULL;
    char file[PATH_MAX];
    struct stat sb;
    if (stat(path, &sb))
        return MG_ERROR(MG_ERR_NOT_FOUND, "mg_st_open: %s: %s", path, strerror(errno));
    snprintf(file, sizeof file, "%s", path);
    if (S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/model.safetensors.index.json", path);
        if (!exists(file))
            snprintf(file, sizeof file, "%s/model.safetensors", path);
        if (!exists(file))
            return MG_ERROR(MG_ERR_NOT_FOUND,
                            "mg_st_open: %s holds neither model.safetensors.index.json nor "
                            "model.safetensors",
                            path);
    }
    mg_st_model *m = calloc(1, sizeof *m);
    if (!m)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_st_open: no host memory");
    mg_status st;
    if (ends_with(file, ".json")) {
        st = open_index(m, file);
    } else {
        uint32_t index;
        st = open_file(m, file, &index);
        if (!st)
            st = finish(m);
    }
    if (st) {
        mg_st_close(m);
        return st;
    }
    *out = m;
    return MG_OK;
}

size_t mg_st_count(const mg_st_model *m) {
    return m ? m->count : 0;
}

mg_status mg_st_get(const mg_st_model *m, size_t index, mg_st_tensor *out) {
    if (!m || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_st_get: NULL %s", m ? "out" : "model");
    if (index >= m->count)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_st_get: index %zu, the model has %zu tensors",
                        index, m->count);
    *out = m->tensors[index];
    return MG_OK;
}

mg_status mg_st_find(const mg_st_model *m, const char *name, mg_st_tensor *out) {
    if (!m || !name || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_st_find: NULL %s",
                        !m      ? "model"
                        : !name ? "name"
                                : "out");
    size_t lo = 0, hi = m->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->tensors[mid].name, name);
        if (!c) {
            *out = m->tensors[mid];
            return MG_OK;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return MG_ERROR(MG_ERR_NOT_FOUND, "mg_st_find: no tensor %s", name);
}

const char *mg_st_metadata(const mg_st_model *m, const char *key) {
    if (!m || !key)
        return NULL;
    for (size_t i = 0; i < m->meta_count; i++)
        if (!strcmp(m->meta[i].key, key))
            return m->meta[i].value;
    return NULL;
}
