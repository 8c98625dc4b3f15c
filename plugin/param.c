#include "mk_param.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mk_log.h"

enum mk_param_kind { MK_PARAM_KIND_INT, MK_PARAM_KIND_STR };

struct mk_param_def {
  enum mk_param_kind kind;
  const char* env;
  const char* def;
  int64_t lo, hi;
  const char* choices;
  const char* doc;
};

static const struct mk_param_def param_defs[MK_PARAM_COUNT] = {
#define MK_PARAM_DEF(kind, id, env, def, lo, hi, choices, doc) \
  [MK_PARAM_##id] = {MK_PARAM_KIND_##kind, env, def, lo, hi, choices, doc},
    MK_PARAM_LIST(MK_PARAM_DEF)
#undef MK_PARAM_DEF
};

struct mk_param_value {
  int64_t i;
  char s[256];
  int from_env;
};

static struct mk_param_value param_values[MK_PARAM_COUNT];
static pthread_once_t param_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t param_lock = PTHREAD_MUTEX_INITIALIZER;

/* "a|b|c" contains word? */
static int choice_allowed(const char* choices, const char* word) {
  size_t n = strlen(word);
  for (const char* p = choices; *p;) {
    const char* end = strchr(p, '|');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && strncasecmp(p, word, n) == 0) return 1;
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

static int parse_int(const char* text, int64_t lo, int64_t hi, int64_t* out) {
  char* end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 0);
  if (errno || end == text || *end != '\0' || v < lo || v > hi) return -EINVAL;
  *out = v;
  return 0;
}

/* Parses text into slot; on a bad value keeps nothing and returns -EINVAL. */
static int param_set(const struct mk_param_def* d, struct mk_param_value* v, const char* text) {
  if (strlen(text) >= sizeof(v->s)) return -EINVAL;
  if (d->kind == MK_PARAM_KIND_INT) return parse_int(text, d->lo, d->hi, &v->i);
  if (d->choices[0] && !choice_allowed(d->choices, text)) return -EINVAL;
  strcpy(v->s, text);
  return 0;
}

static void param_load_all(void) {
  for (int id = 0; id < MK_PARAM_COUNT; id++) {
    const struct mk_param_def* d = &param_defs[id];
    struct mk_param_value* v = &param_values[id];
    memset(v, 0, sizeof(*v));
    param_set(d, v, d->def);
    const char* env = getenv(d->env);
    if (!env) continue;
    if (param_set(d, v, env) == 0) {
      v->from_env = 1;
    } else if (d->kind == MK_PARAM_KIND_INT) {
      MK_WARN("%s=\"%s\" is not an integer in [%lld, %lld]; using the default %s", d->env, env,
              (long long)d->lo, (long long)d->hi, d->def);
    } else {
      MK_WARN("%s=\"%s\" is not one of %s; using the default \"%s\"", d->env, env, d->choices,
              d->def);
    }
  }
}

static void param_init_once(void) { param_load_all(); }

int64_t mk_param_int(enum mk_param_id id) {
  pthread_once(&param_once, param_init_once);
  return param_values[id].i;
}

const char* mk_param_str(enum mk_param_id id) {
  pthread_once(&param_once, param_init_once);
  return param_values[id].s;
}

const char* mk_param_env_name(enum mk_param_id id) { return param_defs[id].env; }

void mk_param_dump(void) {
  pthread_once(&param_once, param_init_once);
  for (int id = 0; id < MK_PARAM_COUNT; id++) {
    const struct mk_param_def* d = &param_defs[id];
    const struct mk_param_value* v = &param_values[id];
    if (d->kind == MK_PARAM_KIND_INT)
      MK_INFO(MK_NCCL_SUBSYS_ENV, "%s=%lld%s", d->env, (long long)v->i,
              v->from_env ? " (from environment)" : "");
    else
      MK_INFO(MK_NCCL_SUBSYS_ENV, "%s=\"%s\"%s", d->env, v->s,
              v->from_env ? " (from environment)" : "");
  }
}

void mk_param_reload(void) {
  pthread_once(&param_once, param_init_once);
  pthread_mutex_lock(&param_lock);
  param_load_all();
  pthread_mutex_unlock(&param_lock);
}
