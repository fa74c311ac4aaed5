/* gguf.c - the GGUF reader (gguf.h): one bounds-checked pass over the header at open. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_mlx.h" /* mg_error_report */

/* Limits that no real file comes near; above them a count is taken for corruption before any
 * allocation is sized from it. */
#define MAX_TENSORS (1u << 20)
#define MAX_KVS (1u << 20)
#define MAX_ARRAY_DEPTH 4
#define MAX_NAME_BYTES 4096

struct mg_gguf {
    const uint8_t *base;
    size_t size;
    void *map; /* the mmap of mg_gguf_open; NULL for mg_gguf_open_memory */
    uint32_t version;
    mg_gguf_kv *kvs;
    size_t kv_count;
    mg_gguf_tensor *tensors;
    size_t tensor_count;
    char what[256];
};

static const struct {
    uint32_t type;
    const char *name;
    uint32_t elements, bytes;
} types[] = {
    {MG_GGUF_F32, "F32", 1, 4},       {MG_GGUF_F16, "F16", 1, 2},
    {MG_GGUF_Q4_0, "Q4_0", 32, 18},   {MG_GGUF_Q4_1, "Q4_1", 32, 20},
    {MG_GGUF_Q5_0, "Q5_0", 32, 22},   {MG_GGUF_Q5_1, "Q5_1", 32, 24},
    {MG_GGUF_Q8_0, "Q8_0", 32, 34},   {MG_GGUF_Q8_1, "Q8_1", 32, 36},
    {MG_GGUF_Q2_K, "Q2_K", 256, 84},  {MG_GGUF_Q3_K, "Q3_K", 256, 110},
    {MG_GGUF_Q4_K, "Q4_K", 256, 144}, {MG_GGUF_Q5_K, "Q5_K", 256, 176},
    {MG_GGUF_Q6_K, "Q6_K", 256, 210}, {MG_GGUF_Q8_K, "Q8_K", 256, 292},
    {MG_GGUF_BF16, "BF16", 1, 2},
};

const char *mg_gguf_type_name(uint32_t type) {
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (types[i].type == type)
            return types[i].name;
    return NULL;
}

bool mg_gguf_type_block(uint32_t type, uint32_t *elements, uint32_t *bytes) {
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (types[i].type == type) {
            *elements = types[i].elements;
            *bytes = types[i].bytes;
            return true;
        }
    return false;
}

/* Bytes of one scalar metadata value; 0 for strings, arrays and unknown types. */
static size_t scalar_bytes(uint32_t type) {
    switch (type) {
    case MG_GGUF_U8:
    case MG_GGUF_I8:
    case MG_GGUF_BOOL:
        return 1;
    case MG_GGUF_U16:
    case MG_GGUF_I16:
        return 2;
    case MG_GGUF_U32:
    case MG_GGUF_I32:
    case MG_GGUF_F32V:
        return 4;
    case MG_GGUF_U64:
    case MG_GGUF_I64:
    case MG_GGUF_F64:
        return 8;
    default:
        return 0;
    }
}

/* A cursor over the header: every read checks the bytes left. */
typedef struct cursor {
    const mg_gguf *g;
    size_t pos;
} cursor;

static mg_status truncated(const cursor *c, const char *reading) {
    return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: truncated at byte %zu reading %s",
                           c->g->what, c->pos, reading);
}

static bool take(cursor *c, size_t n, const uint8_t **at) {
    if (n > c->g->size - c->pos)
        return false;
    *at = c->g->base + c->pos;
    c->pos += n;
    return true;
}

static bool read_u32(cursor *c, uint32_t *v) {
    const uint8_t *p;
    if (!take(c, 4, &p))
        return false;
    *v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return true;
}

static uint64_t load_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static bool read_u64(cursor *c, uint64_t *v) {
    const uint8_t *p;
    if (!take(c, 8, &p))
        return false;
    *v = load_u64(p);
    return true;
}

