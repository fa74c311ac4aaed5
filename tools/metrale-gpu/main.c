/* main.c - the metrale-gpu command line: global options, then one sub-command. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

#include "metrale/comm.h"

typedef int (*mg_command_fn)(int argc, char **argv, const mg_cli_options *opts);

static const struct {
    const char *name;
    mg_command_fn run;
    const char *args;
    const char *summary;
} commands[] = {
    {"info", mg_cmd_info, "",
     "the backends compiled in, which are usable here (and why not), and each device"},
    {"check", mg_cmd_check, "[--skip-tag slow] [FILTER]",
     "the conformance and op checks on the chosen backend (FILTER: group/name substring)"},
    {"arena", mg_cmd_arena,
     "--list | PRESET [--weights W] [--batch N] [--prompt-len N] [--steps N] [--max-chunk-bytes N]",
     "the forward model's arena plan for a preset's run: buffers, offsets, packed vs unpacked"},
    {"run", mg_cmd_run,
     "[--preset NAME] [--batch N] [--prompt-len L] [--steps S] [--compare] [--tp N]",
     "a model-shaped forward pass: prefill then graph-replayed decode, speed vs memory bound"},
    {"bench", mg_cmd_bench, "NAME|all|list [OPTIONS]",
     "time copy, launch, gemm, quantize or attention on the chosen backend (bench list: the "
     "options)"},
};
#define COMMAND_COUNT (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(
        f, "usage: metrale-gpu [OPTIONS] COMMAND [ARGS]\n"
           "\n"
           "options (before or after the command):\n"
           "  --backend cpu|cuda|metal|auto  backend to use (default auto: CUDA, Metal, then CPU)\n"
           "  --device N                     device ordinal (default 0)\n"
           "  --provider OP=NAME             force a provider of an op (repeatable; e.g.\n"
           "                                 gemm_fp8=cublaslt; a wrong NAME lists them)\n"
           "  --json                         machine-readable output where supported (info, arena, "
           "bench)\n"
           "  --help                         this text\n"
           "\n"
           "commands:\n");
    for (size_t i = 0; i < COMMAND_COUNT; i++)
        fprintf(f, "  %s%s%s\n      %s\n", commands[i].name, commands[i].args[0] ? " " : "",
                commands[i].args, commands[i].summary);
    fprintf(f, "\nenvironment: METRALE_CHECK_SEED=N repeats a check run's random inputs.\n");
}

/* When argv[*i] is option `name` ("--name VALUE" or "--name=VALUE"): true, with *value set
 * (NULL when the value is missing) and *i moved past it. */
static bool option_with_value(int argc, char **argv, int *i, const char *name, const char **value) {
    size_t len = strlen(name);
    const char *arg = argv[*i];
    if (strncmp(arg, name, len) != 0 || (arg[len] != '\0' && arg[len] != '='))
        return false;
    if (arg[len] == '=')
        *value = arg + len + 1;
    else
        *value = *i + 1 < argc ? argv[++*i] : NULL;
    return true;
}

mg_status mg_cli_backend_open(const mg_cli_options *opts, mg_backend **out) {
    mg_status st = mg_backend_open(opts->backend, opts->device, out);
    for (int i = 0; !st && i < opts->forced_count; i++)
        if ((st = mg_op_force_provider(*out, opts->forced[i].op, opts->forced[i].name))) {
            mg_backend_close(*out);
            *out = NULL;
        }
    return st;
}

bool mg_cli_parse_tp(const char *v, long *out) {
    char *end = NULL;
    errno = 0;
    const long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < 1 || x > MG_COMM_MAX_RANKS)
        return false;
    *out = x;
    return true;
}

const char *mg_cli_tp_accepted(void) {
    static char text[64];
    snprintf(text, sizeof text, "a device count from 1 to %d", MG_COMM_MAX_RANKS);
    return text;
}

void mg_cli_backends_close(mg_backend **backends, int count) {
    for (int i = count - 1; i >= 0; i--)
        if (backends[i])
            mg_backend_close(backends[i]);
}

