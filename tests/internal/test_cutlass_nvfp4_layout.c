/* test_cutlass_nvfp4_layout.c - the host-side code of the CUTLASS plugin's Blackwell NVFP4 GEMMs
 * (kernels/cuda/cutlass/cutlass_nvfp4_layout.cu), which needs no GPU: the scale-factor layout
 * CUTLASS reads (its Sm1xxBlkScaledConfig, evaluated by cute) must be exactly the library's
 * 128x4 swizzle of metrale/nvfp4.h, which mg_nvfp4_prepare and the activation quantizer write;
 * the grouped form's per-expert scale tiles must never overlap and must fit the workspace; and
 * the workspace carving must be aligned and disjoint. Dlopens the built plugin next to this
 * program; skips (77) when it was not built. */
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cutlass_nvfp4.h"
#include "metrale/nvfp4.h"
#include "test_util.h"

static mg_cutlass_nvfp4_layout_sf_bytes_fn sf_bytes;
static mg_cutlass_nvfp4_layout_sf_offset_fn sf_offset;
static mg_cutlass_nvfp4_layout_moe_sf_row_base_fn row_base;
static mg_cutlass_nvfp4_layout_workspace_fn workspace;
static mg_cutlass_nvfp4_layout_act_sf_offset_fn act_sf_offset;
static mg_cutlass_nvfp4_layout_sf_position_fn sf_position;

static size_t round_up(size_t x, size_t to) {
    return (x + to - 1) / to * to;
}

/* Every scale of [rows, k], as operand A and as operand B, at the library's swizzled offset. */
static void check_sf_layout(uint32_t rows, uint32_t k) {
    const uint32_t cols = k / 16;
    CHECK(sf_bytes(rows, k) == mg_nvfp4_swizzled_scale_bytes(rows, k));
    int mismatches = 0;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++) {
            const int64_t want = (int64_t)mg_nvfp4_swizzled_offset(r, c, cols);
            const int64_t a = sf_offset(rows, k, 0, r, c), b = sf_offset(rows, k, 1, r, c);
            if ((a != want || b != want) && mismatches++ < 5)
                fprintf(stderr,
                        "rows %u k %u scale (%u, %u): CUTLASS A %lld B %lld, swizzle %lld\n", rows,
                        k, r, c, (long long)a, (long long)b, (long long)want);
        }
    CHECK(mismatches == 0);
    /* The quantizer writes where CUTLASS reads; the weight re-layout visits every byte once,
     * padding bytes at positions outside the matrix. */
    mismatches = 0;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++)
            mismatches +=
                act_sf_offset(r, c, cols) != (int64_t)mg_nvfp4_swizzled_offset(r, c, cols);
    CHECK(mismatches == 0);
    size_t bytes = mg_nvfp4_swizzled_scale_bytes(rows, k), inside = 0;
    mismatches = 0;
    for (size_t o = 0; o < bytes; o++) {
        uint32_t r = UINT32_MAX, c = UINT32_MAX;
        sf_position(o, cols, &r, &c);
        if (r < rows && c < cols) {
            inside++;
            mismatches += mg_nvfp4_swizzled_offset(r, c, cols) != o;
        } else {
            mismatches += r >= (uint32_t)round_up(rows, 128) || c >= (uint32_t)round_up(cols, 4);
        }
    }
    CHECK(mismatches == 0);
    CHECK(inside == (size_t)rows * cols);
    CHECK(sf_offset(rows, k, 0, rows, 0) == -1); /* outside: refused, not computed */
    CHECK(sf_offset(rows, k, 1, 0, cols) == -1);
}

/* Random non-decreasing expert offsets (some experts empty): each expert's tiles start on a
 * 128-row boundary, come after the previous expert's, and end inside the workspace's scales. */
static void check_moe_bases(uint32_t rows, uint32_t experts, uint32_t k) {
    uint32_t offsets[65];
    offsets[0] = 0;
    for (uint32_t e = 1; e < experts; e++)
        offsets[e] = (test_rand() % 4 == 0) ? offsets[e - 1]
                                            : (uint32_t)test_rand_range(offsets[e - 1], rows);
    offsets[experts] = rows;
    mg_cutlass_nvfp4_workspace_layout w;
    CHECK_OK(workspace(rows, experts, k, 1, &w));
    const size_t tile_row_bytes = round_up(k / 16, 4);
    size_t previous_end = 0;
    for (uint32_t e = 0; e < experts; e++) {
        const uint32_t base = row_base(offsets[e], e);
        const size_t m = offsets[e + 1] - offsets[e];
        CHECK(base % 128 == 0);
        CHECK(base >= previous_end);
        previous_end = base + round_up(m, 128);
        CHECK(previous_end * tile_row_bytes <= w.act_scale_bytes);
    }
}

