/*
 * test_switches.c - the process switches (metrale/switches.h) against their specified semantics.
 *
 * The switches cache their value once per process, so every scenario that involves the
 * environment or the order of setter and first read runs in a fresh child: this program
 * re-executes itself as `test_switches child <step>...` with the scenario's environment and
 * the child performs the steps in order, checking each expectation.
 */
#include <inttypes.h>
#include <stdint.h>

#include "metrale/switches.h"
#include "utils_test_support.h"

/* ------------------------------------------------------------------ child side */

static bool parse_bit(const char *text, bool *out) {
    if (strcmp(text, "0") == 0) {
        *out = false;
        return true;
    }
    if (strcmp(text, "1") == 0) {
        *out = true;
        return true;
    }
    return false;
}

/* Steps:
 *   hermetic=B  midchunk=B  ckpt=B          expect the reader to return B (0/1)
 *   set_hermetic(B)=R                       call the setter, expect return R
 *   set_midchunk(unset|false|true|N)=R      same; N is a raw (invalid) enum value
 *   pdl=B  set_pdl(unset|false|true|N)=R    the programmatic-launch switch, as midchunk
 *   setenv:NAME=VALUE                       change the environment after the fact
 */
static int child_main(int argc, char **argv) {
    int failures = 0;
    for (int i = 0; i < argc; i++) {
        const char *step = argv[i];
        char arg[64];
        char result[8];
        bool want, got;
        if (strncmp(step, "hermetic=", 9) == 0 && parse_bit(step + 9, &want)) {
            got = mg_hermetic_enabled();
        } else if (strncmp(step, "midchunk=", 9) == 0 && parse_bit(step + 9, &want)) {
            got = mg_ssm_tail_midchunk_enabled();
        } else if (strncmp(step, "pdl=", 4) == 0 && parse_bit(step + 4, &want)) {
            got = mg_programmatic_launch_enabled();
        } else if (strncmp(step, "ckpt=", 5) == 0 && parse_bit(step + 5, &want)) {
            got = mg_ssm_tail_ckpt_enabled();
        } else if (sscanf(step, "set_hermetic(%63[^)])=%7s", arg, result) == 2 &&
                   parse_bit(result, &want)) {
            bool on;
            if (!parse_bit(arg, &on)) {
                fprintf(stderr, "child: bad step %s\n", step);
                return 2;
            }
            got = mg_set_hermetic(on);
        } else if ((sscanf(step, "set_midchunk(%63[^)])=%7s", arg, result) == 2 ||
                    sscanf(step, "set_pdl(%63[^)])=%7s", arg, result) == 2) &&
                   parse_bit(result, &want)) {
            mg_tristate v;
            if (strcmp(arg, "unset") == 0)
                v = MG_TRISTATE_UNSET;
            else if (strcmp(arg, "false") == 0)
                v = MG_TRISTATE_FALSE;
            else if (strcmp(arg, "true") == 0)
                v = MG_TRISTATE_TRUE;
            else
                v = (mg_tristate)atoi(arg);
            got = strncmp(step, "set_pdl", 7) == 0 ? mg_set_programmatic_launch(v)
                                                   : mg_set_ssm_tail_midchunk(v);
        } else if (strncmp(step, "setenv:", 7) == 0) {
            char name[64];
            const char *eq = strchr(step + 7, '=');
            if (!eq || (size_t)(eq - (step + 7)) >= sizeof name) {
                fprintf(stderr, "child: bad step %s\n", step);
                return 2;
            }
            memcpy(name, step + 7, (size_t)(eq - (step + 7)));
            name[eq - (step + 7)] = '\0';
            setenv(name, eq + 1, 1);
            continue;
        } else {
            fprintf(stderr, "child: bad step %s\n", step);
            return 2;
        }
        if (got != want) {
            fprintf(stderr, "child: step %d '%s' returned %d\n", i, step, (int)got);
            failures++;
        }
    }
    return failures ? 1 : 0;
}

