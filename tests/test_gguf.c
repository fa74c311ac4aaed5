/*
 * test_gguf.c - the GGUF reader (src/model/gguf.h) and GGUF checkpoints in the forward model
 * (model_gguf.h), on the committed tiny checkpoints of tests/fuzz/corpus_gguf/ (written by the
 * `gguf` package's own writer, tests/fuzz/make_gguf_corpus.py) and on files built here:
 *  - every corpus file opens, its metadata and tensors read back, its tensors lie in the file;
 *  - each is run by the model on the CPU backend (prefill and decode steps) and leaves the
 *    ledger as it found it;
 *  - every prefix at each 1/16 of a file and at every byte of its header is refused with a
 *    status and a message naming the file, never read past (this runs under ASan/UBSan in the
 *    sanitizer build);
 *  - hand-made corruptions (magic, version, absurd counts and lengths, too many dimensions, an
 *    empty dimension, an unknown type, a misaligned or out-of-file offset, a duplicate name)
 *    each get their own message;
 *  - a checkpoint whose tensor shapes disagree with its metadata, an unsupported architecture,
 *    a qwen2 or qwen3 file without its biases or head norms and an unused tensor are refused
 *    by mg_fwd_create with a message naming them;
 *  - a thousand decode steps allocate nothing after the first (the ledger is unchanged);
 *  - a run longer than the checkpoint's context is refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "model.h"
#include "test_files.h"
#include "test_util.h"

/* The model layer's messages (mg_last_error) rather than the library's. */
#define CHECK_FWD_MESSAGE(needle)                                                                  \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!strstr(mg_last_error(), (needle))) {                                                  \
            test_failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: message \"%s\" does not mention \"%s\"\n", __FILE__,      \
                    __LINE__, mg_last_error(), (needle));                                          \
        }                                                                                          \
    } while (0)

static const char *corpus_dir(void) {
    const char *d = getenv("METRALE_GGUF_CORPUS");
    return d && *d ? d : METRALE_GGUF_CORPUS;
}

static bool write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(p, 1, n, f) == n;
    if (f)
        fclose(f);
    return ok;
}

/* ------------------------------------------------------------------ a small GGUF writer */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) {
    put(b, &v, 4); /* the test machines are little-endian, as the format */
}
static void put_u64(buf *b, uint64_t v) {
    put(b, &v, 8);
}
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_str(buf *b, const char *k, const char *v) {
    put_str(b, k);
    put_u32(b, MG_GGUF_STRING);
    put_str(b, v);
}
static void kv_u32(buf *b, const char *k, uint32_t v) {
    put_str(b, k);
    put_u32(b, MG_GGUF_U32);
    put_u32(b, v);
}

/* A file of one F32 tensor "t" [4, rows] with `kvs` metadata pairs written by the caller. */
typedef struct spec {
    uint32_t version;
    uint64_t tensor_count, kv_count; /* as written in the header */
    uint32_t n_dims;
    uint64_t dim0, dim1;
    uint32_t type;
    uint64_t offset;
    bool duplicate;     /* a second tensor of the same name */
    uint32_t alignment; /* written as general.alignment (counted in kv_count) when non-zero */
} spec;

static buf build(const spec *s) {
    buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, s->version);
    put_u64(&b, s->tensor_count);
    put_u64(&b, s->kv_count);
    kv_str(&b, "general.architecture", "llama");
    if (s->alignment)
        kv_u32(&b, "general.alignment", s->alignment);
    for (int t = 0; t < (s->duplicate ? 2 : 1); t++) {
        put_str(&b, "t");
        put_u32(&b, s->n_dims);
        put_u64(&b, s->dim0);
        if (s->n_dims > 1)
            put_u64(&b, s->dim1);
        for (uint32_t d = 2; d < s->n_dims && d < 8; d++)
            put_u64(&b, 1);
        put_u32(&b, s->type);
        put_u64(&b, s->offset);
    }
    while (b.n % 32)
        put(&b, "", 1);
    float data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (float)i;
    put(&b, data, sizeof data);
    return b;
}

static spec good_spec(void) {
    return (spec){.version = 3,
                  .tensor_count = 1,
                  .kv_count = 1,
                  .n_dims = 2,
                  .dim0 = 4,
                  .dim1 = 4,
                  .type = MG_GGUF_F32,
                  .offset = 0};
}

