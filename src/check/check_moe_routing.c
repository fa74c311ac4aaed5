#include "check.h"
const mg_check_case mg_checks_moe_routing[] = {{NULL, NULL, NULL}};