/* ------------------------------------------------------------------ parent side */

typedef struct scenario {
    const char *name;
    const char *env[4];   /* NAME=value, NULL-terminated */
    const char *steps[8]; /* NULL-terminated */
    int expected_exit;    /* 0, or 1 for the scenario that proves a child can fail */
} scenario;

static const scenario scenarios[] = {
    /* hermetic_enabled: published true, else env exactly "1" */
    {"hermetic default off", {0}, {"hermetic=0", "hermetic=0"}, 0},
    {"hermetic env 1", {"METRALE_HERMETIC=1"}, {"hermetic=1"}, 0},
    {"hermetic env 0", {"METRALE_HERMETIC=0"}, {"hermetic=0"}, 0},
    {"hermetic env true", {"METRALE_HERMETIC=true"}, {"hermetic=0"}, 0},
    {"hermetic env ' 1'", {"METRALE_HERMETIC= 1"}, {"hermetic=0"}, 0},
    {"hermetic env '1 '", {"METRALE_HERMETIC=1 "}, {"hermetic=0"}, 0},
    {"hermetic env 01", {"METRALE_HERMETIC=01"}, {"hermetic=0"}, 0},
    {"hermetic env 11", {"METRALE_HERMETIC=11"}, {"hermetic=0"}, 0},
    {"hermetic env empty", {"METRALE_HERMETIC="}, {"hermetic=0"}, 0},
    {"hermetic set true first", {0}, {"set_hermetic(1)=1", "hermetic=1", "hermetic=1"}, 0},
    {"hermetic set false ignored", {0}, {"set_hermetic(0)=0", "hermetic=0"}, 0},
    {"hermetic set false leaves env",
     {"METRALE_HERMETIC=1"},
     {"set_hermetic(0)=0", "hermetic=1"},
     0},
    {"hermetic set true over env 0",
     {"METRALE_HERMETIC=0"},
     {"set_hermetic(1)=1", "hermetic=1"},
     0},
    {"hermetic set after read too late", {0}, {"hermetic=0", "set_hermetic(1)=0", "hermetic=0"}, 0},
    {"hermetic set twice", {0}, {"set_hermetic(1)=1", "set_hermetic(1)=0", "hermetic=1"}, 0},
    {"hermetic env change after read",
     {0},
     {"hermetic=0", "setenv:METRALE_HERMETIC=1", "hermetic=0"},
     0},
    {"hermetic env read at first call", {0}, {"setenv:METRALE_HERMETIC=1", "hermetic=1"}, 0},

    /* ssm_tail_midchunk_enabled: published value, else true unless env exactly "0" */
    {"midchunk default on", {0}, {"midchunk=1"}, 0},
    {"midchunk env 0", {"METRALE_SSM_TAIL_MIDCHUNK=0"}, {"midchunk=0", "midchunk=0"}, 0},
    {"midchunk env 1", {"METRALE_SSM_TAIL_MIDCHUNK=1"}, {"midchunk=1"}, 0},
    {"midchunk env 00", {"METRALE_SSM_TAIL_MIDCHUNK=00"}, {"midchunk=1"}, 0},
    {"midchunk env ' 0'", {"METRALE_SSM_TAIL_MIDCHUNK= 0"}, {"midchunk=1"}, 0},
    {"midchunk env false", {"METRALE_SSM_TAIL_MIDCHUNK=false"}, {"midchunk=1"}, 0},
    {"midchunk env empty", {"METRALE_SSM_TAIL_MIDCHUNK="}, {"midchunk=1"}, 0},
    {"midchunk --no flag", {0}, {"set_midchunk(false)=1", "midchunk=0"}, 0},
    {"midchunk publish true over env 0",
     {"METRALE_SSM_TAIL_MIDCHUNK=0"},
     {"set_midchunk(true)=1", "midchunk=1"},
     0},
    {"midchunk unset leaves env 0",
     {"METRALE_SSM_TAIL_MIDCHUNK=0"},
     {"set_midchunk(unset)=0", "midchunk=0"},
     0},
    {"midchunk unset leaves default", {0}, {"set_midchunk(unset)=0", "midchunk=1"}, 0},
    {"midchunk invalid enum publishes nothing",
     {"METRALE_SSM_TAIL_MIDCHUNK=0"},
     {"set_midchunk(7)=0", "midchunk=0"},
     0},
    {"midchunk first read wins", {0}, {"midchunk=1", "set_midchunk(false)=0", "midchunk=1"}, 0},
    {"midchunk first read wins env",
     {"METRALE_SSM_TAIL_MIDCHUNK=0"},
     {"midchunk=0", "set_midchunk(true)=0", "midchunk=0"},
     0},
    {"midchunk first publish wins",
     {0},
     {"set_midchunk(false)=1", "set_midchunk(true)=0", "midchunk=0"},
     0},
    {"midchunk unset then publish",
     {0},
     {"set_midchunk(unset)=0", "set_midchunk(false)=1", "midchunk=0"},
     0},

    /* programmatic_launch_enabled: published value, else true unless env exactly "0" */
    {"pdl default on", {0}, {"pdl=1"}, 0},
    {"pdl env 0", {"METRALE_PROGRAMMATIC_LAUNCH=0"}, {"pdl=0", "pdl=0"}, 0},
    {"pdl env off", {"METRALE_PROGRAMMATIC_LAUNCH=off"}, {"pdl=1"}, 0},
    {"pdl --no-pdl", {0}, {"set_pdl(false)=1", "pdl=0"}, 0},
    {"pdl publish true over env 0",
     {"METRALE_PROGRAMMATIC_LAUNCH=0"},
     {"set_pdl(true)=1", "pdl=1"},
     0},
    {"pdl unset leaves env 0", {"METRALE_PROGRAMMATIC_LAUNCH=0"}, {"set_pdl(unset)=0", "pdl=0"}, 0},
    {"pdl invalid enum publishes nothing", {0}, {"set_pdl(9)=0", "pdl=1"}, 0},
    {"pdl first read wins", {0}, {"pdl=1", "set_pdl(false)=0", "pdl=1"}, 0},
    {"pdl cached",
     {"METRALE_PROGRAMMATIC_LAUNCH=0"},
     {"pdl=0", "setenv:METRALE_PROGRAMMATIC_LAUNCH=1", "pdl=0"},
     0},

    /* ssm_tail_ckpt_enabled: env exactly "1" */
    {"ckpt default off", {0}, {"ckpt=0"}, 0},
    {"ckpt env 1", {"METRALE_SSM_TAIL_CKPT=1"}, {"ckpt=1", "ckpt=1"}, 0},
    {"ckpt env 0", {"METRALE_SSM_TAIL_CKPT=0"}, {"ckpt=0"}, 0},
    {"ckpt env true", {"METRALE_SSM_TAIL_CKPT=true"}, {"ckpt=0"}, 0},
    {"ckpt env 01", {"METRALE_SSM_TAIL_CKPT=01"}, {"ckpt=0"}, 0},
    {"ckpt cached",
     {"METRALE_SSM_TAIL_CKPT=1"},
     {"ckpt=1", "setenv:METRALE_SSM_TAIL_CKPT=0", "ckpt=1"},
     0},

    /* the switches are independent cells */
    {"independent cells",
     {"METRALE_HERMETIC=1", "METRALE_SSM_TAIL_MIDCHUNK=0"},
     {"ckpt=0", "midchunk=0", "hermetic=1"},
     0},
    {"independent setters", {0}, {"set_hermetic(1)=1", "midchunk=1", "ckpt=0", "hermetic=1"}, 0},

    /* the harness itself can fail: a wrong expectation must make the child exit 1 */
    {"harness detects a wrong expectation", {0}, {"hermetic=1"}, 1},
};