static void expect_refusal(const spec *s, const char *needle) {
    buf b = build(s);
    mg_gguf *g = (mg_gguf *)1;
    mg_status st = mg_gguf_open_memory(b.p, b.n, "made", &g);
    CHECK(st != MG_OK);
    CHECK(g == NULL);
    CHECK_FWD_MESSAGE("GGUF made");
    CHECK_FWD_MESSAGE(needle);
    free(b.p);
}

static void test_made_files(void) {
    spec s = good_spec();
    buf b = build(&s);
    mg_gguf *g = NULL;
    CHECK_OK(mg_gguf_open_memory(b.p, b.n, "made", &g));
    if (g) {
        char arch[16];
        CHECK(mg_gguf_version(g) == 3);
        CHECK(mg_gguf_get_string(g, "general.architecture", arch, sizeof arch) &&
              !strcmp(arch, "llama"));
        const mg_gguf_tensor *t = mg_gguf_tensor_find(g, "t");
        CHECK(t && t->elements == 16 && t->bytes == 64 && t->type == MG_GGUF_F32);
        if (t) {
            float v[16];
            memcpy(v, t->data, sizeof v);
            CHECK(v[0] == 0.0f && v[15] == 15.0f);
        }
        CHECK(mg_gguf_tensor_find(g, "missing") == NULL);
        mg_gguf_close(g);
    }
    free(b.p);

    s = good_spec(), s.version = 1;
    expect_refusal(&s, "version 1");
    s = good_spec(), s.tensor_count = 1ull << 40;
    expect_refusal(&s, "absurd counts");
    s = good_spec(), s.kv_count = 5; /* more pairs than written: the header runs out */
    expect_refusal(&s, "truncated");
    s = good_spec(), s.n_dims = 5;
    expect_refusal(&s, "5 dimensions");
    s = good_spec(), s.dim1 = 0;
    expect_refusal(&s, "empty or absurd dimension");
    s = good_spec(), s.type = 99;
    expect_refusal(&s, "unknown type 99");
    s = good_spec(), s.offset = 4;
    expect_refusal(&s, "not a multiple of the alignment");
    s = good_spec(), s.offset = 1 << 20;
    expect_refusal(&s, "past the end");
    s = good_spec(), s.dim0 = 64, s.dim1 = 64; /* 16 KB of data in a 256-byte section */
    expect_refusal(&s, "past the end");
    s = good_spec(), s.type = MG_GGUF_Q4_1, s.dim0 = 16; /* rows of 16: not whole blocks */
    expect_refusal(&s, "whole Q4_1 blocks");
    s = good_spec(), s.alignment = 24, s.kv_count = 2;
    expect_refusal(&s, "power of two");
    s = good_spec(), s.duplicate = true, s.tensor_count = 2;
    expect_refusal(&s, "appears twice");

    /* a string whose length runs past the end */
    buf bad = {0};
    put(&bad, "GGUF", 4);
    put_u32(&bad, 3);
    put_u64(&bad, 0);
    put_u64(&bad, 1);
    put_u64(&bad, 1ull << 62);
    put(&bad, "key", 3);
    g = NULL;
    CHECK(mg_gguf_open_memory(bad.p, bad.n, "made", &g) != MG_OK && !g);
    CHECK_FWD_MESSAGE("truncated");
    free(bad.p);
    bad = (buf){0};
    put(&bad, "GGUX", 4);
    CHECK(mg_gguf_open_memory(bad.p, bad.n, "made", &g) != MG_OK);
    CHECK_FWD_MESSAGE("bad magic");
    free(bad.p);
    CHECK(mg_gguf_open("/nonexistent/x.gguf", &g) == MG_ERR_NOT_FOUND);
    CHECK_FWD_MESSAGE("/nonexistent/x.gguf");
}

/* ------------------------------------------------------------------ the corpus */

