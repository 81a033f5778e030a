/* Header checks of the control-block files; NULL means valid, else why not. */
#ifndef GW_CBCHECK_H
#define GW_CBCHECK_H

#include <stddef.h>

#include "gpuwarden_abi.h"

const char *gw_usage_check(const void *p, size_t n);
const char *gw_limits_check_header(const void *p, size_t n);

#endif