static void test_env_scenarios(void) {
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
        const scenario *sc = &scenarios[i];
        const char *args[12] = {"child"};
        size_t n = 1;
        for (size_t k = 0; sc->steps[k] && n + 1 < sizeof args / sizeof args[0]; k++)
            args[n++] = sc->steps[k];
        args[n] = NULL;
        if (sc->expected_exit)
            fprintf(stderr, "(scenario '%s' must fail; its child's complaint follows)\n", sc->name);
        int rc = test_run_self(args, "METRALE_", sc->env);
        CHECKF(rc == sc->expected_exit, "scenario '%s': child exit %d, expected %d", sc->name, rc,
               sc->expected_exit);
    }
}

/* ------------------------------------------------------------------ ssm_tail_boundary */

static void check_boundary(uint64_t total, uint64_t bs, bool want_found, uint64_t want) {
    uint64_t got = 0xdeadbeefcafef00dull; /* poison: must stay when there is no boundary */
    bool found = mg_ssm_tail_boundary(total, bs, &got);
    CHECKF(found == want_found, "boundary(%" PRIu64 ", %" PRIu64 ") found=%d", total, bs,
           (int)found);
    if (want_found)
        CHECKF(got == want, "boundary(%" PRIu64 ", %" PRIu64 ") = %" PRIu64 ", want %" PRIu64,
               total, bs, got, want);
    else
        CHECKF(got == 0xdeadbeefcafef00dull,
               "boundary(%" PRIu64 ", %" PRIu64 ") wrote %" PRIu64 " although there is none", total,
               bs, got);
}

