/* gguf_blocks.c - see gguf_blocks.h. */
#include "gguf_blocks.h"

#include "gguf.h"
#include "metrale/dtype.h"

static float f16_at(const uint8_t *p) {
    return mg_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* The 6-bit scale and min of sub-block j (0..7) packed in the 12 bytes q of Q4_K and Q5_K:
 * sub-blocks 0-3 in the low six bits of bytes 0-7, 4-7 in the nibbles of bytes 8-11 with their
 * top two bits in the spare bits of bytes 0-7. */
static void scale_min(int j, const uint8_t *q, float *sc, float *m) {
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 15) | (q[j - 4] >> 6) << 4);
        *m = (float)((q[j + 4] >> 4) | (q[j] >> 6) << 4);
    }
}

/* Q4_K (144 bytes: d, dmin, scales[12], qs[128]) and Q5_K (176 bytes: d, dmin, scales[12],
 * qh[32], qs[128]): 8 sub-blocks of 32; each 32 bytes of qs hold two sub-blocks, the low
 * nibbles the first; Q5_K's fifth bit of sub-block s is bit s of qh[l]. */
static void q45_k(const uint8_t *p, bool five, float *y) {
    const float d = f16_at(p), dmin = f16_at(p + 2);
    const uint8_t *scales = p + 4, *qh = p + 16, *qs = p + (five ? 48 : 16);
    for (int s = 0; s < 8; s++) {
        float sc, m;
        scale_min(s, scales, &sc, &m);
        const float dl = d * sc, ml = dmin * m;
        const uint8_t *q = qs + 32 * (s / 2);
        for (int l = 0; l < 32; l++) {
            int v = s & 1 ? q[l] >> 4 : q[l] & 15;
            if (five)
                v |= ((qh[l] >> s) & 1) << 4;
            y[32 * s + l] = dl * (float)v - ml;
        }
    }
}

/* Q6_K (210 bytes: ql[128], qh[64], scales[16] int8, d): two halves of 128; in half h, element
 * 32 * k + l (k 0..3) takes the nibble (k / 2 ? high : low) of ql[64h + l + 32 (k & 1)] and
 * bits 2k..2k+1 of qh[32h + l], minus 32, scaled by scales[8h + 2k + l / 16]. */
static void q6_k(const uint8_t *p, float *y) {
    const uint8_t *ql = p, *qh = p + 128;
    const int8_t *scales = (const int8_t *)(p + 192);
    const float d = f16_at(p + 208);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                const uint8_t lo = ql[64 * h + l + 32 * (k & 1)];
                const int v =
                    ((k / 2 ? lo >> 4 : lo & 15) | ((qh[32 * h + l] >> (2 * k)) & 3) << 4) - 32;
                const float dl = d * (float)scales[8 * h + 2 * k + l / 16];
                y[128 * h + 32 * k + l] = dl * (float)v;
            }
}

bool mg_gguf_k_blocks_to_f32(uint32_t type, const uint8_t *p, size_t blocks, float *out) {
    uint32_t be, bb;
    if ((type != MG_GGUF_Q4_K && type != MG_GGUF_Q5_K && type != MG_GGUF_Q6_K) ||
        !mg_gguf_type_block(type, &be, &bb))
        return false;
    for (size_t b = 0; b < blocks; b++, p += bb, out += MG_GGUF_K_BLOCK) {
        if (type == MG_GGUF_Q6_K)
            q6_k(p, out);
        else
            q45_k(p, type == MG_GGUF_Q5_K, out);
    }
    return true;
}
