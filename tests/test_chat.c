/* test_chat.c - the chat templates (src/model/chat.h) against jinja2:
 * tests/tokenizer/make_chat_reference.py renders SmolLM2's template (read from its GGUF),
 * plain ChatML, Llama-3's and the two Mistral-instruct templates with jinja2 in the
 * environment transformers' apply_chat_template builds, over a set of conversations, with and
 * without a generation prompt. Here every template text must be recognised, and every
 * rendering must equal jinja2's byte for byte, or be refused where the template raises.
 *
 * Without the reference (the ctest fixture chat_reference, tests/tokenizer/setup.sh, in the
 * folder METRALE_CHAT_REFERENCE names) the checks that need none still run (templates changed
 * by one byte are refused, the buffer protocol, the special-token fields, trimming of bytes
 * that are not UTF-8), then the test exits 77 saying why. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_files.h"

#include "chat.h"
#include "model_mlx.h" /* mg_last_error */

static int failures, checks;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            if (failures <= 40) {                                                                  \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                               \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fprintf(stderr, "\n");                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Hex ("-" for empty) to a NUL-terminated string (the reference writes no NUL bytes). */
static char *unhex(const char *h) {
    const size_t n = strcmp(h, "-") ? strlen(h) / 2 : 0;
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        s[i] = (char)(hexval(h[2 * i]) * 16 + hexval(h[2 * i + 1]));
    s[n] = 0;
    return s;
}

/* Renders into a buffer of exactly the size the size query gives; NULL when refused. */
static char *render(const mg_chat_template *t, const mg_chat_message *m, size_t count, bool agp,
                    mg_status *st) {
    size_t len = 0, len2 = 0;
    mg_chat_render(t, m, count, agp, NULL, 0, &len); /* a refusal reports 0 */
    char *out = malloc(len + 1);
    *st = mg_chat_render(t, m, count, agp, out, len + 1, &len2);
    if (*st || len2 != len) {
        if (!*st)
            *st = MG_ERR_INTERNAL; /* the size query and the rendering disagree */
        free(out);
        return NULL;
    }
    return out;
}

/* ------------------------------------------------------------------ against jinja2 */

#define MAX_CONVS 64
#define MAX_MSGS 16

typedef struct conv {
    size_t count;
    mg_chat_message m[MAX_MSGS];
} conv;

static size_t read_conversations(const char *dir, conv *convs) {
    char path[4096];
    snprintf(path, sizeof path, "%s/conversations.txt", dir);
    size_t len;
    char *text = test_read_file(path, &len);
    CHECK(text, "cannot read %s", path);
    if (!text)
        return 0;
    size_t n = 0;
    for (char *line = strtok(text, "\n"); line && n < MAX_CONVS; line = strtok(NULL, "\n")) {
        unsigned id, count;
        int used;
        if (sscanf(line, "%u %u%n", &id, &count, &used) != 2 || id != n || count > MAX_MSGS) {
            CHECK(false, "bad conversation line %zu", n);
            break;
        }
        conv *c = &convs[n++];
        c->count = count;
        char *p = line + used;
        for (unsigned i = 0; i < count; i++) {
            char role[1024], content[8192];
            int k;
            if (sscanf(p, " %1023s %8191s%n", role, content, &k) != 2) {
                CHECK(false, "conversation %u: message %u unreadable", id, i);
                c->count = i;
                break;
            }
            c->m[i].role = unhex(role);
            c->m[i].content = unhex(content);
            p += k;
        }
    }
    free(text);
    return n;
}

static void against_reference(const char *dir) {
    conv convs[MAX_CONVS] = {0};
    const size_t n_convs = read_conversations(dir, convs);
    char path[4096];
    snprintf(path, sizeof path, "%s/index.txt", dir);
    size_t len;
    char *index = test_read_file(path, &len);
    CHECK(index, "cannot read %s", path);
    mg_chat_template t;
    bool have_t = false;
    char name[256] = "";
    int templates = 0, rendered = 0, refused = 0;
    for (char *line = index ? strtok(index, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        char kind, a[256], b[256], c[64 * 1024];
        char *hex = malloc(strlen(line) + 1);
        const int nf = sscanf(line, "%c %255s %255s %255s %s", &kind, a, b, c, hex);
        if (kind == 'T' && nf == 4) {
            snprintf(name, sizeof name, "%s", a);
            snprintf(path, sizeof path, "%s/%s.jinja", dir, a);
            size_t tlen;
            char *text = test_read_file(path, &tlen);
            CHECK(text, "cannot read %s", path);
            have_t = text && mg_chat_template_recognise(text, tlen, &t) == MG_OK;
            CHECK(have_t, "%s: not recognised: %s", a, mg_last_error());
            if (have_t) {
                char *bos = unhex(b), *eos = unhex(c);
                CHECK(mg_chat_set_special_tokens(&t, bos, eos) == MG_OK, "%s: tokens", a);
                free(bos);
                free(eos);
            }
            free(text);
            templates++;
        } else if (kind == 'R' && nf == 5 && have_t && !strcmp(a, name)) {
            const unsigned id = (unsigned)atoi(b);
            const bool agp = atoi(c) != 0;
            CHECK(id < n_convs, "%s: conversation %u unknown", name, id);
            if (id >= n_convs) {
                free(hex);
                continue;
            }
            mg_status st;
            char *got = render(&t, convs[id].m, convs[id].count, agp, &st);
            if (!strcmp(hex, "ERROR")) {
                refused++;
                CHECK(!got && st == MG_ERR_INVALID_ARGUMENT,
                      "%s conversation %u agp %d: jinja2 refuses it, rendered here as [%s]", name,
                      id, agp, got ? got : "");
                /* the refusal reports no length either */
                size_t n = 99;
                mg_chat_render(&t, convs[id].m, convs[id].count, agp, NULL, 0, &n);
                CHECK(n == 0, "%s conversation %u: refused with length %zu", name, id, n);
            } else {
                rendered++;
                char *want = unhex(hex);
                CHECK(got && !strcmp(got, want),
                      "%s conversation %u agp %d:\n  jinja2: [%s]\n  here:   [%s]\n  (%s)", name,
                      id, agp, want, got ? got : "(refused)", got ? "" : mg_last_error());
                /* where the template writes bos_token the rendering starts with it: what a
                 * caller relies on to encode it without adding BOS again (ChatML writes none,
                 * though SmolLM2's BOS text, <|im_start|>, opens every rendering) */
                const bool starts = !strncmp(want, t.bos_token, strlen(t.bos_token));
                if (got && t.bos_token[0] && t.format != MG_CHAT_CHATML)
                    CHECK(mg_chat_writes_bos(&t, convs[id].count) == starts,
                          "%s conversation %u: mg_chat_writes_bos disagrees", name, id);
                if (t.format == MG_CHAT_CHATML)
                    CHECK(!mg_chat_writes_bos(&t, convs[id].count), "%s writes no BOS", name);
                free(want);
            }
            free(got);
        } else if (kind == 'R' && !have_t) {
            /* counted as failures at the T line already */
        } else {
            CHECK(false, "bad index line: %.80s", line);
        }
        free(hex);
    }
    free(index);
    CHECK(templates == 5, "%d templates in the reference, 5 expected", templates);
    CHECK(rendered > 150 && refused > 20, "%d renderings, %d refusals: the reference is short",
          rendered, refused);
    printf("against jinja2: %d templates, %d renderings, %d refusals\n", templates, rendered,
           refused);
    for (size_t i = 0; i < n_convs; i++)
        for (size_t j = 0; j < convs[i].count; j++) {
            free((char *)convs[i].m[j].role);
            free((char *)convs[i].m[j].content);
        }
}

/* ------------------------------------------------------------------ without a reference */

static const char *const template_files[] = {"chatml", "llama3", "mistral_v1", "mistral_v2_system"};

/* A template changed anywhere by one byte, cut short or lengthened is not one of the formats. */
static void near_misses(void) {
    for (size_t f = 0; f < sizeof template_files / sizeof *template_files; f++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.jinja", METRALE_CHAT_TEMPLATES, template_files[f]);
        size_t len;
        char *text = test_read_file(path, &len);
        CHECK(text, "cannot read %s", path);
        if (!text)
            continue;
        mg_chat_template t;
        CHECK(mg_chat_template_recognise(text, len, &t) == MG_OK, "%s: %s", path, mg_last_error());
        CHECK(mg_chat_template_recognise(text, len - 1, &t) == MG_ERR_UNSUPPORTED, "%s cut",
              template_files[f]);
        char *longer = malloc(len + 2);
        memcpy(longer, text, len);
        longer[len] = ' ';
        CHECK(mg_chat_template_recognise(longer, len + 1, &t) == MG_ERR_UNSUPPORTED, "%s + ' '",
              template_files[f]);
        free(longer);
        CHECK(strstr(mg_last_error(), "not one this runtime renders"), "message: %s",
              mg_last_error());
        for (size_t i = 0; i < len; i += 7) {
            const char was = text[i];
            text[i] = was == 'x' ? 'y' : 'x';
            CHECK(mg_chat_template_recognise(text, len, &t) == MG_ERR_UNSUPPORTED,
                  "%s with byte %zu changed is recognised", template_files[f], i);
            text[i] = was;
        }
        free(text);
    }
}

static void protocol(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/llama3.jinja", METRALE_CHAT_TEMPLATES);
    size_t len;
    char *text = test_read_file(path, &len);
    mg_chat_template t;
    CHECK(text && mg_chat_template_recognise(text, len, &t) == MG_OK, "llama3: %s",
          mg_last_error());
    free(text);
    if (t.format != MG_CHAT_LLAMA3)
        return;
    /* unset special tokens render as empty, as an undefined bos_token does */
    const mg_chat_message m = {.role = "user", .content = " \t\xff\xe3\x80 x \xc2\xa0\xe3\x80\x80"};
    char out[256];
    size_t n;
    CHECK(mg_chat_render(&t, &m, 1, false, out, sizeof out, &n) == MG_OK, "%s", mg_last_error());
    /* the invalid 0xFF and the truncated U+3000 are not whitespace: trimming stops at them;
     * the trailing NBSP and U+3000 are */
    CHECK(!strcmp(out, "<|start_header_id|>user<|end_header_id|>\n\n\xff\xe3\x80 x<|eot_id|>"),
          "trimmed: [%s]", out);
    char long_token[100];
    memset(long_token, 'b', sizeof long_token - 1);
    long_token[sizeof long_token - 1] = 0;
    CHECK(mg_chat_set_special_tokens(&t, "<|begin_of_text|>", NULL) == MG_OK, "set");
    CHECK(mg_chat_set_special_tokens(&t, long_token, "e") == MG_ERR_INVALID_ARGUMENT, "long bos");
    CHECK(!strcmp(t.bos_token, "<|begin_of_text|>") && !t.eos_token[0], "unchanged on error");
    const mg_chat_message hi = {.role = "user", .content = "hi"};
    const char want[] = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    CHECK(mg_chat_render(&t, &hi, 1, true, NULL, 0, &n) == MG_ERR_INVALID_ARGUMENT &&
              n == sizeof want - 1,
          "size query: %zu", n);
    CHECK(mg_chat_render(&t, &hi, 1, true, out, sizeof want - 1, &n) == MG_ERR_INVALID_ARGUMENT,
          "no room for the NUL");
    CHECK(mg_chat_render(&t, &hi, 1, true, out, sizeof want, &n) == MG_OK && !strcmp(out, want),
          "exact fit: [%s]", out);
    const mg_chat_message none = {.role = "user", .content = NULL};
    CHECK(mg_chat_render(&t, &none, 1, true, out, sizeof out, &n) == MG_ERR_INVALID_ARGUMENT,
          "NULL content");
    CHECK(mg_chat_writes_bos(&t, 1) && !mg_chat_writes_bos(&t, 0), "llama3 bos");
}

int main(void) {
    near_misses();
    protocol();
    const char *dir = getenv("METRALE_CHAT_REFERENCE");
    const char *why = dir ? NULL : "METRALE_CHAT_REFERENCE is not set (run through ctest)";
    char skip[1024] = "";
    if (dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/SKIP", dir);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(skip, sizeof skip, f))
                snprintf(skip, sizeof skip, "the reference could not be made");
            fclose(f);
            why = skip;
        } else {
            against_reference(dir);
        }
    }
    printf("%d checks, %d failed\n", checks, failures);
    if (failures)
        return 1;
    if (why) {
        printf("test_chat: jinja2 comparison skipped: %s\n", why);
        return 77;
    }
    return 0;
}
