/*
 * test_launch_builder.c - the launch builder's argument list (metrale/launch.h): exact slot
 * layout of mixed lists, payload bytes and zeroed slot tails, typed readers, overflow errors
 * and their messages, describe(), and the 1-D launch configuration.
 */
#include <math.h>
#include <stdint.h>

#include "metrale/launch.h"
#include "utils_test_support.h"

static mg_launch builder; /* large (4 KiB of slots): static, not on the stack */

/* Fills every slot with a poison byte so zeroed tails and untouched slots are visible. */
static void poison_slots(mg_launch *l) {
    memset(l->slots, 0xAB, sizeof l->slots);
}

static bool slots_are_poison(const mg_launch *l, uint32_t first, uint32_t count) {
    const unsigned char *p = (const unsigned char *)&l->slots[first];
    for (size_t i = 0; i < (size_t)count * 8; i++)
        if (p[i] != 0xAB)
            return false;
    return true;
}

static void test_init_and_clear(void) {
    mg_launch *l = &builder;
    mg_launch_init(l, (mg_dim3){7, 3, 2}, (mg_dim3){128, 2, 1}, 49152);
    CHECK(l->grid.x == 7 && l->grid.y == 3 && l->grid.z == 2);
    CHECK(l->block.x == 128 && l->block.y == 2 && l->block.z == 1);
    CHECK(l->shared_bytes == 49152);
    CHECK(l->arg_count == 0 && l->slot_count == 0);
    CHECK(mg_launch_status(l) == MG_OK);
    mg_launch_arg_u32(l, 1);
    mg_launch_arg_tensor_map(l, NULL); /* records an error */
    CHECK(mg_launch_status(l) == MG_ERR_INVALID_ARGUMENT);
    mg_launch_clear_args(l);
    CHECK(l->arg_count == 0 && l->slot_count == 0 && mg_launch_status(l) == MG_OK);
    CHECK(l->grid.x == 7 && l->block.x == 128 && l->shared_bytes == 49152);
    /* flags: cleared by init (even after a launch that set them), kept by clear_args */
    mg_launch_set_flags(l, MG_LAUNCH_PROGRAMMATIC);
    mg_launch_clear_args(l);
    CHECK(l->flags == MG_LAUNCH_PROGRAMMATIC);
    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    CHECK(l->flags == 0);
}

