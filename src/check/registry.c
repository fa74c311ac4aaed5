/* registry.c - every check group, in the order `metrale-gpu check` runs them. */
#include "check.h"

const mg_check_case *const mg_check_groups[] = {
    NULL,
};