static void run_model(mg_backend *b, const char *path, bool expect_ok, const char *needle) {
    uint64_t live0 = 0, count0 = 0, live1 = 0, count1 = 0;
    CHECK_OK(mg_ledger_live(b, &live0, &count0));
    const int32_t prompt[] = {3, 50, 7, 99, 12};
    mg_fwd_config c = {.batch = 1,
                       .steps = 3,
                       .seed = 1,
                       .model_path = path,
                       .prompt_ids = prompt,
                       .prompt_ids_count = 5};
    mg_fwd *m = NULL;
    mg_status st = mg_fwd_create(b, &c, &m);
    if (!expect_ok) {
        CHECK(st != MG_OK && m == NULL);
        if (needle)
            CHECK_FWD_MESSAGE(needle);
    } else {
        CHECK_OK(st);
        if (st)
            fprintf(stderr, "  %s: %s\n", path, mg_last_error());
    }
    if (m) {
        mg_stream *s = mg_stream_default(b);
        CHECK_OK(mg_fwd_prefill(m, s));
        for (int i = 0; i < 3; i++)
            CHECK_OK(mg_fwd_decode(m, s));
        uint32_t n = 0;
        const int32_t *ids = mg_fwd_tokens(m, 0, &n);
        CHECK(n == 4);
        mg_fwd_weights w;
        const mg_fwd_preset *p = mg_fwd_get_preset(m, &w);
        /* the corpus's hidden size: 32, or 256 for the K-quants' 256-long blocks */
        CHECK(w == MG_FWD_WEIGHTS_CHECKPOINT && p->layers == 1 &&
              (p->shape.hidden == 32 || p->shape.hidden == 256) && p->shape.heads == 2 &&
              p->shape.kv_heads == 1 && p->shape.head_dim == p->shape.hidden);
        for (uint32_t i = 0; i < n; i++)
            CHECK(ids[i] >= 0 && (uint32_t)ids[i] < p->shape.vocab);
        mg_fwd_destroy(m);
    }
    CHECK_OK(mg_ledger_live(b, &live1, &count1));
    CHECK(live1 == live0 && count1 == count0);
}

static void test_corpus(mg_backend *b) {
    static const char *const files[] = {"tiny_q4_1.gguf", "tiny_mixed_blocks.gguf", "tiny_f16.gguf",
                                        "tiny_kquants.gguf"};
    char path[1024], tmp[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        snprintf(path, sizeof path, "%s/%s", corpus_dir(), files[f]);
        size_t size = 0;
        unsigned char *data = (unsigned char *)test_read_file(path, &size);
        CHECK(data != NULL);
        if (!data) {
            fprintf(stderr, "  cannot read %s (METRALE_GGUF_CORPUS names the folder)\n", path);
            continue;
        }
        mg_gguf *g = NULL;
        CHECK_OK(mg_gguf_open(path, &g));
        size_t header_end = size;
        if (g) {
            CHECK(mg_gguf_tensor_count(g) == 11);
            CHECK(mg_gguf_find(g, "tokenizer.ggml.tokens") != NULL);
            for (size_t i = 0; i < mg_gguf_tensor_count(g); i++)
                CHECK(mg_gguf_tensor_at(g, i)->bytes > 0);
            CHECK(mg_gguf_tensor_find(g, "token_embd.weight") != NULL);
            mg_gguf_close(g);
            mg_gguf *gm = NULL;
            CHECK_OK(mg_gguf_open_memory(data, size, "copy", &gm));
            if (gm) {
                const uint8_t *lowest = data + size;
                for (size_t i = 0; i < mg_gguf_tensor_count(gm); i++) {
                    const mg_gguf_tensor *t = mg_gguf_tensor_at(gm, i);
                    CHECK(t->data >= data && t->data + t->bytes <= data + size);
                    lowest = t->data < lowest ? t->data : lowest;
                }
                header_end = (size_t)(lowest - data);
                mg_gguf_close(gm);
            }
        }
        run_model(b, path, true, NULL);
        /* every prefix at 1/16 steps, and every byte of the header (where the first tensor's
         * data begins) */
        int refused = 0, cuts = 0;
        for (size_t cut = 0; cut < size; cut++) {
            bool sixteenth = false;
            for (int k = 0; k < 16; k++)
                sixteenth |= cut == size * (size_t)k / 16;
            if (cut >= header_end && !sixteenth)
                continue;
            unsigned char *prefix = malloc(cut ? cut : 1);
            memcpy(prefix, data, cut);
            mg_gguf *gp = NULL;
            cuts++;
            if (mg_gguf_open_memory(prefix, cut, "cut", &gp) != MG_OK) {
                refused++;
                CHECK(gp == NULL);
                CHECK(strstr(mg_last_error(), "GGUF cut") != NULL);
            } else {
                mg_gguf_close(gp);
            }
            if (sixteenth && write_file(tmp, prefix, cut))
                run_model(b, tmp, false, "GGUF");
            free(prefix);
        }
        CHECK(refused == cuts);
        free(data);
    }
    unlink(tmp);
}

