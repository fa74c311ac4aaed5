/* test_mlx_loader.c - the safetensors reader and the MLX config and layer loader on files this
 * test writes: good files (one file and shards) load with the right shapes and bytes; each kind
 * of bad file is refused with its status and a message naming the problem. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metrale/mlx.h"
#include "metrale/safetensors.h"
#include "test_util.h"

static char dir[256];

/* A safetensors image: the 8-byte length, `header`, then `data_bytes` bytes of pattern. */
static size_t image(const char *header, size_t data_bytes, unsigned char *out) {
    size_t n = strlen(header);
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(out + 8, header, n);
    for (size_t i = 0; i < data_bytes; i++)
        out[8 + n + i] = (unsigned char)(i * 7 + 3);
    return 8 + n + data_bytes;
}

static void write_file(const char *name, const void *bytes, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(bytes, 1, size, f) == size);
    if (f)
        fclose(f);
}

static void write_text(const char *name, const char *text) {
    write_file(name, text, strlen(text));
}

/* Opens `header` + data from memory; expects `want` and, on failure, `needle` in the message. */
static void expect_memory(const char *header, size_t data_bytes, mg_status want,
                          const char *needle) {
    static unsigned char buf[1 << 16];
    size_t size = image(header, data_bytes, buf);
    mg_st_model *m = NULL;
    CHECK_STATUS(mg_st_open_memory(buf, size, "test", &m), want);
    if (want != MG_OK)
        CHECK_MESSAGE(needle);
    CHECK((m != NULL) == (want == MG_OK));
    mg_st_close(m);
}

