#include "lb.h"
const struct lb_case lb_cases_onesided[] = {{NULL, NULL, NULL, 0, 0}};
