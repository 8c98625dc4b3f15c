/* Per-thread connection hints (transport.h): set around connect/accept by callers other
 * than NCCL, read by the transports when they create a comm. */
#include <stddef.h>

#include "transport.h"

static _Thread_local struct mk_conn_hints hints;

void mk_conn_hints_set(const struct mk_conn_hints* h) {
  hints = h ? *h : (struct mk_conn_hints){0};
}

const struct mk_conn_hints* mk_conn_hints_get(void) { return &hints; }
