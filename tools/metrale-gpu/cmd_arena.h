/* cmd_arena.h - `metrale-gpu arena`: the buffer-arena plan of a built-in model preset. */
#ifndef METRALE_CLI_CMD_ARENA_H
#define METRALE_CLI_CMD_ARENA_H

#include "commands.h"

/* metrale-gpu arena --list
 * metrale-gpu arena <preset> [--fp8] [--max-chunk-bytes N]
 * Prints every buffer (bytes, alignment, lifetime, chunk, offset) and the unpacked total,
 * the packed arena size, their ratio and the peak-live lower bound; --json (global option)
 * prints the same as one JSON object. Needs no device. argv[0] is "arena". */
int mg_cmd_arena(int argc, char **argv, const mg_cli_options *opts);

#endif