static void test_headers(void) {
    expect_memory("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24, MG_OK,
                  "");
    expect_memory("{\"__metadata__\":null}", 0, MG_OK, "");
    /* Malformed, truncated and wrong top-level JSON. */
    expect_memory("{\"a\":{\"dtype\":\"F32\",", 0, MG_ERR_INVALID_ARGUMENT, "truncated JSON");
    expect_memory("{\"a\":{dtype:1}}", 0, MG_ERR_INVALID_ARGUMENT, "malformed JSON");
    expect_memory("[1,2]", 0, MG_ERR_INVALID_ARGUMENT, "not one object");
    expect_memory("{}  x", 0, MG_ERR_INVALID_ARGUMENT, "malformed JSON");
    expect_memory("{} {}", 0, MG_ERR_INVALID_ARGUMENT, "not one object");
    expect_memory("{}\n ", 0, MG_OK, "");
    /* Entries. */
    expect_memory("{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                  MG_ERR_INVALID_ARGUMENT, "unknown dtype");
    expect_memory("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, MG_ERR_INVALID_ARGUMENT,
                  "missing dtype");
    expect_memory("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1,
                  MG_ERR_INVALID_ARGUMENT, "shape[0]");
    expect_memory("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
                  1, MG_ERR_INVALID_ARGUMENT, "at most 8");
    expect_memory("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,"
                  "4]}}",
                  4, MG_ERR_INVALID_ARGUMENT, "overflows");
    expect_memory("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                  MG_ERR_INVALID_ARGUMENT, "need 12");
    expect_memory("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 4,
                  MG_ERR_INVALID_ARGUMENT, "truncated file");
    expect_memory("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[3,2]}}", 4,
                  MG_ERR_INVALID_ARGUMENT, "out of range");
    expect_memory("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
                  6, MG_ERR_INVALID_ARGUMENT, "overlapping");
    expect_memory("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                  2, MG_ERR_INVALID_ARGUMENT, "appears twice");
    expect_memory("{\"a\\\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                  MG_ERR_INVALID_ARGUMENT, "escape");
    expect_memory("{\"__metadata__\":[1]}", 0, MG_ERR_INVALID_ARGUMENT, "__metadata__");
    /* The length prefix. */
    unsigned char short_file[5] = {1, 0, 0, 0, 0};
    mg_st_model *m = NULL;
    CHECK_STATUS(mg_st_open_memory(short_file, 5, "short", &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("truncated file");
    unsigned char long_header[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    CHECK_STATUS(mg_st_open_memory(long_header, 16, "long", &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("header length 200");
}

static size_t dtype_bytes(const char *name) {
    return strstr(name, "16") ? 2 : 4;
}

/* The header of a quantized layer `prefix` with n rows and k columns packed at `bits`, weight
 * dtype `wdt`, scales and biases of dtype `sdt` with scale_cols columns (k / group_size when
 * consistent), and an F32 bias; returns the data bytes it needs. */
static size_t layer_header(char *hdr, size_t bytes, const char *prefix, unsigned n, unsigned k,
                           unsigned bits, const char *wdt, const char *sdt, unsigned scale_cols) {
    unsigned words = k * bits / 32;
    size_t wb = (size_t)n * words * dtype_bytes(wdt),
           sb = (size_t)n * scale_cols * dtype_bytes(sdt);
    snprintf(hdr, bytes,
             "{\"__metadata__\":{\"format\":\"mlx\"},"
             "\"%s.weight\":{\"dtype\":\"%s\",\"shape\":[%u,%u],\"data_offsets\":[0,%zu]},"
             "\"%s.scales\":{\"dtype\":\"%s\",\"shape\":[%u,%u],\"data_offsets\":[%zu,%zu]},"
             "\"%s.biases\":{\"dtype\":\"%s\",\"shape\":[%u,%u],\"data_offsets\":[%zu,%zu]},"
             "\"%s.bias\":{\"dtype\":\"F32\",\"shape\":[%u],\"data_offsets\":[%zu,%zu]}}",
             prefix, wdt, n, words, wb, prefix, sdt, n, scale_cols, wb, wb + sb, prefix, sdt, n,
             scale_cols, wb + sb, wb + 2 * sb, prefix, n, wb + 2 * sb, wb + 2 * sb + 4 * n);
    return wb + 2 * sb + 4 * (size_t)n;
}

static const char config_text[] =
    "{\"quantization\":{\"group_size\":64,\"bits\":4,\"mode\":\"affine\","
    "\"model.gate\":{\"group_size\":32,\"bits\":8},\"model.head\":false},"
    "\"quantization_config\":{\"group_size\":64,\"bits\":4}}";

static void test_config(void) {
    mg_mlx_config *c = NULL;
    mg_mlx_quant q;
    CHECK_OK(mg_mlx_config_parse(config_text, strlen(config_text), NULL, &c));
    CHECK_OK(mg_mlx_config_module(c, "model.layers.0.mlp.up_proj", &q));
    CHECK(q.quantized && q.bits == 4 && q.group_size == 64);
    CHECK_OK(mg_mlx_config_module(c, "model.gate", &q));
    CHECK(q.quantized && q.bits == 8 && q.group_size == 32);
    CHECK_OK(mg_mlx_config_module(c, "model.head", &q));
    CHECK(!q.quantized);
    mg_mlx_config_close(c);
    static const char only_hf[] = "{\"quantization_config\":{\"group_size\":128,\"bits\":8}}";
    CHECK_OK(mg_mlx_config_parse(only_hf, strlen(only_hf), NULL, &c));
    CHECK_OK(mg_mlx_config_module(c, "x", &q));
    CHECK(q.quantized && q.bits == 8 && q.group_size == 128);
    mg_mlx_config_close(c);
    static const char plain[] = "{\"model_type\":\"llama\"}";
    CHECK_OK(mg_mlx_config_parse(plain, strlen(plain), NULL, &c));
    CHECK_OK(mg_mlx_config_module(c, "x", &q));
    CHECK(!q.quantized);
    mg_mlx_config_close(c);
    static const char mxfp4[] =
        "{\"quantization\":{\"group_size\":32,\"bits\":4,\"mode\":\"mxfp4\"}}";
    CHECK_STATUS(mg_mlx_config_parse(mxfp4, strlen(mxfp4), NULL, &c), MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("mxfp4");
    static const char no_bits[] = "{\"quantization\":{\"group_size\":32}}";
    CHECK_STATUS(mg_mlx_config_parse(no_bits, strlen(no_bits), NULL, &c), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("group_size and bits");
}

static void test_layers(mg_backend *b) {
    static unsigned char buf[1 << 18];
    char hdr[2048];
    mg_mlx_config *c = NULL;
    CHECK_OK(mg_mlx_config_parse(config_text, strlen(config_text), NULL, &c));
    /* Good: model.up 4-bit group 64 BF16, n=24 k=192; its bytes reach the device unchanged. */
    size_t data = layer_header(hdr, sizeof hdr, "model.up", 24, 192, 4, "U32", "BF16", 3);
    size_t size = image(hdr, data, buf);
    mg_st_model *m = NULL;
    CHECK_OK(mg_st_open_memory(buf, size, "good", &m));
    mg_mlx_linear l;
    CHECK_OK(mg_mlx_linear_load(b, m, c, "model.up", &l));
    CHECK(l.experts == 1 && l.n == 24 && l.k == 192 && l.bits == 4 && l.group_size == 64 &&
          l.scale_type == MG_DTYPE_BF16 && l.bias && l.bias_type == MG_DTYPE_F32);
    mg_st_tensor t;
    CHECK_OK(mg_st_find(m, "model.up.scales", &t));
    unsigned char back[64];
    CHECK_OK(mg_copy_d2h(b, back, l.scales, t.bytes < 64 ? t.bytes : 64));
    CHECK(memcmp(back, t.data, t.bytes < 64 ? t.bytes : 64) == 0);
    CHECK(strcmp(mg_st_metadata(m, "format"), "mlx") == 0);
    mg_mlx_linear_free(b, &l);
    CHECK(l.weight == 0);
    CHECK_STATUS(mg_mlx_linear_load(b, m, c, "model.down", &l), MG_ERR_NOT_FOUND);
    CHECK_MESSAGE("model.down.weight");
    CHECK_STATUS(mg_mlx_linear_load(b, m, c, "model.head", &l), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("not quantized");
    mg_st_close(m);
    /* model.gate is 8-bit group 32 by its override: the 4-bit shapes disagree with it. */
    data = layer_header(hdr, sizeof hdr, "model.gate", 24, 192, 4, "U32", "BF16", 6);
    CHECK_OK(mg_st_open_memory(buf, image(hdr, data, buf), "override", &m));
    CHECK_STATUS(mg_mlx_linear_load(b, m, c, "model.gate", &l), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("groups of 32");
    mg_st_close(m);
    /* Wrong dtypes, and scales that do not match the weight. */
    struct {
        const char *wdt, *sdt;
        unsigned scale_cols;
        const char *needle;
    } bad[] = {{"F16", "BF16", 3, "not U32"},
               {"U32", "F32", 3, "not BF16 or F16"},
               {"U32", "BF16", 4, "give k=192"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        data = layer_header(hdr, sizeof hdr, "model.up", 24, 192, 4, bad[i].wdt, bad[i].sdt,
                            bad[i].scale_cols);
        CHECK_OK(mg_st_open_memory(buf, image(hdr, data, buf), "bad", &m));
        CHECK_STATUS(mg_mlx_linear_load(b, m, c, "model.up", &l), MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE(bad[i].needle);
        mg_st_close(m);
    }
    mg_mlx_config_close(c);
}

static void test_files(void) {
    static unsigned char buf[4096];
    /* One file, opened by path and by folder. */
    const char *h1 = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    const char *h2 = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}";
    write_file("model.safetensors", buf, image(h1, 4, buf));
    mg_st_model *m = NULL;
    CHECK_OK(mg_st_open(dir, &m));
    CHECK(mg_st_count(m) == 1);
    mg_st_close(m);
    /* Shards through the index (preferred over model.safetensors). */
    write_file("s1.safetensors", buf, image(h1, 4, buf));
    write_file("s2.safetensors", buf, image(h2, 8, buf));
    write_text(
        "model.safetensors.index.json",
        "{\"metadata\":{},\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    CHECK_OK(mg_st_open(dir, &m));
    mg_st_tensor t;
    CHECK(mg_st_count(m) == 2);
    CHECK_OK(mg_st_find(m, "b", &t));
    CHECK(t.shard == 1 && t.rank == 2 && t.shape[1] == 2 && t.bytes == 8 && t.dtype == MG_ST_BF16);
    CHECK(((const unsigned char *)t.data)[1] == 10);
    CHECK_STATUS(mg_st_find(m, "c", &t), MG_ERR_NOT_FOUND);
    mg_st_close(m);
    /* An index naming a tensor its shard lacks, or a shard that is missing. */
    write_text("model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\"}}");
    CHECK_STATUS(mg_st_open(dir, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("lacks it");
    write_text("model.safetensors.index.json", "{\"weight_map\":{\"a\":\"gone.safetensors\"}}");
    CHECK_STATUS(mg_st_open(dir, &m), MG_ERR_NOT_FOUND);
    CHECK_MESSAGE("gone.safetensors");
    write_text("model.safetensors.index.json", "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
    CHECK_STATUS(mg_st_open(dir, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("inside the directory");
    /* A truncated file on disk. */
    size_t size = image(h2, 8, buf);
    write_file("cut.safetensors", buf, size - 3);
    char path[512];
    snprintf(path, sizeof path, "%s/cut.safetensors", dir);
    CHECK_STATUS(mg_st_open(path, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("truncated file");
    snprintf(path, sizeof path, "%s/none", dir);
    CHECK_STATUS(mg_st_open(path, &m), MG_ERR_NOT_FOUND);
    /* config.json from a folder. */
    write_text("config.json", config_text);
    mg_mlx_config *c = NULL;
    CHECK_OK(mg_mlx_config_open(dir, &c));
    mg_mlx_config_close(c);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/metrale_mlx_loader_XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    test_headers();
    test_config();
    if (b)
        test_layers(b);
    test_files();
    mg_backend_close(b);
    const char *files[] = {"model.safetensors", "s1.safetensors",
                           "s2.safetensors",    "model.safetensors.index.json",
                           "cut.safetensors",   "config.json"};
    char path[512];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
    return test_finish();
}
