/* silu_mul_host.c - the SiLU-and-multiply of one element pair (silu_mul_host.h). */
#include "silu_mul_host.h"

#include <math.h>

#include "metrale/dtype.h"

uint16_t mg_silu_mul_reference_one(uint16_t gate, uint16_t up) {
    float g = mg_bf16_to_f32(gate), u = mg_bf16_to_f32(up);
    float silu = g / (1.0f + expf(-g));
    return mg_f32_to_bf16(silu * u);
}