mg_status mg_cli_backends_open(const mg_cli_options *opts, int count, mg_backend **out) {
    mg_status st = mg_cli_backend_open(opts, &out[0]);
    if (st) {
        fprintf(stderr, "metrale-gpu run: cannot open the %s backend (device %d): %s\n",
                mg_backend_kind_name(opts->backend), opts->device, mg_last_error());
        return st;
    }
    mg_cli_options rank_opts = *opts;
    rank_opts.backend = mg_backend_get_kind(out[0]); /* --backend auto: the kind it chose */
    for (int i = 1; i < count; i++) {
        rank_opts.device = opts->device + i;
        if ((st = mg_cli_backend_open(&rank_opts, &out[i]))) {
            fprintf(stderr,
                    "metrale-gpu run: --tp %d needs %d %s devices from device %d: device %d: "
                    "%s\n",
                    count, count, mg_backend_kind_name(rank_opts.backend), opts->device,
                    rank_opts.device, mg_last_error());
            mg_cli_backends_close(out, i);
            return st;
        }
    }
    return MG_OK;
}

/* Consumes the global option at argv[*i] (and its value): 1 when it was one, 0 when not,
 * -1 on a bad or missing value (reported). */
static int parse_global_option(int argc, char **argv, int *i, mg_cli_options *opts, bool *help) {
    const char *arg = argv[*i], *value;
    if (option_with_value(argc, argv, i, "--backend", &value)) {
        if (!value || mg_backend_kind_parse(value, &opts->backend) != MG_OK) {
            fprintf(stderr, "metrale-gpu: --backend '%s': expected cpu, cuda, metal or auto\n",
                    value ? value : "");
            return -1;
        }
        return 1;
    }
    if (option_with_value(argc, argv, i, "--device", &value)) {
        char *end = NULL;
        long device = value ? strtol(value, &end, 10) : -1;
        if (!value || !*value || *end || device < 0 || device > 1024) {
            fprintf(stderr, "metrale-gpu: --device '%s': expected a device ordinal\n",
                    value ? value : "");
            return -1;
        }
        opts->device = (int)device;
        return 1;
    }
    if (option_with_value(argc, argv, i, "--provider", &value)) {
        const char *eq = value ? strchr(value, '=') : NULL;
        char op_name[48];
        mg_op op;
        int n = (int)sizeof opts->forced / (int)sizeof opts->forced[0];
        if (!eq || eq == value || !eq[1] || (size_t)(eq - value) >= sizeof op_name ||
            strlen(eq + 1) >= sizeof opts->forced[0].name) {
            fprintf(stderr,
                    "metrale-gpu: --provider '%s': expected OP=PROVIDER (e.g. "
                    "gemm_fp8=cublaslt)\n",
                    value ? value : "");
            return -1;
        }
        memcpy(op_name, value, (size_t)(eq - value));
        op_name[eq - value] = 0;
        if (mg_op_parse(op_name, &op) != MG_OK) {
            fprintf(stderr, "metrale-gpu: --provider '%s': no op named '%s'\n", value, op_name);
            return -1;
        }
        if (opts->forced_count == n) {
            fprintf(stderr, "metrale-gpu: --provider: at most %d\n", n);
            return -1;
        }
        opts->forced[opts->forced_count].op = op;
        snprintf(opts->forced[opts->forced_count].name, sizeof opts->forced[0].name, "%s", eq + 1);
        opts->forced_count++;
        return 1;
    }
    if (!strcmp(arg, "--json")) {
        opts->json = true;
        return 1;
    }
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
        *help = true;
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    mg_cli_options opts = {.backend = MG_BACKEND_AUTO, .device = 0, .json = false};
    bool help = false;
    /* Global options are removed wherever they appear; what remains is the command and its
     * own arguments, in order. */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int rest_count = 0;
    if (!rest) {
        fprintf(stderr, "metrale-gpu: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        int took = parse_global_option(argc, argv, &i, &opts, &help);
        if (took < 0) {
            free(rest);
            return 2;
        }
        if (took == 0) {
            if (rest_count == 0 && argv[i][0] == '-') {
                fprintf(stderr, "metrale-gpu: unknown option '%s'\n\n", argv[i]);
                usage(stderr);
                free(rest);
                return 2;
            }
            rest[rest_count++] = argv[i];
        }
    }
    int status;
    if (help) {
        usage(stdout);
        status = 0;
    } else if (rest_count == 0) {
        usage(stderr);
        status = 2;
    } else {
        status = -1;
        for (size_t i = 0; i < COMMAND_COUNT && status < 0; i++)
            if (!strcmp(rest[0], commands[i].name))
                status = commands[i].run(rest_count, rest, &opts);
        if (status < 0) {
            fprintf(stderr, "metrale-gpu: unknown command '%s'\n\n", rest[0]);
            usage(stderr);
            status = 2;
        }
    }
    free(rest);
    return status;
}