/* Independent definition: scan down from total-1 for the largest positive multiple of bs. */
static bool boundary_by_scan(uint64_t total, uint64_t bs, uint64_t *out) {
    if (bs == 0 || total <= bs)
        return false;
    for (uint64_t v = total - 1; v > 0; v--)
        if (v % bs == 0) {
            *out = v;
            return true;
        }
    return false;
}

static void test_boundary(void) {
    /* the specified boundary vectors */
    check_boundary(17, 16, true, 16);
    check_boundary(32, 16, true, 16);
    check_boundary(33, 16, true, 32);
    check_boundary(16, 16, false, 0);
    check_boundary(0, 16, false, 0);
    check_boundary(100, 0, false, 0);
    check_boundary(1, 1, false, 0);
    check_boundary(2, 1, true, 1);
    /* edges: below the block, huge values without overflow */
    check_boundary(15, 16, false, 0);
    check_boundary(0, 0, false, 0);
    check_boundary(UINT64_MAX, 1, true, UINT64_MAX - 1);
    check_boundary(UINT64_MAX, UINT64_MAX, false, 0);
    check_boundary(UINT64_MAX, UINT64_MAX - 1, true, UINT64_MAX - 1);
    check_boundary(UINT64_MAX, (UINT64_MAX - 1) / 2, true, UINT64_MAX - 1);
    check_boundary(UINT64_MAX, 1ull << 63, true, 1ull << 63);
    check_boundary(UINT64_MAX, (1ull << 62), true, 3ull << 62);
    /* NULL out asks only whether one exists */
    CHECK(mg_ssm_tail_boundary(33, 16, NULL));
    CHECK(!mg_ssm_tail_boundary(16, 16, NULL));

    /* against the scan definition on many small random pairs */
    for (int i = 0; i < 20000; i++) {
        uint64_t total = test_rand() % 600;
        uint64_t bs = test_rand() % 70;
        uint64_t want = 0;
        bool want_found = boundary_by_scan(total, bs, &want);
        check_boundary(total, bs, want_found, want);
    }
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "child") == 0)
        return child_main(argc - 2, argv + 2);
    test_seed();
    test_boundary();
    test_env_scenarios();
    return test_finish();
}