static bool read_string(cursor *c, const char **s, uint64_t *len) {
    uint64_t n;
    const uint8_t *p;
    if (!read_u64(c, &n) || n > c->g->size - c->pos || !take(c, (size_t)n, &p))
        return false;
    *s = (const char *)p;
    *len = n;
    return true;
}

/* Skips one value of `type` (arrays nested up to MAX_ARRAY_DEPTH); false when the file ends
 * first or the type is unknown (*bad_type set then). */
static bool skip_value(cursor *c, uint32_t type, int depth, bool *bad_type) {
    size_t n = scalar_bytes(type);
    const uint8_t *p;
    if (n)
        return take(c, n, &p);
    if (type == MG_GGUF_STRING) {
        const char *s;
        uint64_t len;
        return read_string(c, &s, &len);
    }
    if (type != MG_GGUF_ARRAY || depth >= MAX_ARRAY_DEPTH) {
        *bad_type = true;
        return false;
    }
    uint32_t elem;
    uint64_t count;
    if (!read_u32(c, &elem) || !read_u64(c, &count))
        return false;
    size_t eb = scalar_bytes(elem);
    if (eb) /* a packed array: one bounds check for all of it */
        return count <= (c->g->size - c->pos) / eb && take(c, (size_t)(count * eb), &p);
    for (uint64_t i = 0; i < count; i++)
        if (!skip_value(c, elem, depth + 1, bad_type))
            return false;
    return true;
}

static mg_status parse_kv(cursor *c, mg_gguf_kv *kv, uint64_t index) {
    uint64_t klen;
    if (!read_string(c, &kv->key, &klen))
        return truncated(c, "a metadata key");
    kv->key_len = (size_t)klen;
    if (!read_u32(c, &kv->type))
        return truncated(c, "a metadata type");
    bool bad_type = false;
    kv->value = c->g->base + c->pos;
    if (kv->type == MG_GGUF_STRING) {
        uint64_t len;
        if (!read_string(c, &kv->str, &len))
            return truncated(c, "a metadata string");
        kv->str_len = (size_t)len;
        return MG_OK;
    }
    if (kv->type != MG_GGUF_ARRAY) {
        if (!skip_value(c, kv->type, 0, &bad_type))
            goto bad;
        return MG_OK;
    }
    if (!read_u32(c, &kv->elem_type) || !read_u64(c, &kv->count))
        return truncated(c, "a metadata array");
    kv->value = c->g->base + c->pos;
    if (kv->elem_type == MG_GGUF_STRING) {
        /* every string needs at least its 8-byte length: a count beyond that is corrupt */
        if (kv->count > (c->g->size - c->pos) / 8)
            return truncated(c, "a string array");
        kv->strings = malloc((size_t)(kv->count ? kv->count : 1) * sizeof *kv->strings);
        kv->string_lens = malloc((size_t)(kv->count ? kv->count : 1) * sizeof *kv->string_lens);
        if (!kv->strings || !kv->string_lens)
            return mg_error_report(MG_ERR_OUT_OF_MEMORY, "GGUF %s: out of host memory", c->g->what);
        for (uint64_t i = 0; i < kv->count; i++)
            if (!read_string(c, &kv->strings[i], &kv->string_lens[i]))
                return truncated(c, "a string array");
        return MG_OK;
    }
    c->pos -= 12; /* re-read the array header through the generic skip */
    if (!skip_value(c, MG_GGUF_ARRAY, 0, &bad_type))
        goto bad;
    return MG_OK;
bad:
    if (bad_type)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: metadata pair %llu (%.*s) has unknown value type %u",
                               c->g->what, (unsigned long long)index,
                               (int)(kv->key_len > 200 ? 200 : kv->key_len), kv->key, kv->type);
    return truncated(c, "a metadata value");
}

