/* version.c - the API version the library was built with (metrale/gpu.h). */
#include "metrale/gpu.h"

uint32_t mg_api_version(void) {
    return MG_API_VERSION;
}