static void test_mixed_layout(void) {
    mg_launch *l = &builder;
    mg_launch_init(l, (mg_dim3){2, 1, 1}, (mg_dim3){128, 1, 1}, 0);
    poison_slots(l);

    unsigned char bytes12[12], bytes1[1] = {0x5A}, map[MG_TENSOR_MAP_BYTES], bytes9[9];
    for (int i = 0; i < 12; i++)
        bytes12[i] = (unsigned char)(0x10 + i);
    for (int i = 0; i < MG_TENSOR_MAP_BYTES; i++)
        map[i] = (unsigned char)(255 - i);
    for (int i = 0; i < 9; i++)
        bytes9[i] = (unsigned char)(0xC0 + i);
    float neg_zero = -0.0f;

    mg_launch_arg_ptr(l, 0x7f0012345600ull);         /* 0: slot 0 */
    mg_launch_arg_u32(l, 0xDEADBEEFu);               /* 1: slot 1 */
    mg_launch_arg_i32(l, -3);                        /* 2: slot 2 */
    mg_launch_arg_u64(l, 0x0123456789ABCDEFull);     /* 3: slot 3 */
    mg_launch_arg_f32(l, 1.5f);                      /* 4: slot 4 */
    mg_launch_arg_bytes(l, bytes12, sizeof bytes12); /* 5: slots 5-6 */
    mg_launch_arg_bytes(l, NULL, 0);                 /* 6: slot 7 (empty still has one) */
    mg_launch_arg_tensor_map(l, map);                /* 7: slots 8-23 */
    mg_launch_arg_u32(l, 42);                        /* 8: slot 24, right after the map */
    mg_launch_arg_bytes(l, bytes1, 1);               /* 9: slot 25 */
    mg_launch_arg_bytes(l, bytes9, 9);               /* 10: slots 26-27 */
    mg_launch_arg_bytes(l, bytes12, 0);              /* 11: slot 28 (non-NULL, empty) */
    mg_launch_arg_f32(l, neg_zero);                  /* 12: slot 29 */
    mg_launch_arg_ptr(l, 0);                         /* 13: slot 30, null pointer is fine */

    CHECK(mg_launch_status(l) == MG_OK);
    static const struct {
        mg_arg_kind kind;
        uint32_t first_slot, bytes;
    } want[] = {
        {MG_ARG_BUFFER, 0, 8}, {MG_ARG_U32, 1, 4},          {MG_ARG_I32, 2, 4},
        {MG_ARG_U64, 3, 8},    {MG_ARG_F32, 4, 4},          {MG_ARG_BYTES, 5, 12},
        {MG_ARG_BYTES, 7, 0},  {MG_ARG_TENSOR_MAP, 8, 128}, {MG_ARG_U32, 24, 4},
        {MG_ARG_BYTES, 25, 1}, {MG_ARG_BYTES, 26, 9},       {MG_ARG_BYTES, 28, 0},
        {MG_ARG_F32, 29, 4},   {MG_ARG_BUFFER, 30, 8},
    };
    const uint32_t n = sizeof want / sizeof want[0];
    CHECKF(l->arg_count == n, "arg_count %u", l->arg_count);
    CHECKF(l->slot_count == 31, "slot_count %u", l->slot_count);
    for (uint32_t i = 0; i < n && i < l->arg_count; i++) {
        CHECKF(l->args[i].kind == want[i].kind, "arg %u kind %d", i, (int)l->args[i].kind);
        CHECKF(l->args[i].first_slot == want[i].first_slot, "arg %u first_slot %u want %u", i,
               l->args[i].first_slot, want[i].first_slot);
        CHECKF(l->args[i].bytes == want[i].bytes, "arg %u bytes %u", i, l->args[i].bytes);
        CHECKF(mg_launch_arg_data(l, i) == (const void *)&l->slots[want[i].first_slot],
               "arg %u data pointer", i);
        CHECKF(((uintptr_t)mg_launch_arg_data(l, i) & 7) == 0, "arg %u not 8-byte aligned", i);
    }
    CHECK(mg_launch_arg_data(l, n) == NULL);
    CHECK(mg_launch_arg_data(l, UINT32_MAX) == NULL);
    CHECK(slots_are_poison(l, 31, MG_LAUNCH_MAX_SLOTS - 31)); /* nothing written past the end */

    /* payloads and zeroed tails, byte for byte (little-endian host) */
    const unsigned char *s = (const unsigned char *)l->slots;
    uint64_t u64;
    memcpy(&u64, s + 0 * 8, 8);
    CHECK(u64 == 0x7f0012345600ull);
    memcpy(&u64, s + 1 * 8, 8);
    CHECK(u64 == 0xDEADBEEFull); /* upper half zeroed, not poison */
    memcpy(&u64, s + 2 * 8, 8);
    CHECK(u64 == 0xFFFFFFFDull); /* -3 as 4 bytes, then zeros: no sign extension into slot */
    memcpy(&u64, s + 3 * 8, 8);
    CHECK(u64 == 0x0123456789ABCDEFull);
    float f;
    memcpy(&f, s + 4 * 8, 4);
    CHECK(f == 1.5f);
    CHECK(memcmp(s + 4 * 8 + 4, "\0\0\0\0", 4) == 0);
    CHECK(memcmp(s + 5 * 8, bytes12, 12) == 0);
    CHECK(memcmp(s + 5 * 8 + 12, "\0\0\0\0", 4) == 0);
    memcpy(&u64, s + 7 * 8, 8);
    CHECK(u64 == 0); /* empty argument's slot is zeroed */
    CHECK(memcmp(s + 8 * 8, map, MG_TENSOR_MAP_BYTES) == 0);
    memcpy(&u64, s + 24 * 8, 8);
    CHECK(u64 == 42);
    memcpy(&u64, s + 25 * 8, 8);
    CHECK(u64 == 0x5A);
    CHECK(memcmp(s + 26 * 8, bytes9, 9) == 0);
    CHECK(memcmp(s + 26 * 8 + 9, "\0\0\0\0\0\0\0", 7) == 0);
    memcpy(&u64, s + 28 * 8, 8);
    CHECK(u64 == 0);
    uint32_t bits;
    memcpy(&bits, s + 29 * 8, 4);
    CHECK(bits == 0x80000000u); /* -0.0f keeps its sign bit */

    /* typed readers; a wrong kind or index reads 0 */
    CHECK(mg_launch_get_ptr(l, 0) == 0x7f0012345600ull);
    CHECK(mg_launch_get_u32(l, 1) == 0xDEADBEEFu);
    CHECK(mg_launch_get_i32(l, 2) == -3);
    CHECK(mg_launch_get_u64(l, 3) == 0x0123456789ABCDEFull);
    CHECK(mg_launch_get_f32(l, 4) == 1.5f);
    CHECK(mg_launch_get_u32(l, 8) == 42);
    CHECK(signbit(mg_launch_get_f32(l, 12)) && mg_launch_get_f32(l, 12) == 0.0f);
    CHECK(mg_launch_get_ptr(l, 13) == 0);
    CHECK(mg_launch_get_u32(l, 0) == 0); /* a pointer read as u32 */
    CHECK(mg_launch_get_ptr(l, 3) == 0); /* a u64 read as pointer */
    CHECK(mg_launch_get_f32(l, 1) == 0); /* a u32 read as f32 */
    CHECK(mg_launch_get_i32(l, 1) == 0);
    CHECK(mg_launch_get_u64(l, 7) == 0); /* a tensor map */
    CHECK(mg_launch_get_u32(l, n) == 0); /* past the end */
    CHECK(mg_launch_get_ptr(NULL, 0) == 0);

    /* clear and reuse: indices start over at slot 0 */
    mg_launch_clear_args(l);
    mg_launch_arg_tensor_map(l, map);
    mg_launch_arg_ptr(l, 0x1000);
    CHECK(l->args[0].first_slot == 0 && l->args[1].first_slot == 16 && l->slot_count == 17);
    CHECK(mg_launch_get_ptr(l, 1) == 0x1000);
}

