/*
 * moe_routing_host.h - private to src/ops: the checks of an expert routing in host memory that
 * the CPU references of the grouped GEMMs make (nvfp4_gemm_reference.c, moe_gemm_reference.c).
 * The CUDA kernels cannot make them without a synchronisation and clamp instead.
 */
#ifndef METRALE_MOE_ROUTING_HOST_H
#define METRALE_MOE_ROUTING_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "metrale/status.h"

/* expert_offsets (experts + 1 entries, NULL: none) start at 0, never decrease and end at
 * `rows` (cover_all_rows) or at most there; every entry of token_ids (rows entries, NULL: none)
 * lies in [0, act_rows). MG_ERR_INVALID_ARGUMENT naming `name` and the first bad entry. */
mg_status mg_moe_routing_check_host(const char *name, const int32_t *offsets, uint32_t experts,
                                    uint32_t rows, bool cover_all_rows, const int32_t *token_ids,
                                    uint32_t act_rows);

#endif
