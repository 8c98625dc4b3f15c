/*
 * The one registry of environment variables. Every variable nccl-mk reads is one line of
 * MK_PARAM_LIST: kind, id, environment name, default, bounds (INT) or choices (STR, "a|b|c",
 * "" = any), and one line of doc. Values are read once, validated (a bad value is a WARN
 * naming the variable, and the default is kept), and printed at NCCL_DEBUG=INFO by
 * mk_param_dump. README's table is generated from this list (scripts/param-doc.sh) and a
 * unit test checks that they agree.
 */
#ifndef MK_PARAM_H_
#define MK_PARAM_H_

#include <stdint.h>

/* X(kind, id, env, default, min, max, choices, doc) */
#define MK_PARAM_LIST(X)                                                                       \
  X(STR, TRANSPORT, "NCCL_MK_TRANSPORT", "auto", 0, 0, "auto|ofi|ib",                          \
    "net plugin transport; auto picks ib when verbs devices are present, else ofi")            \
  X(STR, OFI_PROVIDER, "NCCL_MK_OFI_PROVIDER", "", 0, 0, "",                                   \
    "libfabric provider; empty picks efa when present, else tcp;ofi_rxm")                      \
  X(STR, SOCKET_IFNAME, "NCCL_MK_SOCKET_IFNAME", "", 0, 0, "",                                 \
    "interface for connection setup; empty picks the first non-loopback interface that is up") \
  X(INT, CONNECT_TIMEOUT_MS, "NCCL_MK_CONNECT_TIMEOUT_MS", "30000", 1, 3600000, "",            \
    "give up on a connection handshake after this many milliseconds")                          \
  X(INT, NET_SPEED_MBPS, "NCCL_MK_NET_SPEED_MBPS", "0", 0, 100000000, "",                      \
    "link speed reported to NCCL; 0 reads it from the provider or sysfs")                      \
  X(INT, TIMEOUT_MS, "NCCL_MK_TIMEOUT_MS", "60000", 1, 86400000, "",                           \
    "bound on every wait inside a fused kernel; expiry breaks the communicator")               \
  X(INT, LOCAL_SIZE, "NCCL_MK_LOCAL_SIZE", "0", 0, 1048576, "",                               \
    "ranks per emulated node; 0 = every rank with peer access")                                \
  X(STR, TUNER_FILE, "NCCL_MK_TUNER_FILE", "", 0, 0, "",                                     \
    "tuning file from scripts/tune.sh; empty or unreadable leaves NCCL's own choices")         \
  X(STR, NCCL_DEBUG, "NCCL_DEBUG", "", 0, 0, "",                                               \
    "NCCL's own log level; read so that logging works before NCCL hands us its logger")

enum mk_param_id {
#define MK_PARAM_ENUM(kind, id, env, def, lo, hi, choices, doc) MK_PARAM_##id,
  MK_PARAM_LIST(MK_PARAM_ENUM)
#undef MK_PARAM_ENUM
  MK_PARAM_COUNT
};

int64_t mk_param_int(enum mk_param_id id);
const char* mk_param_str(enum mk_param_id id);
const char* mk_param_env_name(enum mk_param_id id);
/* INFO line per variable with its value and whether it came from the environment. */
void mk_param_dump(void);
/* Tests only: forget the cached values so the next read sees the environment again. */
void mk_param_reload(void);

#endif /* MK_PARAM_H_ */