/* Many tensor maps back to back: each exactly 16 slots, no drift. */
static void test_tensor_map_run(void) {
    mg_launch *l = &builder;
    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    unsigned char map[MG_TENSOR_MAP_BYTES];
    for (uint32_t k = 0; k < MG_LAUNCH_MAX_SLOTS / 16; k++) {
        memset(map, (int)k, sizeof map);
        mg_launch_arg_tensor_map(l, map);
    }
    CHECK(mg_launch_status(l) == MG_OK);
    CHECK(l->slot_count == MG_LAUNCH_MAX_SLOTS && l->arg_count == MG_LAUNCH_MAX_SLOTS / 16);
    for (uint32_t k = 0; k < l->arg_count; k++) {
        CHECK(l->args[k].first_slot == 16 * k);
        const unsigned char *p = mg_launch_arg_data(l, k);
        CHECK(p[0] == (unsigned char)k && p[127] == (unsigned char)k);
    }
    /* the argument space is exactly full: even an empty argument no longer fits */
    mg_clear_error();
    mg_launch_arg_bytes(l, NULL, 0);
    CHECK(mg_launch_status(l) == MG_ERR_INVALID_ARGUMENT);
    CHECKF(strstr(mg_last_error(), "4096") != NULL, "message: %s", mg_last_error());
    CHECK(l->arg_count == MG_LAUNCH_MAX_SLOTS / 16);
}

