/* moe_routing_host.c - host checks of an expert routing (moe_routing_host.h). */
#include "moe_routing_host.h"

#include "error.h"

mg_status mg_moe_routing_check_host(const char *name, const int32_t *offsets, uint32_t experts,
                                    uint32_t rows, bool cover_all_rows, const int32_t *token_ids,
                                    uint32_t act_rows) {
    if (offsets) {
        int32_t last = offsets[experts];
        if (offsets[0] != 0 || last < 0 ||
            (cover_all_rows ? (uint32_t)last != rows : (uint32_t)last > rows))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: expert_offsets[0] = %d and expert_offsets[%u] = %d must be 0 and "
                            "%srows = %u",
                            name, offsets[0], experts, last, cover_all_rows ? "" : "at most ",
                            rows);
        for (uint32_t e = 0; e < experts; e++)
            if (offsets[e + 1] < offsets[e])
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                "%s: expert_offsets decrease at expert %u (%d > %d)", name, e,
                                offsets[e], offsets[e + 1]);
    }
    /* Rows past offsets[experts] belong to no expert and are not computed: their ids (e.g. the
     * -1 of pairs mg_moe_sort dropped) are not read. */
    uint32_t routed = offsets ? (uint32_t)offsets[experts] : rows;
    if (token_ids)
        for (uint32_t r = 0; r < routed; r++)
            if (token_ids[r] < 0 || (uint32_t)token_ids[r] >= act_rows)
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                "%s: sorted_token_ids[%u] = %d is outside the %u activation rows",
                                name, r, token_ids[r], act_rows);
    return MG_OK;
}