static int compare_names(const void *a, const void *b) {
    const mg_gguf_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static mg_status parse_tensor(cursor *c, mg_gguf_tensor *t, uint64_t index) {
    const char *name;
    uint64_t len;
    if (!read_string(c, &name, &len))
        return truncated(c, "a tensor name");
    if (len == 0 || len > MAX_NAME_BYTES || memchr(name, 0, (size_t)len))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: tensor %llu has an empty, overlong or NUL-holding name",
                               c->g->what, (unsigned long long)index);
    char *copy = malloc((size_t)len + 1);
    if (!copy)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "GGUF %s: out of host memory", c->g->what);
    memcpy(copy, name, (size_t)len);
    copy[len] = '\0';
    t->name = copy;
    if (!read_u32(c, &t->n_dims))
        return truncated(c, "a tensor's dimension count");
    if (t->n_dims < 1 || t->n_dims > 4)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: tensor %s has %u dimensions (1..4)", c->g->what, t->name,
                               t->n_dims);
    t->elements = 1;
    for (uint32_t d = 0; d < 4; d++) {
        t->dims[d] = 1;
        if (d < t->n_dims && !read_u64(c, &t->dims[d]))
            return truncated(c, "a tensor's dimensions");
        if (t->dims[d] == 0 || t->dims[d] > (1ull << 40) || t->elements > (1ull << 50) / t->dims[d])
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "GGUF %s: tensor %s has an empty or absurd dimension %u (%llu)",
                                   c->g->what, t->name, d, (unsigned long long)t->dims[d]);
        t->elements *= t->dims[d];
    }
    uint64_t offset;
    if (!read_u32(c, &t->type) || !read_u64(c, &offset))
        return truncated(c, "a tensor's type and offset");
    uint32_t be, bb;
    if (!mg_gguf_type_block(t->type, &be, &bb))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: tensor %s has unknown type %u",
                               c->g->what, t->name, t->type);
    if (t->dims[0] % be)
        return mg_error_report(
            MG_ERR_INVALID_ARGUMENT,
            "GGUF %s: tensor %s: rows of %llu elements are not whole %s blocks of "
            "%u",
            c->g->what, t->name, (unsigned long long)t->dims[0], mg_gguf_type_name(t->type), be);
    t->bytes = t->elements / be * bb;
    t->data = (const uint8_t *)(uintptr_t)offset; /* relative until the data section is known */
    return MG_OK;
}