static void test_overflow_errors(void) {
    mg_launch *l = &builder;

    /* too many arguments: the 65th is refused, the first 64 stay intact */
    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    for (uint32_t i = 0; i < MG_LAUNCH_MAX_ARGS; i++)
        mg_launch_arg_u32(l, i);
    CHECK(mg_launch_status(l) == MG_OK);
    mg_clear_error();
    mg_launch_arg_u32(l, 999);
    CHECK(mg_launch_status(l) == MG_ERR_INVALID_ARGUMENT);
    CHECKF(strstr(mg_last_error(), "more than 64 arguments") != NULL, "message: %s",
           mg_last_error());
    CHECK(l->arg_count == MG_LAUNCH_MAX_ARGS && l->slot_count == MG_LAUNCH_MAX_ARGS);
    CHECK(mg_launch_get_u32(l, MG_LAUNCH_MAX_ARGS - 1) == MG_LAUNCH_MAX_ARGS - 1);
    /* later additions are ignored and the first error is kept */
    char first_message[256];
    snprintf(first_message, sizeof first_message, "%s", mg_last_error());
    mg_launch_arg_tensor_map(l, NULL);
    mg_launch_arg_bytes(l, NULL, 5);
    CHECK(mg_launch_status(l) == MG_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(first_message, mg_last_error()) == 0);
    CHECK(l->arg_count == MG_LAUNCH_MAX_ARGS);

    /* too many bytes: exactly 4096 fits, one more byte does not */
    static unsigned char big[MG_LAUNCH_MAX_SLOTS * 8 + 8];
    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_launch_arg_bytes(l, big, MG_LAUNCH_MAX_SLOTS * 8);
    CHECK(mg_launch_status(l) == MG_OK && l->slot_count == MG_LAUNCH_MAX_SLOTS);
    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_launch_arg_u32(l, 1);
    poison_slots(l);
    mg_clear_error();
    mg_launch_arg_bytes(l, big, MG_LAUNCH_MAX_SLOTS * 8); /* 4096 after 8 used */
    CHECK(mg_launch_status(l) == MG_ERR_INVALID_ARGUMENT);
    CHECKF(strstr(mg_last_error(), "4096 bytes") != NULL &&
               strstr(mg_last_error(), "8 bytes used") != NULL,
           "message: %s", mg_last_error());
    CHECK(l->arg_count == 1 && l->slot_count == 1);
    CHECK(slots_are_poison(l, 0, MG_LAUNCH_MAX_SLOTS)); /* refused: nothing written */

    /* absurd lengths must be refused, not wrapped around into a tiny slot count */
    const size_t absurd[] = {SIZE_MAX, SIZE_MAX - 6, SIZE_MAX / 2 + 1, (size_t)UINT32_MAX + 1};
    for (size_t i = 0; i < sizeof absurd / sizeof absurd[0]; i++) {
        mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
        mg_launch_arg_bytes(l, big, absurd[i]);
        CHECKF(mg_launch_status(l) == MG_ERR_INVALID_ARGUMENT, "bytes=%zu accepted", absurd[i]);
        CHECK(l->arg_count == 0 && l->slot_count == 0);
    }

    /* NULL payloads */
    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_clear_error();
    mg_launch_arg_bytes(l, NULL, 16);
    CHECK(mg_launch_status(l) == MG_ERR_INVALID_ARGUMENT);
    CHECKF(strstr(mg_last_error(), "NULL data for a 16-byte argument") != NULL, "message: %s",
           mg_last_error());
    CHECK(l->arg_count == 0);
    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_clear_error();
    mg_launch_arg_tensor_map(l, NULL);
    CHECK(mg_launch_status(l) == MG_ERR_INVALID_ARGUMENT);
    CHECKF(strstr(mg_last_error(), "NULL tensor map") != NULL, "message: %s", mg_last_error());
}

