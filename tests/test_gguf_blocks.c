/*
 * test_gguf_blocks.c - the K-quant block decoders (src/model/gguf_blocks.h) against the pinned
 * gguf package's `gguf.quants.dequantize`: tests/model/kquants/<TYPE>.bin (written by
 * tests/model/make_kquant_reference.py) holds random blocks and their reference FP32 values;
 * each decoded element must equal the reference bit for bit, into an output poisoned with NaN.
 * A type other than a K-quant is refused without writing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_blocks.h"
#include "test_files.h"
#include "test_util.h"

static int check_type(uint32_t type) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.bin", METRALE_KQUANT_DIR, mg_gguf_type_name(type));
    size_t len = 0;
    char *file = test_read_file(path, &len);
    if (!file) {
        fprintf(stderr, "cannot read %s\n", path);
        return 1;
    }
    uint32_t be = 0, bb = 0, blocks = 0;
    mg_gguf_type_block(type, &be, &bb);
    if (len >= 4)
        memcpy(&blocks, file, 4);
    if (be != MG_GGUF_K_BLOCK || len != 4 + (size_t)blocks * (bb + 4 * be) || !blocks) {
        fprintf(stderr, "%s: %zu bytes do not hold whole blocks and their reference\n", path, len);
        free(file);
        return 1;
    }
    const uint8_t *raw = (const uint8_t *)file + 4;
    const size_t n = (size_t)blocks * be;
    float *ref = malloc(n * 4), *got = malloc(n * 4);
    memcpy(ref, raw + (size_t)blocks * bb, n * 4);
    for (size_t i = 0; i < n; i++)
        got[i] = NAN;
    int bad = 0;
    if (!mg_gguf_k_blocks_to_f32(type, raw, blocks, got)) {
        fprintf(stderr, "%s refused\n", mg_gguf_type_name(type));
        bad = 1;
    }
    for (size_t i = 0; !bad && i < n; i++)
        if (memcmp(&got[i], &ref[i], 4)) {
            fprintf(stderr, "%s: element %zu (block %zu) is %.9g, gguf.quants gives %.9g\n",
                    mg_gguf_type_name(type), i, i / be, (double)got[i], (double)ref[i]);
            bad = 1;
        }
    if (!bad)
        printf("%s: %u blocks, %zu elements bit-exact\n", mg_gguf_type_name(type), blocks, n);
    free(ref);
    free(got);
    free(file);
    return bad;
}

int main(void) {
    int bad = check_type(MG_GGUF_Q4_K) + check_type(MG_GGUF_Q5_K) + check_type(MG_GGUF_Q6_K);
    float out[MG_GGUF_K_BLOCK];
    const uint8_t zeros[292] = {0};
    out[0] = 1.5f;
    if (mg_gguf_k_blocks_to_f32(MG_GGUF_Q8_0, zeros, 1, out) || out[0] != 1.5f ||
        mg_gguf_k_blocks_to_f32(MG_GGUF_Q8_K, zeros, 1, out) || out[0] != 1.5f) {
        fprintf(stderr, "a type other than Q4_K, Q5_K, Q6_K was decoded\n");
        bad++;
    }
    return bad ? 1 : 0;
}
