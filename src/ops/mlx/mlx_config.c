/* mlx_config.c - config.json's quantization (metrale/mlx.h): defaults and per-module overrides. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"
#include "metrale/mlx.h"
#include "mlx_json.h"

typedef struct override {
    char *module;
    mg_mlx_quant quant;
} override;

struct mg_mlx_config {
    mg_mlx_quant base;
    override *overrides;
    size_t count;
};

void mg_mlx_config_close(mg_mlx_config *c) {
    if (!c)
        return;
    for (size_t i = 0; i < c->count; i++)
        free(c->overrides[i].module);
    free(c->overrides);
    free(c);
}

/* group_size and bits of the object at `obj` into q (quantized). */
static mg_status read_quant(const mg_json_doc *doc, int obj, const char *what, const char *where,
                            mg_mlx_quant *q) {
    uint64_t g, bits;
    if (!mg_json_u64(doc, mg_json_member(doc, obj, "group_size"), &g) ||
        !mg_json_u64(doc, mg_json_member(doc, obj, "bits"), &bits) || g > UINT32_MAX ||
        bits > UINT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s lacks integer group_size and bits", what,
                        where);
    *q = (mg_mlx_quant){true, (uint32_t)bits, (uint32_t)g};
    return MG_OK;
}

static mg_status parse_quantization(mg_mlx_config *c, const mg_json_doc *doc, int obj,
                                    const char *what) {
    if (doc->tokens[obj].type != MG_JSON_OBJECT)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: quantization is not an object", what);
    mg_status st = read_quant(doc, obj, what, "quantization", &c->base);
    if (st)
        return st;
    int mode = mg_json_member(doc, obj, "mode");
    if (mode >= 0 && !mg_json_equals(doc, mode, "affine"))
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "%s: quantization mode %.*s is not supported (only \"affine\")", what,
                        doc->tokens[mode].end - doc->tokens[mode].start,
                        doc->text + doc->tokens[mode].start);
    c->overrides = calloc((size_t)doc->tokens[obj].size, sizeof *c->overrides);
    if (!c->overrides && doc->tokens[obj].size)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory", what);
    int i = obj + 1;
    for (int k = 0; k < doc->tokens[obj].size; k++, i = mg_json_skip(doc, i + 1)) {
        if (i + 1 >= doc->count)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: quantization member %d has no value",
                            what, k);
        if (mg_json_equals(doc, i, "group_size") || mg_json_equals(doc, i, "bits") ||
            mg_json_equals(doc, i, "mode"))
            continue;
        if (!mg_json_plain_string(doc, i))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: quantization key %d has a JSON escape sequence", what, k);
        override *o = &c->overrides[c->count];
        int v = i + 1;
        bool flag;
        char where[160];
        snprintf(where, sizeof where, "the override of %.*s",
                 doc->tokens[i].end - doc->tokens[i].start, doc->text + doc->tokens[i].start);
        if (doc->tokens[v].type == MG_JSON_OBJECT) {
            if ((st = read_quant(doc, v, what, where, &o->quant)))
                return st;
        } else if (mg_json_bool(doc, v, &flag) && !flag) {
            o->quant = (mg_mlx_quant){false, 0, 0};
        } else {
            /* Other keys MLX writes there are not module paths: skip them. */
            continue;
        }
        size_t n = (size_t)(doc->tokens[i].end - doc->tokens[i].start);
        if (!(o->module = malloc(n + 1)))
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory", what);
        mg_json_copy(doc, i, o->module, n + 1);
        c->count++;
    }
    return MG_OK;
}

mg_status mg_mlx_config_parse(const char *text, size_t length, const char *what,
                              mg_mlx_config **out) {
    if (!out || !text)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_mlx_config_parse: NULL %s",
                        out ? "text" : "out");
    *out = NULL;
    what = what ? what : "config";
    mg_json_doc doc;
    mg_status st = mg_json_parse(text, length, what, &doc);
    if (st)
        return st;
    mg_mlx_config *c = calloc(1, sizeof *c);
    if (!c) {
        mg_json_free(&doc);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory", what);
    }
    int q = mg_json_member(&doc, 0, "quantization");
    if (q < 0)
        q = mg_json_member(&doc, 0, "quantization_config");
    if (q >= 0)
        st = parse_quantization(c, &doc, q, what);
    mg_json_free(&doc);
    if (st) {
        mg_mlx_config_close(c);
        return st;
    }
    *out = c;
    return MG_OK;
}

mg_status mg_mlx_config_open(const char *path, mg_mlx_config **out) {
    if (!path || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_mlx_config_open: NULL %s",
                        path ? "out" : "path");
    *out = NULL;
    char file[PATH_MAX];
    struct stat sb;
    if (!stat(path, &sb) && S_ISDIR(sb.st_mode))
        snprintf(file, sizeof file, "%s/config.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    FILE *f = fopen(file, "rb");
    if (!f)
        return MG_ERROR(errno == ENOENT ? MG_ERR_NOT_FOUND : MG_ERR_INVALID_ARGUMENT,
                        "mg_mlx_config_open: %s: %s", file, strerror(errno));
    char *text = NULL;
    long n = -1;
    mg_status st = MG_OK;
    if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) ||
        !(text = malloc((size_t)n + 1)) || fread(text, 1, (size_t)n, f) != (size_t)n)
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_mlx_config_open: cannot read %s", file);
    fclose(f);
    if (!st)
        st = mg_mlx_config_parse(text, (size_t)n, file, out);
    free(text);
    return st;
}

mg_status mg_mlx_config_module(const mg_mlx_config *c, const char *module, mg_mlx_quant *out) {
    if (!c || !module || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_mlx_config_module: NULL %s",
                        !c        ? "config"
                        : !module ? "module"
                                  : "out");
    *out = c->base;
    for (size_t i = 0; i < c->count; i++)
        if (!strcmp(c->overrides[i].module, module))
            *out = c->overrides[i].quant;
    return MG_OK;
}