/* A thousand decode steps allocate nothing: the ledger holds after the last step what it held
 * after the first (arena, KV pool and weights are made at creation; the first decode step
 * still creates the decode attention plan, whose state the paged attention op allocates
 * itself: 32 bytes on the CPU backend, not yet taken from the arena). */
static void test_steps_allocate_nothing(mg_backend *b) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny_q4_1.gguf", corpus_dir());
    const int32_t prompt[] = {5, 6, 7};
    mg_fwd_config c = {.batch = 1,
                       .steps = 1000,
                       .seed = 1,
                       .model_path = path,
                       .prompt_ids = prompt,
                       .prompt_ids_count = 3};
    mg_fwd *m = NULL;
    CHECK_OK(mg_fwd_create(b, &c, &m));
    if (!m)
        return;
    uint64_t bytes0 = 0, count0 = 0, bytes1 = 0, count1 = 0;
    mg_stream *s = mg_stream_default(b);
    CHECK_OK(mg_fwd_prefill(m, s));
    CHECK_OK(mg_fwd_decode(m, s));
    CHECK_OK(mg_ledger_live(b, &bytes0, &count0));
    mg_status st = MG_OK;
    for (int i = 1; i < 1000 && !st; i++)
        st = mg_fwd_decode(m, s);
    CHECK_OK(st);
    CHECK_OK(mg_ledger_live(b, &bytes1, &count1));
    CHECK(bytes1 == bytes0 && count1 == count0);
    uint32_t n = 0;
    mg_fwd_tokens(m, 0, &n);
    CHECK(n == 1001);
    mg_fwd_destroy(m);
}

/* The committed tiny_q4_1.gguf read into memory, and an empty temporary file made at `tmp` (a
 * mkstemp template) for the caller's variants of it; NULL, with neither left, on failure. */
static unsigned char *read_tiny_q4_1(size_t *size, char *tmp) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny_q4_1.gguf", corpus_dir());
    unsigned char *data = (unsigned char *)test_read_file(path, size);
    CHECK(data != NULL);
    int fd = data ? mkstemp(tmp) : -1;
    CHECK(!data || fd >= 0);
    if (fd < 0) {
        free(data);
        return NULL;
    }
    close(fd);
    return data;
}

/* A corpus file with one byte changed where the metadata says the layer count: shapes then
 * disagree or tensors are unused. */
static void test_disagreeing(mg_backend *b) {
    char tmp[] = "/tmp/test_gguf_XXXXXX";
    size_t size = 0;
    unsigned char *data = read_tiny_q4_1(&size, tmp);
    if (!data)
        return;
    /* embedding_length 32 -> 48: every shape disagrees */
    static const char key[] = "llama.embedding_length";
    unsigned char *k = memmem(data, size, key, sizeof key - 1);
    CHECK(k != NULL);
    if (k) {
        uint32_t *v = (uint32_t *)(void *)(k + sizeof key - 1 + 4);
        const uint32_t saved = *v;
        *v = 48;
        CHECK(write_file(tmp, data, size));
        run_model(b, tmp, false, "rows of");
        *v = saved;
    }
    /* the architecture renamed: unsupported */
    static const char arch[] = "llama";
    unsigned char *a = memmem(data, size, "general.architecture", 20);
    CHECK(a != NULL);
    if (a) {
        unsigned char *val = memmem(a, size - (size_t)(a - data), arch, 5);
        if (val) {
            memcpy(val, "gemma", 5);
            CHECK(write_file(tmp, data, size));
            run_model(b, tmp, false, "architecture gemma is not supported");
            memcpy(val, arch, 5);
        }
    }
    /* the same file as qwen2 and qwen3 (every "llama" of its metadata renamed: the names have
     * one length): the architectures' own tensors are missing, and named */
    static const char *const qwen[][2] = {{"qwen2", "blk.0.attn_q.bias is missing"},
                                          {"qwen3", "blk.0.attn_q_norm.weight is missing"}};
    for (int q = 0; q < 2; q++) {
        unsigned char *copy = malloc(size);
        CHECK(copy != NULL);
        if (!copy)
            break;
        memcpy(copy, data, size);
        for (unsigned char *p = copy; (p = memmem(p, size - (size_t)(p - copy), arch, 5));)
            memcpy(p, qwen[q][0], 5);
        CHECK(write_file(tmp, copy, size));
        run_model(b, tmp, false, qwen[q][1]);
        free(copy);
    }
    /* a tensor renamed to one the network does not have */
    unsigned char *t = memmem(data, size, "blk.0.ffn_up.weight", 19);
    CHECK(t != NULL);
    if (t) {
        memcpy(t, "blk.0.ffn_xx.weight", 19);
        CHECK(write_file(tmp, data, size));
        run_model(b, tmp, false, "blk.0.ffn_up.weight is missing");
    }
    free(data);
    unlink(tmp);
}