static mg_status parse(mg_gguf *g) {
    cursor c = {.g = g};
    const uint8_t *magic;
    uint64_t tensors, kvs;
    if (!take(&c, 4, &magic))
        return truncated(&c, "the magic");
    if (memcmp(magic, "GGUF", 4))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: not a GGUF file (bad magic)",
                               g->what);
    if (!read_u32(&c, &g->version))
        return truncated(&c, "the version");
    if (g->version != 2 && g->version != 3)
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "GGUF %s: version %u (versions 2 and 3 are read)", g->what,
                               g->version);
    if (!read_u64(&c, &tensors) || !read_u64(&c, &kvs))
        return truncated(&c, "the counts");
    if (tensors > MAX_TENSORS || kvs > MAX_KVS)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: %llu tensors and %llu metadata pairs: absurd counts",
                               g->what, (unsigned long long)tensors, (unsigned long long)kvs);
    g->kvs = calloc(kvs ? kvs : 1, sizeof *g->kvs);
    g->tensors = calloc(tensors ? tensors : 1, sizeof *g->tensors);
    if (!g->kvs || !g->tensors)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "GGUF %s: out of host memory", g->what);
    mg_status st;
    for (uint64_t i = 0; i < kvs; i++, g->kv_count++)
        if ((st = parse_kv(&c, &g->kvs[i], i))) {
            g->kv_count++; /* its index arrays are freed with the rest */
            return st;
        }
    uint64_t alignment = 32;
    const mg_gguf_kv *a = mg_gguf_find(g, "general.alignment");
    if (a && (!mg_gguf_get_u64(g, "general.alignment", &alignment) || alignment == 0 ||
              alignment > 1u << 20 || (alignment & (alignment - 1))))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: general.alignment must be a power of two up to 2^20",
                               g->what);
    for (uint64_t i = 0; i < tensors; i++, g->tensor_count++)
        if ((st = parse_tensor(&c, &g->tensors[i], i))) {
            g->tensor_count++;
            return st;
        }
    uint64_t data = (c.pos + alignment - 1) / alignment * alignment;
    for (size_t i = 0; i < g->tensor_count; i++) {
        mg_gguf_tensor *t = &g->tensors[i];
        uint64_t offset = (uint64_t)(uintptr_t)t->data;
        if (offset % alignment)
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "GGUF %s: tensor %s's offset %llu is not a multiple of the "
                                   "alignment %llu",
                                   g->what, t->name, (unsigned long long)offset,
                                   (unsigned long long)alignment);
        if (data > g->size || offset > g->size - data || t->bytes > g->size - data - offset)
            return mg_error_report(
                MG_ERR_INVALID_ARGUMENT,
                "GGUF %s: tensor %s (%llu bytes at %llu) ends past the end of the "
                "file (%zu bytes)",
                g->what, t->name, (unsigned long long)t->bytes, (unsigned long long)(data + offset),
                g->size);
        t->data = g->base + data + offset;
    }
    /* duplicate names make lookups ambiguous: refuse them */
    if (g->tensor_count > 1) {
        const mg_gguf_tensor **order = malloc(g->tensor_count * sizeof *order);
        if (!order)
            return mg_error_report(MG_ERR_OUT_OF_MEMORY, "GGUF %s: out of host memory", g->what);
        for (size_t i = 0; i < g->tensor_count; i++)
            order[i] = &g->tensors[i];
        qsort(order, g->tensor_count, sizeof *order, compare_names);
        for (size_t i = 1; i < g->tensor_count; i++)
            if (!strcmp(order[i - 1]->name, order[i]->name)) {
                st = mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: tensor %s appears twice",
                                     g->what, order[i]->name);
                free(order);
                return st;
            }
        free(order);
    }
    return MG_OK;
}

static mg_status open_over(const void *data, size_t size, void *map, const char *what,
                           mg_gguf **out) {
    mg_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (map)
            munmap(map, size);
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "GGUF %s: out of host memory", what);
    }
    g->base = data;
    g->size = size;
    g->map = map;
    snprintf(g->what, sizeof g->what, "%s", what);
    mg_status st = parse(g);
    if (st) {
        mg_gguf_close(g);
        return st;
    }
    *out = g;
    return MG_OK;
}

mg_status mg_gguf_open_memory(const void *data, size_t size, const char *what, mg_gguf **out) {
    if (!out || (!data && size))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "mg_gguf_open_memory: NULL %s",
                               out ? "data" : "out");
    *out = NULL;
    return open_over(data ? data : "", size, NULL, what ? what : "(memory)", out);
}

mg_status mg_gguf_open(const char *path, mg_gguf **out) {
    if (!path || !out)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "mg_gguf_open: NULL %s",
                               path ? "out" : "path");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mg_error_report(errno == ENOENT ? MG_ERR_NOT_FOUND : MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: empty file", path);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "GGUF %s: mmap failed: %s", path,
                               strerror(errno));
    return open_over(map, (size_t)sb.st_size, map, path, out);
}

void mg_gguf_close(mg_gguf *g) {
    if (!g)
        return;
    for (size_t i = 0; i < g->kv_count; i++) {
        free(g->kvs[i].strings);
        free(g->kvs[i].string_lens);
    }
    for (size_t i = 0; i < g->tensor_count; i++)
        free((char *)g->tensors[i].name);
    free(g->kvs);
    free(g->tensors);
    if (g->map)
        munmap(g->map, g->size);
    free(g);
}

uint32_t mg_gguf_version(const mg_gguf *g) {
    return g->version;
}

