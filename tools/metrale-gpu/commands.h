/* commands.h - the sub-commands of metrale-gpu; each returns the process exit status. */
#ifndef METRALE_CLI_COMMANDS_H
#define METRALE_CLI_COMMANDS_H

#include <stdbool.h>

#include "metrale/gpu.h"
#include "metrale/ops.h"

typedef struct mg_cli_options {
    mg_backend_kind backend; /* --backend cpu|cuda|metal|auto (default auto) */
    int device;              /* --device N (default 0) */
    bool json;               /* --json: machine-readable output where supported */
    /* --provider OP=NAME (repeatable): providers forced on the backend the command opens */
    int forced_count;
    struct {
        mg_op op;
        char name[32];
    } forced[8];
} mg_cli_options;

/* Opens the backend the options name and forces their providers on it (main.c). On failure
 * the backend is closed and the status returned with mg_last_error set. */
mg_status mg_cli_backend_open(const mg_cli_options *opts, mg_backend **out);
/* `run --tp N`: that backend and the next N - 1 devices of its kind (devices opts->device ..
 * opts->device + N - 1, each with the forced providers) into out[0..N); on failure a message
 * on stderr naming the device that did not open (fewer devices than N included), nothing left
 * open, and the status. mg_cli_backends_close closes them, the last first. */
mg_status mg_cli_backends_open(const mg_cli_options *opts, int count, mg_backend **out);
void mg_cli_backends_close(mg_backend **backends, int count);
/* `run --tp N`'s value (both forms of run): a device count from 1 to MG_COMM_MAX_RANKS into
 * *out; false (nothing printed) otherwise. mg_cli_tp_accepted: what it takes, for the message
 * ("a device count from 1 to 64"). */
bool mg_cli_parse_tp(const char *v, long *out);
const char *mg_cli_tp_accepted(void);

/* argv[0] is the sub-command name; global options are already removed. */
int mg_cmd_info(int argc, char **argv, const mg_cli_options *opts);
int mg_cmd_check(int argc, char **argv, const mg_cli_options *opts);
int mg_cmd_bench(int argc, char **argv, const mg_cli_options *opts);
/* metrale-gpu arena --list | <preset> [--fp8] [--max-chunk-bytes N]: every buffer of a
 * preset's arena plan (bytes, alignment, lifetime, chunk, offset), the unpacked total, the
 * packed size, their ratio and the peak-live lower bound; --json prints one object. Needs
 * no device. */
int mg_cmd_arena(int argc, char **argv, const mg_cli_options *opts);
/* metrale-gpu run [--preset NAME] [--batch N] [--prompt-len L] [--steps S] [--compare]: a
 * decoder forward pass (prefill, then decode steps) of a preset with random weights, and its
 * speed against the memory-bound limit (cmd_run.c). */
int mg_cmd_run(int argc, char **argv, const mg_cli_options *opts);
/* metrale-gpu run --model FILE --prompt-ids IDS [--steps N | --teacher-force IDS]
 * [--top-logits K]: a real checkpoint (cmd_run_model.c); mg_cmd_run hands over to it. */
int mg_cmd_run_model(int argc, char **argv, const mg_cli_options *opts);

#endif