/* `data` (a GGUF file of `size` bytes, default alignment) with one more tensor appended:
 * "rope_freqs.weight" of `count` elements of `type` (F32 or F16) from `values`. The new info
 * goes after the last one (found by its name in the header), the new data after the last
 * tensor's; every other byte keeps its place relative to its section. Returns the new size. */
static size_t append_rope_freqs(const unsigned char *data, size_t size, uint32_t type,
                                const float *values, uint32_t count, unsigned char **out) {
    *out = NULL;
    mg_gguf *g = NULL;
    if (mg_gguf_open_memory(data, size, "copy", &g) != MG_OK)
        return 0;
    const size_t n = mg_gguf_tensor_count(g);
    const mg_gguf_tensor *last = mg_gguf_tensor_at(g, n - 1);
    const uint8_t *data_start = data + size;
    for (size_t i = 0; i < n; i++)
        if (mg_gguf_tensor_at(g, i)->data < data_start)
            data_start = mg_gguf_tensor_at(g, i)->data;
    /* the last info: u64 name length, the name, u32 n_dims, n_dims u64, u32 type, u64 offset */
    const size_t name_len = strlen(last->name);
    const unsigned char *info = NULL;
    for (const unsigned char *p = data; p + 8 + name_len <= data_start; p++) {
        uint64_t len;
        memcpy(&len, p, 8);
        if (len == name_len && !memcmp(p + 8, last->name, name_len))
            info = p;
    }
    const size_t header = 4 + 4 + 8 + 8;
    if (!info) {
        mg_gguf_close(g);
        return 0;
    }
    uint32_t n_dims;
    memcpy(&n_dims, info + 8 + name_len, 4);
    const size_t infos_end = (size_t)(info - data) + 8 + name_len + 4 + 8 * n_dims + 4 + 8;
    const size_t data_bytes = size - (size_t)(data_start - data);
    mg_gguf_close(g);

    buf b = {0};
    put(&b, data, header);
    uint64_t tensor_count = n + 1;
    memcpy(b.p + 8, &tensor_count, 8);
    put(&b, data + header, infos_end - header);
    put_str(&b, "rope_freqs.weight");
    put_u32(&b, 1);
    put_u64(&b, count);
    put_u32(&b, type);
    put_u64(&b, (data_bytes + 31) / 32 * 32);
    while (b.n % 32)
        put(&b, "", 1);
    put(&b, data_start, data_bytes);
    while (b.n % 32)
        put(&b, "", 1);
    for (uint32_t i = 0; i < count; i++) {
        if (type == MG_GGUF_F32) {
            put(&b, &values[i], 4);
        } else {
            const uint16_t h = 0x3C00; /* 1.0 in FP16: the type alone is refused */
            put(&b, &h, 2);
        }
    }
    *out = b.p;
    return b.n;
}

/* The prompt's prefill and six decode steps of `m` (made with .steps = 6): its 7 tokens. */
static void generate_seven(mg_backend *b, mg_fwd *m, int32_t tokens[7]) {
    uint32_t n = 0;
    CHECK_OK(mg_fwd_prefill(m, mg_stream_default(b)));
    for (int i = 0; i < 6; i++)
        CHECK_OK(mg_fwd_decode(m, mg_stream_default(b)));
    const int32_t *ids = mg_fwd_tokens(m, 0, &n);
    CHECK(n == 7);
    memset(tokens, 0xff, 7 * sizeof *tokens);
    if (n == 7)
        memcpy(tokens, ids, 7 * sizeof *tokens);
}

/* Llama 3.1's rope_freqs.weight: factors of 1 leave the network as it was (the same tokens);
 * a wrong type or length is refused as unsupported, a factor that is not finite and positive
 * as invalid, with the index and value named. */
