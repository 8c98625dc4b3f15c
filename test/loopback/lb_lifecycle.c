#include "lb.h"
const struct lb_case lb_cases_lifecycle[] = {{NULL, NULL, NULL, 0, 0}};