static void check_workspace(uint32_t rows, uint32_t experts, uint32_t k, int grouped) {
    mg_cutlass_nvfp4_workspace_layout w;
    memset(&w, 0xff, sizeof w);
    CHECK_OK(workspace(rows, experts, k, grouped, &w));
    const size_t starts[] = {w.amax, w.alpha, w.act_codes, w.act_scales, w.group_args, w.cutlass};
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++)
        CHECK(starts[i] % 256 == 0);
    CHECK(w.amax + 4 <= w.alpha);
    CHECK(w.alpha + 4 * (size_t)experts <= w.act_codes);
    CHECK(w.act_codes + (size_t)rows * k / 2 <= w.act_scales);
    CHECK(w.act_scales + w.act_scale_bytes <= w.group_args);
    CHECK(w.group_args + (grouped ? 512 * (size_t)experts : 0) <= w.cutlass);
    CHECK(w.fixed_bytes == w.cutlass);
    if (!grouped)
        CHECK(w.act_scale_bytes == mg_nvfp4_swizzled_scale_bytes(rows, k));
}

int main(void) {
    test_seed();
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
    if (n <= 0) {
        printf("cannot find this program's directory: skipped\n");
        return 77;
    }
    path[n] = '\0';
    strcpy(strrchr(path, '/') + 1, "libmetrale_gpu_cutlass.so");
    void *plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!plugin) {
        printf("%s not built (%s): skipped\n", path, dlerror());
        return 77;
    }
    sf_bytes =
        (mg_cutlass_nvfp4_layout_sf_bytes_fn)dlsym(plugin, "mg_cutlass_nvfp4_layout_sf_bytes");
    sf_offset =
        (mg_cutlass_nvfp4_layout_sf_offset_fn)dlsym(plugin, "mg_cutlass_nvfp4_layout_sf_offset");
    row_base = (mg_cutlass_nvfp4_layout_moe_sf_row_base_fn)dlsym(
        plugin, "mg_cutlass_nvfp4_layout_moe_sf_row_base");
    workspace =
        (mg_cutlass_nvfp4_layout_workspace_fn)dlsym(plugin, "mg_cutlass_nvfp4_layout_workspace");
    act_sf_offset = (mg_cutlass_nvfp4_layout_act_sf_offset_fn)dlsym(
        plugin, "mg_cutlass_nvfp4_layout_act_sf_offset");
    sf_position = (mg_cutlass_nvfp4_layout_sf_position_fn)dlsym(
        plugin, "mg_cutlass_nvfp4_layout_sf_position");
    CHECK(sf_bytes && sf_offset && row_base && workspace && act_sf_offset && sf_position);
    if (!sf_bytes || !sf_offset || !row_base || !workspace || !act_sf_offset || !sf_position)
        return test_finish();

    /* Fixed awkward shapes (partial tiles in both directions), then random ones. */
    const uint32_t rows_list[] = {1, 31, 32, 127, 128, 129, 300};
    const uint32_t k_list[] = {16, 32, 48, 64, 80, 272, 1024};
    for (size_t i = 0; i < sizeof rows_list / sizeof rows_list[0]; i++)
        for (size_t j = 0; j < sizeof k_list / sizeof k_list[0]; j++)
            check_sf_layout(rows_list[i], k_list[j]);
    for (int t = 0; t < 20; t++)
        check_sf_layout((uint32_t)test_rand_range(1, 700), 16 * (uint32_t)test_rand_range(1, 90));
    CHECK(sf_bytes(5, 40) == 0);
    CHECK(sf_bytes(0, 64) == 0);

    for (int t = 0; t < 200; t++) {
        const uint32_t rows = (uint32_t)test_rand_range(1, 3000);
        const uint32_t experts = (uint32_t)test_rand_range(1, 64);
        const uint32_t k = 32 * (uint32_t)test_rand_range(1, 200);
        check_moe_bases(rows, experts, k);
        check_workspace(rows, experts, k, 1);
        check_workspace(rows, 1, k, 0);
    }

    mg_cutlass_nvfp4_workspace_layout w;
    CHECK(workspace(10, 1, 48, 0, &w) == MG_ERR_INVALID_ARGUMENT); /* k not a multiple of 32 */
    CHECK(workspace(10, 2, 64, 0, &w) == MG_ERR_INVALID_ARGUMENT); /* dense with 2 experts */
    CHECK(workspace(0, 1, 64, 0, &w) == MG_ERR_INVALID_ARGUMENT);
    CHECK(workspace(10, 0, 64, 1, &w) == MG_ERR_INVALID_ARGUMENT);
    CHECK(workspace(10, 1, 64, 0, NULL) == MG_ERR_INVALID_ARGUMENT);
    dlclose(plugin);
    return test_finish();
}