static void test_rope_freqs(mg_backend *b) {
    char tmp[] = "/tmp/test_gguf_XXXXXX";
    size_t size = 0;
    unsigned char *data = read_tiny_q4_1(&size, tmp);
    if (!data)
        return;
    const int32_t prompt[] = {3, 50, 7, 99, 12};
    mg_fwd_config c = {
        .batch = 1, .steps = 6, .seed = 1, .prompt_ids = prompt, .prompt_ids_count = 5};
    c.model_path = tmp;
    int32_t plain[7] = {0}, tokens[7];
    uint32_t head_dim = 0;
    mg_fwd *m = NULL;
    CHECK(write_file(tmp, data, size));
    CHECK_OK(mg_fwd_create(b, &c, &m));
    if (m) {
        mg_fwd_weights w;
        head_dim = mg_fwd_get_preset(m, &w)->shape.head_dim;
        generate_seven(b, m, plain);
        mg_fwd_destroy(m);
    }
    const uint32_t half = head_dim / 2;
    float factors[256];
    CHECK(half > 0 && half < 255);
    if (half == 0 || half >= 255) {
        free(data);
        unlink(tmp);
        return;
    }
    struct {
        uint32_t type, count;
        int bad_index;
        float bad_value;
        mg_status want;
        const char *needle;
    } cases[] = {
        {MG_GGUF_F32, half, -1, 0, MG_OK, NULL},
        {MG_GGUF_F32, half, 3, NAN, MG_ERR_INVALID_ARGUMENT, "rope_freqs.weight[3] = nan"},
        {MG_GGUF_F32, half, 0, 0.0f, MG_ERR_INVALID_ARGUMENT, "rope_freqs.weight[0] = 0"},
        {MG_GGUF_F32, half, (int)half - 1, -2.0f, MG_ERR_INVALID_ARGUMENT, "= -2 (must be finite"},
        {MG_GGUF_F32, half, 1, INFINITY, MG_ERR_INVALID_ARGUMENT, "rope_freqs.weight[1] = inf"},
        {MG_GGUF_F32, half + 1, -1, 0, MG_ERR_UNSUPPORTED, "must be F32 ["},
        {MG_GGUF_F16, half, -1, 0, MG_ERR_UNSUPPORTED, "of a llama architecture"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (uint32_t i = 0; i <= half; i++)
            factors[i] = 1.0f;
        if (cases[k].bad_index >= 0)
            factors[cases[k].bad_index] = cases[k].bad_value;
        unsigned char *file = NULL;
        size_t file_size =
            append_rope_freqs(data, size, cases[k].type, factors, cases[k].count, &file);
        CHECK(file != NULL && write_file(tmp, file, file_size));
        free(file);
        uint64_t live0 = 0, count0 = 0, live1 = 0, count1 = 0;
        CHECK_OK(mg_ledger_live(b, &live0, &count0));
        m = NULL;
        CHECK_STATUS(mg_fwd_create(b, &c, &m), cases[k].want);
        if (cases[k].needle) {
            CHECK(m == NULL);
            CHECK_FWD_MESSAGE(cases[k].needle);
        }
        if (m) {
            generate_seven(b, m, tokens);
            CHECK(!memcmp(tokens, plain, sizeof plain));
            mg_fwd_destroy(m);
        }
        CHECK_OK(mg_ledger_live(b, &live1, &count1));
        CHECK(live1 == live0 && count1 == count0);
    }
    free(data);
    unlink(tmp);
}

/* The tiny checkpoints were trained for 2048 tokens: a longer run is refused, never truncated. */
static void test_context_limit(mg_backend *b) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny_q4_1.gguf", corpus_dir());
    static int32_t prompt[2000];
    for (int i = 0; i < 2000; i++)
        prompt[i] = 3 + i % 90;
    mg_fwd_config c = {.batch = 1,
                       .steps = 48,
                       .seed = 1,
                       .model_path = path,
                       .prompt_ids = prompt,
                       .prompt_ids_count = 2000};
    mg_fwd *m = NULL;
    CHECK_OK(mg_fwd_create(b, &c, &m)); /* 2048 tokens: fits */
    mg_fwd_destroy(m);
    m = NULL;
    c.steps = 49;
    CHECK_STATUS(mg_fwd_create(b, &c, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK(m == NULL);
    CHECK_FWD_MESSAGE("past the context");
    CHECK_FWD_MESSAGE("(2048 tokens)");
}

int main(void) {
    test_seed();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    test_made_files();
    if (b) {
        test_corpus(b);
        test_disagreeing(b);
        test_rope_freqs(b);
        test_steps_allocate_nothing(b);
        test_context_limit(b);
        mg_backend_close(b);
    }
    return test_finish();
}