uint64_t mg_gguf_file_bytes(const mg_gguf *g) {
    return g->size;
}

size_t mg_gguf_kv_count(const mg_gguf *g) {
    return g->kv_count;
}

const mg_gguf_kv *mg_gguf_kv_at(const mg_gguf *g, size_t i) {
    return i < g->kv_count ? &g->kvs[i] : NULL;
}

const mg_gguf_kv *mg_gguf_find(const mg_gguf *g, const char *key) {
    size_t n = strlen(key);
    for (size_t i = 0; i < g->kv_count; i++)
        if (g->kvs[i].key_len == n && !memcmp(g->kvs[i].key, key, n))
            return &g->kvs[i];
    return NULL;
}

bool mg_gguf_get_u64(const mg_gguf *g, const char *key, uint64_t *out) {
    const mg_gguf_kv *kv = mg_gguf_find(g, key);
    if (!kv)
        return false;
    const uint8_t *p = kv->value;
    int64_t s;
    switch (kv->type) {
    case MG_GGUF_U8:
        *out = p[0];
        return true;
    case MG_GGUF_U16:
        *out = (uint64_t)p[0] | (uint64_t)p[1] << 8;
        return true;
    case MG_GGUF_U32:
        *out = load_u64((const uint8_t[8]){p[0], p[1], p[2], p[3]});
        return true;
    case MG_GGUF_U64:
        *out = load_u64(p);
        return true;
    case MG_GGUF_I8:
        s = (int8_t)p[0];
        break;
    case MG_GGUF_I16:
        s = (int16_t)(uint16_t)(p[0] | p[1] << 8);
        break;
    case MG_GGUF_I32:
        s = (int32_t)(uint32_t)load_u64((const uint8_t[8]){p[0], p[1], p[2], p[3]});
        break;
    case MG_GGUF_I64:
        s = (int64_t)load_u64(p);
        break;
    default:
        return false;
    }
    if (s < 0)
        return false;
    *out = (uint64_t)s;
    return true;
}

bool mg_gguf_get_f64(const mg_gguf *g, const char *key, double *out) {
    const mg_gguf_kv *kv = mg_gguf_find(g, key);
    if (!kv)
        return false;
    if (kv->type == MG_GGUF_F32V) {
        uint32_t bits = (uint32_t)load_u64(
            (const uint8_t[8]){kv->value[0], kv->value[1], kv->value[2], kv->value[3]});
        float f;
        memcpy(&f, &bits, 4);
        *out = f;
        return true;
    }
    if (kv->type == MG_GGUF_F64) {
        uint64_t bits = load_u64(kv->value);
        memcpy(out, &bits, 8);
        return true;
    }
    return false;
}

bool mg_gguf_get_bool(const mg_gguf *g, const char *key, bool *out) {
    const mg_gguf_kv *kv = mg_gguf_find(g, key);
    if (!kv || kv->type != MG_GGUF_BOOL)
        return false;
    *out = kv->value[0] != 0;
    return true;
}

bool mg_gguf_get_string(const mg_gguf *g, const char *key, char *buf, size_t size) {
    const mg_gguf_kv *kv = mg_gguf_find(g, key);
    if (!kv || kv->type != MG_GGUF_STRING || kv->str_len + 1 > size)
        return false;
    memcpy(buf, kv->str, kv->str_len);
    buf[kv->str_len] = '\0';
    return true;
}

size_t mg_gguf_tensor_count(const mg_gguf *g) {
    return g->tensor_count;
}

const mg_gguf_tensor *mg_gguf_tensor_at(const mg_gguf *g, size_t i) {
    return i < g->tensor_count ? &g->tensors[i] : NULL;
}

const mg_gguf_tensor *mg_gguf_tensor_find(const mg_gguf *g, const char *name) {
    for (size_t i = 0; i < g->tensor_count; i++)
        if (!strcmp(g->tensors[i].name, name))
            return &g->tensors[i];
    return NULL;
}
