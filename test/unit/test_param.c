/* The parameter registry: defaults, valid overrides, and rejection of bad values. */
#include <stdlib.h>

#include "mk_param.h"
#include "mk_test.h"

static void defaults_apply_without_environment(void) {
  unsetenv("NCCL_MK_TRANSPORT");
  unsetenv("NCCL_MK_CONNECT_TIMEOUT_MS");
  mk_param_reload();
  CHECK_STR(mk_param_str(MK_PARAM_TRANSPORT), "auto");
  CHECK_EQ(mk_param_int(MK_PARAM_CONNECT_TIMEOUT_MS), 30000);
}

static void valid_values_override_defaults(void) {
  setenv("NCCL_MK_TRANSPORT", "ofi", 1);
  setenv("NCCL_MK_CONNECT_TIMEOUT_MS", "0x10", 1);
  mk_param_reload();
  CHECK_STR(mk_param_str(MK_PARAM_TRANSPORT), "ofi");
  CHECK_EQ(mk_param_int(MK_PARAM_CONNECT_TIMEOUT_MS), 16);
}

static void bad_values_keep_the_default(void) {
  setenv("NCCL_MK_TRANSPORT", "carrier-pigeon", 1);
  setenv("NCCL_MK_CONNECT_TIMEOUT_MS", "12abc", 1);
  mk_param_reload();
  CHECK_STR(mk_param_str(MK_PARAM_TRANSPORT), "auto");
  CHECK_EQ(mk_param_int(MK_PARAM_CONNECT_TIMEOUT_MS), 30000);

  setenv("NCCL_MK_CONNECT_TIMEOUT_MS", "0", 1); /* below the minimum of 1 */
  mk_param_reload();
  CHECK_EQ(mk_param_int(MK_PARAM_CONNECT_TIMEOUT_MS), 30000);

  setenv("NCCL_MK_CONNECT_TIMEOUT_MS", "99999999999999999999", 1); /* overflows */
  mk_param_reload();
  CHECK_EQ(mk_param_int(MK_PARAM_CONNECT_TIMEOUT_MS), 30000);
}

static void choices_match_case_insensitively(void) {
  setenv("NCCL_MK_TRANSPORT", "OFI", 1);
  mk_param_reload();
  CHECK_STR(mk_param_str(MK_PARAM_TRANSPORT), "OFI");
}

static void env_names_carry_the_prefix(void) {
  for (int id = 0; id < MK_PARAM_COUNT; id++) {
    const char* name = mk_param_env_name(id);
    CHECK(strncmp(name, "NCCL_MK_", 8) == 0 || strcmp(name, "NCCL_DEBUG") == 0);
  }
}

int main(void) {
  defaults_apply_without_environment();
  valid_values_override_defaults();
  bad_values_keep_the_default();
  choices_match_case_insensitively();
  env_names_carry_the_prefix();
  return MK_TEST_RESULT();
}