static void test_describe(void) {
    mg_launch *l = &builder;
    unsigned char b12[12] = {0}, map[MG_TENSOR_MAP_BYTES] = {0};
    mg_launch_init(l, (mg_dim3){2, 1, 1}, (mg_dim3){128, 1, 1}, 1024);
    mg_launch_arg_ptr(l, 0x1000);
    mg_launch_arg_u32(l, 5);
    mg_launch_arg_i32(l, -3);
    mg_launch_arg_u64(l, 7);
    mg_launch_arg_f32(l, 1.5f);
    mg_launch_arg_bytes(l, b12, 12);
    mg_launch_arg_bytes(l, NULL, 0);
    mg_launch_arg_tensor_map(l, map);
    const char *want = "metrale:k<<<(2,1,1),(128,1,1),1024>>>(ptr=0x1000, u32=5, i32=-3, "
                       "u64=7, f32=1.5, bytes[12], bytes[0], tensor_map)";
    char buf[256];
    memset(buf, 'Z', sizeof buf);
    mg_launch_describe(l, "metrale:k", buf, sizeof buf);
    CHECKF(strcmp(buf, want) == 0, "describe: %s", buf);

    /* every truncation length stays inside the buffer and NUL-terminates */
    size_t full = strlen(want);
    for (size_t cap = 1; cap <= full + 2; cap++) {
        char small[300];
        memset(small, 'Z', sizeof small);
        mg_launch_describe(l, "metrale:k", small, cap);
        CHECKF(small[cap] == 'Z', "describe wrote past %zu bytes", cap);
        CHECKF(memchr(small, '\0', cap) != NULL, "describe not terminated within %zu", cap);
        size_t len = strlen(small);
        CHECKF(len == (cap - 1 < full ? cap - 1 : full), "cap %zu gave length %zu", cap, len);
        CHECKF(strncmp(small, want, len) == 0, "cap %zu gave '%s'", cap, small);
    }
    char untouched = 'Z';
    mg_launch_describe(l, "k", &untouched, 0);
    CHECK(untouched == 'Z');
    mg_launch_describe(l, "k", NULL, 10); /* no crash */

    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){32, 1, 1}, 0);
    mg_launch_describe(l, NULL, buf, sizeof buf);
    CHECKF(strcmp(buf, "?<<<(1,1,1),(32,1,1),0>>>()") == 0, "describe: %s", buf);
}

static void test_config_1d(void) {
    mg_dim3 g, b;
    mg_launch_config_1d(1000, 256, &g, &b);
    CHECK(g.x == 4 && g.y == 1 && g.z == 1 && b.x == 256 && b.y == 1 && b.z == 1);
    mg_launch_config_1d(1024, 256, &g, &b);
    CHECK(g.x == 4);
    mg_launch_config_1d(1025, 0, &g, &b);
    CHECK(g.x == 5 && b.x == 256);
    mg_launch_config_1d(0, 128, &g, &b);
    CHECK(g.x == 1 && b.x == 128);
    mg_launch_config_1d(1, 1024, &g, &b);
    CHECK(g.x == 1 && b.x == 1024);
    mg_launch_config_1d(UINT64_MAX, 1, &g, &b);
    CHECK(g.x == 0x7fffffffu && b.x == 1);
    mg_launch_config_1d(UINT64_MAX, 256, &g, &b); /* n + block - 1 must not wrap */
    CHECKF(g.x == 0x7fffffffu && b.x == 256, "grid %u", g.x);
    mg_launch_config_1d(UINT64_MAX - 100, 256, &g, &b);
    CHECKF(g.x == 0x7fffffffu, "grid %u", g.x);
}

int main(void) {
    test_init_and_clear();
    test_mixed_layout();
    test_tensor_map_run();
    test_overflow_errors();
    test_describe();
    test_config_1d();
    return test_finish();
}
