/* config.c: beed's flags and config file.
 *
 * One table names every setting.  A flag is "--name VALUE" (or
 * "--name=VALUE"); a config line is "name = VALUE" with the same names.
 * Both go through apply(), so a value means the same in either place.  The
 * parse is pure: it fills a bee_config and an error line and leaves
 * printing and exiting to main().
 */
#include "averager.h"
#include "bee.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum opt_id {
  O_LISTEN,
  O_JOIN,
  O_ANNOUNCE,
  O_IDENTITY,
  O_MODERATOR,
  O_TOKEN,
  O_SWARM,
  O_OPEN,
  O_REVOCATIONS,
  O_CONFIG,
  O_LOG_LEVEL,
  O_MAX_CONNS,
  O_NO_LISTEN,
  O_NO_MATCH_AHEAD,
  O_COMPRESSION,
  O_CLIP,
  O_BANDWIDTH,
  O_ERROR_FEEDBACK,
  O_CLIENT,
  O_STATUS_INTERVAL,
  O_REVOCATION_INTERVAL,
  O_RUN_ID,
  O_MODEL,
  O_DATA,
  O_BATCHNORM,
  O_AUGMENT,
  O_DEPTH,
  O_WIDTH,
  O_TOKENS,
  O_VAL_TOKENS,
  O_VOCAB,
  O_CTX,
  O_LAYERS,
  O_HEADS,
  O_EMBD,
  O_BATCH_SIZE,
  O_TARGET_BATCH_SIZE,
  O_LR,
  O_OPTIMIZER,
  O_AVERAGING,
  O_INNER_STEPS,
  O_OUTER_LR,
  O_OUTER_MOMENTUM,
  O_AVERAGE_STATE_EVERY,
  O_MATCHMAKING_TIME,
  O_MIN_PEERS,
  O_GROUP_SIZE,
  O_DELAY_AVERAGING,
  O_LABEL,
  O_THREADS,
  O_DEVICE,
  O_PRECISION,
  O_LOSS_SCALE,
  O_EVAL_EVERY,
  O_CHECKPOINT_DIR,
  O_CHECKPOINT_EVERY,
  O_KEEP_CHECKPOINTS,
  O_RESUME,
  O_CONTROL,
  O_TRAINER_SOCKET,
  O_PEERS_FILE,
  O_MAX_STATE_UPLOADS,
  O_LR_SCHEDULE,
  O_WARMUP_EPOCHS,
  O_TOTAL_EPOCHS,
  O_MIN_LR,
  O_CHECK,
  O_HELP,
  O_VERSION,
};

enum opt_kind {
  K_VALUE, /* takes a value */
  K_BOOL,  /* a flag sets it; a config line says true or false */
  K_ACTION /* --help, --version: command line only */
};

static const struct opt {
  const char *name;
  int id;
  int kind;
  bool in_file; /* allowed in a config file */
} opts[] = {
    {"listen", O_LISTEN, K_VALUE, true},
    {"join", O_JOIN, K_VALUE, true},
    {"announce", O_ANNOUNCE, K_VALUE, true},
    {"identity", O_IDENTITY, K_VALUE, true},
    {"moderator", O_MODERATOR, K_VALUE, true},
    {"token", O_TOKEN, K_VALUE, true},
    {"swarm", O_SWARM, K_VALUE, true},
    {"open", O_OPEN, K_BOOL, true},
    {"revocations", O_REVOCATIONS, K_VALUE, true},
    {"config", O_CONFIG, K_VALUE, false},
    {"log-level", O_LOG_LEVEL, K_VALUE, true},
    {"max-conns", O_MAX_CONNS, K_VALUE, true},
    {"no-listen", O_NO_LISTEN, K_BOOL, true},
    {"client", O_CLIENT, K_BOOL, true},
    {"status-interval", O_STATUS_INTERVAL, K_VALUE, true},
    {"revocation-interval", O_REVOCATION_INTERVAL, K_VALUE, true},
    {"run-id", O_RUN_ID, K_VALUE, true},
    {"model", O_MODEL, K_VALUE, true},
    {"data", O_DATA, K_VALUE, true},
    {"batchnorm", O_BATCHNORM, K_BOOL, true},
    {"augment", O_AUGMENT, K_BOOL, true},
    {"depth", O_DEPTH, K_VALUE, true},
    {"width", O_WIDTH, K_VALUE, true},
    {"tokens", O_TOKENS, K_VALUE, true},
    {"val-tokens", O_VAL_TOKENS, K_VALUE, true},
    {"vocab", O_VOCAB, K_VALUE, true},
    {"ctx", O_CTX, K_VALUE, true},
    {"layers", O_LAYERS, K_VALUE, true},
    {"heads", O_HEADS, K_VALUE, true},
    {"embd", O_EMBD, K_VALUE, true},
    {"batch-size", O_BATCH_SIZE, K_VALUE, true},
    {"target-batch-size", O_TARGET_BATCH_SIZE, K_VALUE, true},
    {"lr", O_LR, K_VALUE, true},
    {"optimizer", O_OPTIMIZER, K_VALUE, true},
    {"lr-schedule", O_LR_SCHEDULE, K_VALUE, true},
    {"warmup-epochs", O_WARMUP_EPOCHS, K_VALUE, true},
    {"total-epochs", O_TOTAL_EPOCHS, K_VALUE, true},
    {"min-lr", O_MIN_LR, K_VALUE, true},
    {"averaging", O_AVERAGING, K_VALUE, true},
    {"inner-steps", O_INNER_STEPS, K_VALUE, true},
    {"outer-lr", O_OUTER_LR, K_VALUE, true},
    {"outer-momentum", O_OUTER_MOMENTUM, K_VALUE, true},
    {"average-state-every", O_AVERAGE_STATE_EVERY, K_VALUE, true},
    {"matchmaking-time", O_MATCHMAKING_TIME, K_VALUE, true},
    {"min-peers", O_MIN_PEERS, K_VALUE, true},
    {"group-size", O_GROUP_SIZE, K_VALUE, true},
    {"max-state-uploads", O_MAX_STATE_UPLOADS, K_VALUE, true},
    {"delay-averaging", O_DELAY_AVERAGING, K_BOOL, true},
    {"no-match-ahead", O_NO_MATCH_AHEAD, K_BOOL, true},
    {"compression", O_COMPRESSION, K_VALUE, true},
    {"clip", O_CLIP, K_VALUE, true},
    {"bandwidth", O_BANDWIDTH, K_VALUE, true},
    {"error-feedback", O_ERROR_FEEDBACK, K_BOOL, true},
    {"label", O_LABEL, K_VALUE, true},
    {"threads", O_THREADS, K_VALUE, true},
    {"device", O_DEVICE, K_VALUE, true},
    {"precision", O_PRECISION, K_VALUE, true},
    {"loss-scale", O_LOSS_SCALE, K_VALUE, true},
    {"eval-every", O_EVAL_EVERY, K_VALUE, true},
    {"checkpoint-dir", O_CHECKPOINT_DIR, K_VALUE, true},
    {"checkpoint-every", O_CHECKPOINT_EVERY, K_VALUE, true},
    {"keep-checkpoints", O_KEEP_CHECKPOINTS, K_VALUE, true},
    {"resume", O_RESUME, K_BOOL, true},
    {"control", O_CONTROL, K_VALUE, true},
    {"trainer-socket", O_TRAINER_SOCKET, K_VALUE, true},
    {"peers-file", O_PEERS_FILE, K_VALUE, true},
    {"check", O_CHECK, K_BOOL, false},
    {"help", O_HELP, K_ACTION, false},
    {"version", O_VERSION, K_ACTION, false},
};
#define NOPTS (sizeof opts / sizeof opts[0])

/* Finds the option called name[0..len). */
static const struct opt *opt_find(const char *name, size_t len) {
  for (size_t i = 0; i < NOPTS; i++)
    if (strlen(opts[i].name) == len && memcmp(opts[i].name, name, len) == 0)
      return &opts[i];
  return NULL;
}

int bee_failf(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

void bee_config_init(bee_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  snprintf(cfg->listen, sizeof cfg->listen, "%s", BEE_DEFAULT_LISTEN);
  snprintf(cfg->identity, sizeof cfg->identity, "%s", BEE_DEFAULT_IDENTITY);
  snprintf(cfg->swarm, sizeof cfg->swarm, "%s", BEE_DEFAULT_SWARM);
  cfg->log_level = BEE_LOG_INFO;
  cfg->max_conns = BEE_DEFAULT_MAX_CONNS;
  cfg->status_interval_s = BEE_DEFAULT_STATUS_S;
  cfg->revocation_interval_s = 30;
  snprintf(cfg->model, sizeof cfg->model, "mlp");
  snprintf(cfg->data, sizeof cfg->data, "%s", BEE_DEFAULT_DATA);
  cfg->batch_size = BEE_DEFAULT_BATCH;
  cfg->target_batch_size = BEE_DEFAULT_TARGET_BATCH;
  cfg->optimizer = BEE_OPT_SGD;
  cfg->averaging = BEE_AVG_GRADIENTS;
  cfg->compression = AVG_NONE;
  cfg->clip = BEE_CLIP_AUTO;
  cfg->outer_momentum = -1;
  cfg->matchmaking_s = BEE_DEFAULT_MATCHMAKING_S;
  cfg->min_peers = 1;
  cfg->max_state_uploads = BEE_DEFAULT_STATE_UPLOADS;
  cfg->threads = 1;
  snprintf(cfg->device, sizeof cfg->device, "auto");
  snprintf(cfg->precision, sizeof cfg->precision, "fp32");
  cfg->eval_every = 1;
  cfg->checkpoint_every = 1;
  cfg->keep_checkpoints = 3;
}

double bee_config_lr(const bee_config *cfg) {
  if (cfg->lr > 0)
    return cfg->lr;
  return cfg->optimizer == BEE_OPT_SGD ? BEE_DEFAULT_LR : 1e-3;
}

unsigned bee_config_inner_steps(const bee_config *cfg) {
  return cfg->inner_steps ? cfg->inner_steps : BEE_DEFAULT_INNER_STEPS;
}

double bee_config_outer_lr(const bee_config *cfg) {
  return cfg->outer_lr > 0 ? cfg->outer_lr : BEE_DEFAULT_OUTER_LR;
}

double bee_config_outer_momentum(const bee_config *cfg) {
  return cfg->outer_momentum >= 0 ? cfg->outer_momentum
                                  : BEE_DEFAULT_OUTER_MOMENTUM;
}

/* The names of the BEE_OPT_*, BEE_AVG_* and BEE_SCHED_* values, from the
 * first value on (1, 1 and 0). */
static const char *const optimizer_names[] = {"sgd", "adamw", "lamb", NULL};
static const char *const averaging_names[] = {"gradients", "diloco", NULL};
static const char *const schedule_names[] = {"constant", "cosine", "linear",
                                             NULL};

/* v's place among names, or -1. */
static int name_index(const char *v, const char *const *names) {
  for (int i = 0; names[i]; i++)
    if (strcmp(v, names[i]) == 0)
      return i;
  return -1;
}

const char *bee_optimizer_name(int optimizer) {
  return optimizer >= BEE_OPT_SGD && optimizer <= BEE_OPT_LAMB
             ? optimizer_names[optimizer - BEE_OPT_SGD]
             : "sgd";
}

const char *bee_averaging_name(int averaging) {
  return averaging == BEE_AVG_DILOCO ? averaging_names[1] : averaging_names[0];
}

const char *bee_schedule_name(int schedule) {
  return schedule >= BEE_SCHED_CONSTANT && schedule <= BEE_SCHED_LINEAR
             ? schedule_names[schedule]
             : "constant";
}

/* ---- values ------------------------------------------------------------ */

/* Parses a decimal number in lo..hi: digits only, no sign or spaces. */
static int parse_uint(const char *s, unsigned long lo, unsigned long hi,
                      unsigned *out) {
  if (!isdigit((unsigned char)s[0]) || strlen(s) > 10)
    return BEE_ECONFIG;
  for (const char *p = s; *p; p++)
    if (!isdigit((unsigned char)*p))
      return BEE_ECONFIG;
  unsigned long v = strtoul(s, NULL, 10);
  if (v < lo || v > hi)
    return BEE_ECONFIG;
  *out = (unsigned)v;
  return 0;
}

/* Parses a finite decimal number in [lo, hi]. */
static int parse_real(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double x = strtod(s, &end);
  if (end == s || *end || errno || !isfinite(x) || x < lo || x > hi)
    return BEE_ECONFIG;
  *out = x;
  return 0;
}

/* A loss scale: 2^E with E in -24..127, or a decimal power of two from 1
 * to 2^31 (trn_loss_scale_parse's S: this library does not link the
 * trainer, and test-daemon-config holds the two to the same cases). */
static int parse_scale(const char *s, float *out) {
  unsigned u;
  if (s[0] == '2' && s[1] == '^') {
    bool neg = s[2] == '-';
    if ((s[2 + neg] == '0' && s[3 + neg] != '\0') ||
        parse_uint(s + 2 + neg, 0, neg ? 24 : 127, &u))
      return BEE_ECONFIG;
    *out = ldexpf(1.0f, neg ? -(int)u : (int)u);
    return 0;
  }
  if (s[0] == '0' || parse_uint(s, 1, 1ul << 31, &u) || (u & (u - 1)))
    return BEE_ECONFIG;
  *out = (float)u;
  return 0;
}

static bool valid_hostname(const char *h) {
  size_t n = strlen(h), label = 0;
  if (n == 0 || n > BEE_HOST_MAX - 1)
    return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)h[i];
    if (ch == '.') {
      if (label == 0)
        return false;
      label = 0;
    } else if (isalnum(ch) || ch == '-' || ch == '_') {
      if (++label > 63)
        return false;
    } else {
      return false;
    }
  }
  return true;
}

int bee_addr_parse(const char *s, bool listen, char *host, size_t hostcap,
                   unsigned *port) {
  const char *colon, *h = s;
  size_t hlen;
  bool v6 = false;
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':')
      return BEE_ECONFIG;
    h = s + 1;
    hlen = (size_t)(close - h);
    colon = close + 1;
    v6 = true;
  } else {
    colon = strrchr(s, ':');
    if (!colon)
      return BEE_ECONFIG;
    hlen = (size_t)(colon - s);
    if (memchr(s, ':', hlen)) /* an IPv6 address needs its brackets */
      return BEE_ECONFIG;
  }
  if (hlen >= hostcap || hlen >= BEE_HOST_MAX)
    return BEE_ECONFIG;
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  if (parse_uint(colon + 1, listen ? 0 : 1, 65535, port))
    return BEE_ECONFIG;

  unsigned char bin[16];
  if (v6)
    return inet_pton(AF_INET6, host, bin) == 1 ? 0 : BEE_ECONFIG;
  if (hlen == 0)
    return listen ? 0 : BEE_ECONFIG;
  if (inet_pton(AF_INET, host, bin) == 1)
    return 0;
  if (listen)
    return BEE_ECONFIG; /* listening needs a numeric address */
  /* Four dotted numbers that are not an IPv4 address are a typo, not a
   * host name. */
  bool numeric = true;
  for (const char *p = host; *p; p++)
    if (!isdigit((unsigned char)*p) && *p != '.')
      numeric = false;
  return !numeric && valid_hostname(host) ? 0 : BEE_ECONFIG;
}

static int parse_hex32(const char *s, uint8_t out[PROTO_PK_BYTES]) {
  if (strlen(s) != 2 * PROTO_PK_BYTES)
    return BEE_ECONFIG;
  for (size_t i = 0; i < PROTO_PK_BYTES; i++) {
    int v = 0;
    for (int j = 0; j < 2; j++) {
      int c = (unsigned char)s[2 * i + (size_t)j], d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        return BEE_ECONFIG;
      v = v << 4 | d;
    }
    out[i] = (uint8_t)v;
  }
  return 0;
}

static int set_path(char *dst, const char *v, char *msg, size_t cap) {
  size_t n = strlen(v);
  if (n == 0)
    return bee_failf(msg, cap, BEE_ECONFIG, "empty file name");
  if (n >= BEE_PATH_MAX)
    return bee_failf(msg, cap, BEE_ECONFIG, "file name longer than %d bytes",
                BEE_PATH_MAX - 1);
  memcpy(dst, v, n + 1);
  return 0;
}

/* Sets one option from its text value.  On failure msg (cap bytes) says
 * what is wrong with the value, without naming the option. */
static int apply(bee_config *cfg, const struct opt *o, const char *v, char *msg,
                 size_t cap) {
  char host[BEE_HOST_MAX];
  unsigned u;
  int i;
  switch (o->id) {
  case O_LISTEN:
  case O_JOIN: {
    bool listen = o->id == O_LISTEN;
    if (strlen(v) >= BEE_ADDR_MAX ||
        bee_addr_parse(v, listen, host, sizeof host, &u))
      return bee_failf(msg, cap, BEE_ECONFIG, "bad address '%.80s' (want %s)", v,
                  listen ? "ADDR:PORT, [V6ADDR]:PORT or :PORT"
                         : "HOST:PORT or [V6ADDR]:PORT");
    if (listen) {
      snprintf(cfg->listen, sizeof cfg->listen, "%s", v);
      return 0;
    }
    if (cfg->njoin >= BEE_JOIN_MAX)
      return bee_failf(msg, cap, BEE_ECONFIG, "more than %d join targets",
                  BEE_JOIN_MAX);
    snprintf(cfg->join[cfg->njoin++], BEE_ADDR_MAX, "%s", v);
    return 0;
  }
  case O_ANNOUNCE:
    if (strlen(v) >= BEE_ADDR_MAX ||
        bee_addr_parse(v, false, host, sizeof host, &u) || u == 0)
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad address '%.80s' (want HOST:PORT or "
                       "[V6ADDR]:PORT)",
                       v);
    if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0)
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "'%.80s' is no address a peer can dial (it means "
                       "every address of this host)",
                       v);
    if (cfg->nannounce >= BEE_ANNOUNCE_MAX)
      return bee_failf(msg, cap, BEE_ECONFIG, "more than %d --announce",
                       BEE_ANNOUNCE_MAX);
    snprintf(cfg->announce[cfg->nannounce++], BEE_ADDR_MAX, "%s", v);
    return 0;
  case O_IDENTITY: return set_path(cfg->identity, v, msg, cap);
  case O_TOKEN: return set_path(cfg->token, v, msg, cap);
  case O_REVOCATIONS: return set_path(cfg->revocations, v, msg, cap);
  case O_CONFIG: return set_path(cfg->config, v, msg, cap);
  case O_MODERATOR:
    if (parse_hex32(v, cfg->moderator_pk))
      return bee_failf(msg, cap, BEE_ECONFIG,
                  "bad public key '%.80s' (want %d hex digits)", v,
                  2 * PROTO_PK_BYTES);
    cfg->moderated = true;
    return 0;
  case O_SWARM:
    if (!proto_swarm_valid(v))
      return bee_failf(msg, cap, BEE_ECONFIG,
                  "bad swarm name '%.80s' (want 1..%d of A-Z a-z 0-9 . _ -)", v,
                  PROTO_SWARM_MAX);
    snprintf(cfg->swarm, sizeof cfg->swarm, "%s", v);
    return 0;
  case O_LOG_LEVEL:
    if (bee_log_level_parse(v, &cfg->log_level))
      return bee_failf(msg, cap, BEE_ECONFIG,
                  "bad log level '%.80s' (want error, warn, info or debug)", v);
    return 0;
  case O_MAX_CONNS:
    if (parse_uint(v, 1, 65536, &u))
      return bee_failf(msg, cap, BEE_ECONFIG, "bad number '%.80s' (want 1..65536)",
                  v);
    cfg->max_conns = u;
    return 0;
  case O_REVOCATION_INTERVAL:
  case O_STATUS_INTERVAL: {
    unsigned min = o->id == O_STATUS_INTERVAL ? 0 : 1; /* 0: no status */
    if (parse_uint(v, min, BEE_STATUS_MAX_S, &u))
      return bee_failf(msg, cap, BEE_ECONFIG,
                  "bad number '%.80s' (want seconds, %u..%d)", v, min,
                  BEE_STATUS_MAX_S);
    if (o->id == O_STATUS_INTERVAL)
      cfg->status_interval_s = u;
    else
      cfg->revocation_interval_s = u;
    return 0;
  }
  case O_RUN_ID:
  case O_LABEL: {
    /* Checked as the progress record will carry it: a run name of
     * [A-Za-z0-9._-], a label of printable UTF-8. */
    bool run = o->id == O_RUN_ID;
    proto_progress pr = {.mode = PROTO_MODE_NODE};
    uint8_t buf[PROTO_RECORD_MAX];
    size_t n;
    snprintf(pr.run, sizeof pr.run, "%s", run ? v : "x");
    if (!run)
      snprintf(pr.label, sizeof pr.label, "%s", v);
    if (strlen(v) > (run ? PROTO_RUN_MAX : PROTO_LABEL_MAX) ||
        proto_progress_encode(&pr, buf, sizeof buf, &n))
      return bee_failf(msg, cap, BEE_ECONFIG,
                  run ? "bad run name '%.80s' (want 1..%d of A-Z a-z 0-9 . _ -)"
                      : "bad label '%.80s' (want at most %d bytes of "
                        "printable UTF-8)",
                  v, run ? PROTO_RUN_MAX : PROTO_LABEL_MAX);
    snprintf(run ? cfg->run : cfg->label, run ? sizeof cfg->run : sizeof cfg->label,
             "%s", v);
    return 0;
  }
  case O_MODEL:
    if (strcmp(v, "mlp") != 0 && strcmp(v, "cnn") != 0 &&
        strcmp(v, "resnet") != 0 && strcmp(v, "gpt") != 0 &&
        strcmp(v, "external") != 0)
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad model '%.80s' (want mlp, cnn, resnet, gpt or "
                       "external)",
                       v);
    snprintf(cfg->model, sizeof cfg->model, "%s", v);
    return 0;
  case O_DATA: return set_path(cfg->data, v, msg, cap);
  case O_TOKENS: return set_path(cfg->tokens, v, msg, cap);
  case O_VAL_TOKENS: return set_path(cfg->val_tokens, v, msg, cap);
  case O_DEPTH:
  case O_WIDTH:
  case O_VOCAB:
  case O_CTX:
  case O_LAYERS:
  case O_HEADS:
  case O_EMBD: {
    /* Ranges that keep the numbers sane; the trainer checks the
     * architecture itself (resnet's depths, heads dividing embd). */
    static const struct {
      int id;
      unsigned lo, hi;
    } lim[] = {{O_DEPTH, 8, 200},  {O_WIDTH, 1, 1024}, {O_VOCAB, 2, 65536},
               {O_CTX, 1, 8192},   {O_LAYERS, 1, 128}, {O_HEADS, 1, 256},
               {O_EMBD, 1, 16384}};
    size_t k = 0;
    while (lim[k].id != o->id)
      k++;
    if (parse_uint(v, lim[k].lo, lim[k].hi, &u))
      return bee_failf(msg, cap, BEE_ECONFIG, "bad number '%.80s' (want %u..%u)",
                       v, lim[k].lo, lim[k].hi);
    unsigned *dst[] = {&cfg->depth, &cfg->width, &cfg->vocab, &cfg->ctx,
                       &cfg->layers, &cfg->heads, &cfg->embd};
    *dst[k] = u;
    return 0;
  }
  case O_BATCH_SIZE:
    if (parse_uint(v, 1, BEE_BATCH_MAX, &u))
      return bee_failf(msg, cap, BEE_ECONFIG, "bad number '%.80s' (want 1..%d)", v,
                  BEE_BATCH_MAX);
    cfg->batch_size = u;
    return 0;
  case O_TARGET_BATCH_SIZE:
    if (parse_uint(v, 1, 1000000000, &u))
      return bee_failf(msg, cap, BEE_ECONFIG,
                  "bad number '%.80s' (want samples, 1..1000000000)", v);
    cfg->target_batch_size = u;
    return 0;
  case O_LR:
  case O_OUTER_LR:
  case O_OUTER_MOMENTUM:
  case O_MATCHMAKING_TIME: {
    /* (lo, hi]; the momentum [0, 1) */
    bool mom = o->id == O_OUTER_MOMENTUM, mm = o->id == O_MATCHMAKING_TIME;
    double hi = mm ? 600 : 100;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    bool ok = end != v && !*end && !errno && isfinite(x) &&
              (mom ? x >= 0 && x < 1 : x > 0 && x <= hi);
    if (!ok)
      return bee_failf(msg, cap, BEE_ECONFIG,
                       mom  ? "bad momentum '%.80s' (want a number in [0, 1))"
                       : mm ? "bad time '%.80s' (want seconds in (0, 600])"
                            : "bad learning rate '%.80s' (want a number in "
                              "(0, 100])",
                       v);
    if (o->id == O_LR)
      cfg->lr = x;
    else if (o->id == O_OUTER_LR)
      cfg->outer_lr = x;
    else if (mom)
      cfg->outer_momentum = x;
    else
      cfg->matchmaking_s = x;
    return 0;
  }
  case O_LR_SCHEDULE:
    if ((i = name_index(v, schedule_names)) < 0)
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad schedule '%.80s' (want constant, cosine or "
                       "linear)",
                       v);
    cfg->lr_schedule = BEE_SCHED_CONSTANT + i;
    return 0;
  case O_WARMUP_EPOCHS:
  case O_TOTAL_EPOCHS:
    if (parse_uint(v, o->id == O_WARMUP_EPOCHS ? 0 : 1, 100000000, &u))
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad number '%.80s' (want epochs, %d..100000000)", v,
                       o->id == O_WARMUP_EPOCHS ? 0 : 1);
    *(o->id == O_WARMUP_EPOCHS ? &cfg->warmup_epochs : &cfg->total_epochs) = u;
    return 0;
  case O_MIN_LR:
    if (parse_real(v, 0, 100, &cfg->min_lr))
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad learning rate '%.80s' (want a number in [0, 100])",
                       v);
    cfg->min_lr_set = true;
    return 0;
  case O_OPTIMIZER:
    if ((i = name_index(v, optimizer_names)) < 0)
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad optimizer '%.80s' (want sgd, adamw or lamb)", v);
    cfg->optimizer = BEE_OPT_SGD + i;
    return 0;
  case O_AVERAGING:
    if ((i = name_index(v, averaging_names)) < 0)
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad averaging '%.80s' (want gradients or diloco)", v);
    cfg->averaging = BEE_AVG_GRADIENTS + i;
    return 0;
  case O_INNER_STEPS:
    if (parse_uint(v, 1, 1000000, &u))
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad number '%.80s' (want local steps, 1..1000000)", v);
    cfg->inner_steps = u;
    return 0;
  case O_MIN_PEERS:
    if (parse_uint(v, 1, 100000, &u))
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad number '%.80s' (want bees, 1..100000)", v);
    cfg->min_peers = u;
    return 0;
  case O_GROUP_SIZE:
    if (parse_uint(v, 2, AVG_GROUP_MAX, &u))
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad number '%.80s' (want members of a group, 2..%d)", v,
                       AVG_GROUP_MAX);
    cfg->group_size = u;
    return 0;
  case O_MAX_STATE_UPLOADS:
    if (parse_uint(v, 1, BEE_STATE_UPLOADS_MAX, &u))
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad number '%.80s' (want downloads served at once, "
                       "1..%d)",
                       v, BEE_STATE_UPLOADS_MAX);
    cfg->max_state_uploads = u;
    return 0;
  case O_AVERAGE_STATE_EVERY:
    if (parse_uint(v, 0, 1000000, &u))
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad number '%.80s' (want epochs, 0..1000000; 0: never)",
                       v);
    cfg->average_state_every = u;
    return 0;
  case O_THREADS:
    if (parse_uint(v, 1, 64, &u))
      return bee_failf(msg, cap, BEE_ECONFIG, "bad number '%.80s' (want 1..64)", v);
    cfg->threads = u;
    return 0;
  case O_DEVICE:
    /* The trainer checks the spec itself when training starts (what
     * exists depends on the machine); here only its length. */
    if (!*v || strlen(v) >= sizeof cfg->device)
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad device '%.80s' (want auto, cpu, cuda or cuda:N)",
                       v);
    snprintf(cfg->device, sizeof cfg->device, "%s", v);
    return 0;
  case O_COMPRESSION: {
    avg_codec c;
    if (avg_codec_parse(v, &c))
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad compression '%.80s' (want none, fp16, bf16, u8 "
                       "or b8)",
                       v);
    cfg->compression = (int)c;
    return 0;
  }
  case O_CLIP:
    if (strcmp(v, "auto") == 0)
      cfg->clip = BEE_CLIP_AUTO;
    else if (strcmp(v, "off") == 0)
      cfg->clip = 0;
    else if (parse_real(v, 2, 1e6, &cfg->clip))
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad clip '%.80s' (want auto, off or a factor of 2 "
                       "to 1e6: times the median norm)",
                       v);
    return 0;
  case O_BANDWIDTH:
    if (strcmp(v, "auto") == 0)
      cfg->bandwidth_mbit = 0;
    else if (parse_real(v, 0.1, PROTO_LINK_MBIT_MAX, &cfg->bandwidth_mbit))
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad bandwidth '%.80s' (want auto, or Mbit/s from "
                       "0.1 to %g)",
                       v, PROTO_LINK_MBIT_MAX);
    return 0;
  case O_PRECISION:
    if (strcmp(v, "fp32") != 0 && strcmp(v, "tf32") != 0 &&
        strcmp(v, "bf16") != 0 && strcmp(v, "fp16") != 0)
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad precision '%.80s' (want fp32, tf32, bf16 or fp16)",
                       v);
    snprintf(cfg->precision, sizeof cfg->precision, "%s", v);
    return 0;
  case O_LOSS_SCALE: {
    /* auto: 0, the trainer's default; dynamic: from 2^15, the trainer's
     * TRN_LOSS_SCALE_START */
    bool dyn = strncmp(v, "dynamic", 7) == 0, ok = true;
    float s = 0;
    if (dyn) {
      s = 32768.0f;
      ok = v[7] == '\0' || (v[7] == ':' && parse_scale(v + 8, &s) == 0);
    } else if (strcmp(v, "auto") != 0) {
      ok = parse_scale(v, &s) == 0;
    }
    if (!ok)
      return bee_failf(msg, cap, BEE_ECONFIG,
                       "bad loss scale '%.80s' (want auto, dynamic, "
                       "dynamic:S or S; S a power of two: 65536 or 2^16, "
                       "2^-24 to 2^127)",
                       v);
    cfg->loss_scale = s;
    cfg->loss_scale_fixed = !dyn && s != 0;
    return 0;
  }
  case O_EVAL_EVERY:
    if (parse_uint(v, 0, 1000000, &u))
      return bee_failf(msg, cap, BEE_ECONFIG,
                  "bad number '%.80s' (want epochs, 0..1000000; 0: never)", v);
    cfg->eval_every = u;
    return 0;
  case O_CHECKPOINT_DIR: return set_path(cfg->checkpoint_dir, v, msg, cap);
  case O_CONTROL: return set_path(cfg->control, v, msg, cap);
  case O_TRAINER_SOCKET: return set_path(cfg->trainer_socket, v, msg, cap);
  case O_PEERS_FILE: return set_path(cfg->peers_file, v, msg, cap);
  case O_CHECKPOINT_EVERY:
  case O_KEEP_CHECKPOINTS:
    if (parse_uint(v, 1, 1000000, &u))
      return bee_failf(msg, cap, BEE_ECONFIG, "bad number '%.80s' (want 1..1000000)",
                  v);
    if (o->id == O_CHECKPOINT_EVERY)
      cfg->checkpoint_every = u;
    else
      cfg->keep_checkpoints = u;
    return 0;
  case O_OPEN:
  case O_NO_LISTEN:
  case O_NO_MATCH_AHEAD:
  case O_ERROR_FEEDBACK:
  case O_DELAY_AVERAGING:
  case O_RESUME:
  case O_CHECK:
  case O_BATCHNORM:
  case O_AUGMENT:
  case O_CLIENT: {
    bool b;
    if (strcmp(v, "true") == 0)
      b = true;
    else if (strcmp(v, "false") == 0)
      b = false;
    else
      return bee_failf(msg, cap, BEE_ECONFIG,
                  "bad value '%.80s' (want true or false)", v);
    if (o->id == O_OPEN)
      cfg->open = b;
    else if (o->id == O_RESUME)
      cfg->resume = b;
    else if (o->id == O_DELAY_AVERAGING)
      cfg->delay_averaging = b;
    else if (o->id == O_CLIENT)
      cfg->client = b;
    else if (o->id == O_NO_MATCH_AHEAD)
      cfg->no_match_ahead = b;
    else if (o->id == O_ERROR_FEEDBACK)
      cfg->error_feedback = b;
    else if (o->id == O_BATCHNORM)
      cfg->batchnorm = b;
    else if (o->id == O_AUGMENT)
      cfg->augment = b;
    else if (o->id == O_CHECK)
      cfg->check = b;
    else
      cfg->no_listen = b;
    return 0;
  }
  }
  return bee_failf(msg, cap, BEE_ECONFIG, "not a setting");
}

/* ---- config file ------------------------------------------------------- */

/* Reads one line of f into buf (cap bytes) without its "\n" or "\r\n".
 * Returns 1 for a line, 0 at end of file, BEE_ETOOBIG for a line longer
 * than cap - 1 bytes, BEE_EMALFORMED for a NUL byte, -errno on a read
 * error. */
static int read_line(FILE *f, char *buf, size_t cap) {
  size_t n = 0;
  int c;
  bool any = false;
  while ((c = getc(f)) != EOF) {
    any = true;
    if (c == '\n')
      break;
    if (c == '\0')
      return BEE_EMALFORMED;
    if (n + 1 >= cap)
      return BEE_ETOOBIG;
    buf[n++] = (char)c;
  }
  if (ferror(f))
    return errno ? -errno : -EIO;
  if (!any)
    return 0;
  if (n > 0 && buf[n - 1] == '\r')
    n--;
  buf[n] = '\0';
  return 1;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t')
    s++;
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
    s[--n] = '\0';
  return s;
}

/* Applies one line; lineno and path only make the message. */
static int file_line(bee_config *cfg, char *line, const char *path,
                     unsigned lineno, char *err, size_t errlen) {
  char msg[256];
  char *s = trim(line);
  if (*s == '\0' || *s == '#')
    return 0;
  char *eq = strchr(s, '=');
  if (!eq)
    return bee_failf(err, errlen, BEE_ECONFIG,
                "%s:%u: expected 'key = value', got '%.80s'", path, lineno, s);
  *eq = '\0';
  char *key = trim(s), *val = eq + 1;
  /* A '#' after blank space starts a comment. */
  for (char *p = val; *p; p++)
    if (*p == '#' && (p == val || p[-1] == ' ' || p[-1] == '\t')) {
      *p = '\0';
      break;
    }
  val = trim(val);
  const struct opt *o = opt_find(key, strlen(key));
  if (!o)
    return bee_failf(err, errlen, BEE_ECONFIG, "%s:%u: unknown setting '%.80s'",
                path, lineno, key);
  if (!o->in_file)
    return bee_failf(err, errlen, BEE_ECONFIG,
                "%s:%u: %s: only allowed on the command line", path, lineno,
                o->name);
  if (*val == '\0')
    return bee_failf(err, errlen, BEE_ECONFIG, "%s:%u: %s: missing value", path,
                lineno, o->name);
  int rc = apply(cfg, o, val, msg, sizeof msg);
  if (rc)
    return bee_failf(err, errlen, rc, "%s:%u: %s: %s", path, lineno, o->name, msg);
  return 0;
}

int bee_config_load_file(bee_config *cfg, const char *path, char *err,
                         size_t errlen) {
  /* O_NONBLOCK and the type check: a FIFO or a directory named by mistake
   * is refused instead of hanging or misreading. */
  struct stat st = {0};
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    return bee_failf(err, errlen, -e, "config file %s: %s", path, strerror(e));
  }
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    int e = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    close(fd);
    return bee_failf(err, errlen, -e, "config file %s: %s", path,
                e == EISDIR ? strerror(e) : "not a regular file");
  }
  FILE *f = fdopen(fd, "r");
  if (!f) {
    int e = errno;
    close(fd);
    return bee_failf(err, errlen, -e, "config file %s: %s", path, strerror(e));
  }
  char *line = malloc(BEE_LINE_MAX + 2);
  int rc = 0;
  unsigned lineno = 0;
  if (!line) {
    rc = bee_failf(err, errlen, -ENOMEM, "config file %s: out of memory", path);
    goto out;
  }
  for (;;) {
    lineno++;
    /* Room for BEE_LINE_MAX bytes, a '\r' and the NUL. */
    int r = read_line(f, line, BEE_LINE_MAX + 2);
    if (r == 0)
      break;
    if (r == 1 && strlen(line) > BEE_LINE_MAX)
      r = BEE_ETOOBIG;
    if (r == BEE_ETOOBIG) {
      rc = bee_failf(err, errlen, BEE_ECONFIG, "%s:%u: line longer than %d bytes",
                path, lineno, BEE_LINE_MAX);
      goto out;
    }
    if (r == BEE_EMALFORMED) {
      rc = bee_failf(err, errlen, BEE_ECONFIG, "%s:%u: NUL byte in line", path,
                lineno);
      goto out;
    }
    if (r < 0) {
      rc = bee_failf(err, errlen, r, "config file %s: %s", path, strerror(-r));
      goto out;
    }
    if ((rc = file_line(cfg, line, path, lineno, err, errlen)))
      goto out;
  }
out:
  free(line);
  fclose(f);
  return rc;
}

/* ---- command line ------------------------------------------------------ */

/* Reads argv[*i] as an option.  Sets *o, and *val to its value (from
 * "--name=value" or the next argument, advancing *i) or NULL for a
 * boolean or action.  Returns 0 or BEE_ECONFIG with err set. */
static int next_flag(int argc, char *const argv[], int *i, const struct opt **o,
                     const char **val, char *err, size_t errlen) {
  const char *a = argv[*i];
  *val = NULL;
  if (strcmp(a, "-h") == 0) {
    *o = opt_find("help", 4);
    return 0;
  }
  if (a[0] != '-')
    return bee_failf(err, errlen, BEE_ECONFIG, "unexpected argument '%.80s'", a);
  if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
    return bee_failf(err, errlen, BEE_ECONFIG, "unknown flag '%.80s'", a);
  const char *name = a + 2, *eq = strchr(name, '=');
  size_t len = eq ? (size_t)(eq - name) : strlen(name);
  *o = opt_find(name, len);
  if (!*o)
    return bee_failf(err, errlen, BEE_ECONFIG, "unknown flag '--%.*s'",
                (int)(len > 80 ? 80 : len), name);
  if ((*o)->kind != K_VALUE) {
    if (eq)
      return bee_failf(err, errlen, BEE_ECONFIG, "--%s takes no value", (*o)->name);
    return 0;
  }
  if (eq) {
    *val = eq + 1;
    return 0;
  }
  /* A following flag is not a value: "--join --open" lacks the address. */
  if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0)
    return bee_failf(err, errlen, BEE_ECONFIG, "missing value for --%s", (*o)->name);
  *val = argv[++*i];
  return 0;
}

int bee_config_check(const bee_config *cfg, char *err, size_t errlen) {
  if (cfg->open && cfg->moderated)
    return bee_failf(err, errlen, BEE_ECONFIG,
                "--open and --moderator exclude each other: a swarm is "
                "either open or moderated");
  if (!cfg->open && !cfg->moderated)
    return bee_failf(err, errlen, BEE_ECONFIG,
                "--moderator PUBKEY (moderated swarm) or --open (open "
                "swarm) is required");
  if (cfg->moderated && !cfg->token[0])
    return bee_failf(err, errlen, BEE_ECONFIG,
                "--token FILE is required in a moderated swarm "
                "(--moderator)");
  if (cfg->open && cfg->token[0])
    return bee_failf(err, errlen, BEE_ECONFIG,
                "--token is for moderated swarms; an --open swarm has none");
  if (cfg->open && cfg->revocations[0])
    return bee_failf(err, errlen, BEE_ECONFIG,
                "--revocations needs --moderator to check its signature");
  if ((cfg->checkpoint_dir[0] || cfg->resume) && !cfg->run[0])
    return bee_failf(err, errlen, BEE_ECONFIG,
                "--checkpoint-dir and --resume are for training: give --run-id");
  bool diloco = cfg->averaging == BEE_AVG_DILOCO;
  if (!diloco && (cfg->inner_steps || cfg->outer_lr > 0 ||
                  cfg->outer_momentum >= 0))
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--inner-steps, --outer-lr and --outer-momentum are for "
                     "--averaging diloco");
  if (diloco && cfg->delay_averaging)
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--delay-averaging is for gradient averaging; DiLoCo "
                     "already computes while rounds are rare");
  if (cfg->group_size && !cfg->average_state_every)
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--group-size needs --average-state-every N: each "
                     "group takes its own step, and only state rounds in "
                     "groups that change bring the bees' parameters back "
                     "together");
  if (cfg->group_size && cfg->delay_averaging)
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--group-size and --delay-averaging do not go "
                     "together: a delayed round's mean would come from the "
                     "group of the turn before, not the parameters' own");
  if (cfg->error_feedback && cfg->compression == AVG_NONE)
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--error-feedback is for a lossy --compression (fp16, "
                     "bf16, u8 or b8)");
  if (cfg->resume && !cfg->checkpoint_dir[0])
    return bee_failf(err, errlen, BEE_ECONFIG,
                "--resume needs --checkpoint-dir to resume from");
  bool external = strcmp(cfg->model, "external") == 0;
  if (external != (cfg->trainer_socket[0] != 0))
    return bee_failf(err, errlen, BEE_ECONFIG,
                     external ? "--model external needs --trainer-socket "
                                "PATH, where its trainer connects"
                              : "--trainer-socket is for --model external");
  bool gpt = strcmp(cfg->model, "gpt") == 0;
  if (gpt && !cfg->tokens[0] && cfg->run[0])
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--model gpt trains on --tokens FILE (and tests on "
                     "--val-tokens FILE): tools/train/tokenize makes them");
  if (!gpt && (cfg->tokens[0] || cfg->val_tokens[0] || cfg->vocab ||
               cfg->ctx || cfg->layers || cfg->heads || cfg->embd))
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--tokens, --val-tokens, --vocab, --ctx, --layers, "
                     "--heads and --embd are for --model gpt");
  if (gpt && cfg->augment)
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--augment is for images; gpt reads tokens");
  if (strcmp(cfg->model, "resnet") != 0 && (cfg->depth || cfg->width))
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--depth and --width are for --model resnet");
  if (strcmp(cfg->model, "cnn") != 0 && cfg->batchnorm)
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--batchnorm is for --model cnn (resnet has its own)");
  bool decays = cfg->lr_schedule == BEE_SCHED_COSINE ||
                cfg->lr_schedule == BEE_SCHED_LINEAR;
  if (decays && !cfg->total_epochs)
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--lr-schedule %s needs --total-epochs (where it ends)",
                     bee_schedule_name(cfg->lr_schedule));
  if (!decays && (cfg->total_epochs || cfg->min_lr_set))
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--total-epochs and --min-lr are for --lr-schedule "
                     "cosine or linear");
  if (decays && cfg->warmup_epochs >= cfg->total_epochs)
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--warmup-epochs (%u) must be fewer than --total-epochs "
                     "(%u)",
                     cfg->warmup_epochs, cfg->total_epochs);
  if (decays && cfg->min_lr >= bee_config_lr(cfg))
    return bee_failf(err, errlen, BEE_ECONFIG,
                     "--min-lr (%g) must be below the learning rate (%g)",
                     cfg->min_lr, bee_config_lr(cfg));
  return 0;
}


int bee_config_parse(bee_config *cfg, int argc, char *const argv[], char *err,
                     size_t errlen) {
  const struct opt *o;
  const char *val;
  char msg[256];
  int rc;
  bee_config_init(cfg);
  if (err && errlen)
    err[0] = '\0';

  /* Pass 1: --help, --version and --config, which decide what comes
   * next.  Errors are left for pass 2 to report in order. */
  for (int i = 1; i < argc; i++) {
    if (next_flag(argc, argv, &i, &o, &val, NULL, 0))
      continue;
    if (o->id == O_HELP || o->id == O_VERSION) {
      bee_config_init(cfg);
      cfg->help = o->id == O_HELP;
      cfg->version = o->id == O_VERSION;
      return 0;
    }
    if (o->id == O_CONFIG && (rc = apply(cfg, o, val, msg, sizeof msg)))
      return bee_failf(err, errlen, rc, "--config: %s", msg);
  }
  if (cfg->config[0] &&
      (rc = bee_config_load_file(cfg, cfg->config, err, errlen)))
    return rc;

  /* Pass 2: the flags, over the file. */
  bool joins_given = false, announce_given = false;
  for (int i = 1; i < argc; i++) {
    if ((rc = next_flag(argc, argv, &i, &o, &val, err, errlen)))
      return rc;
    if (o->id == O_CONFIG)
      continue;
    if (o->kind == K_BOOL) {
      val = "true";
    } else if (o->id == O_JOIN && !joins_given) {
      joins_given = true;
      cfg->njoin = 0;
    } else if (o->id == O_ANNOUNCE && !announce_given) {
      announce_given = true; /* the flags' list replaces the file's */
      cfg->nannounce = 0;
    }
    if ((rc = apply(cfg, o, val, msg, sizeof msg)))
      return bee_failf(err, errlen, rc, "--%s: %s", o->name, msg);
  }
  return bee_config_check(cfg, err, errlen);
}

void bee_config_usage(FILE *f) {
  fprintf(
      f,
      "usage: beed [FLAGS]\n"
      "\n"
      "Runs one node of a beed swarm: a peer-to-peer, decentralized training\n"
      "daemon.  A swarm is either moderated (--moderator and --token) or\n"
      "open (--open).\n"
      "\n"
      "  --listen ADDR:PORT       listen here (default %s);\n"
      "                           also [V6ADDR]:PORT and :PORT\n"
      "  --no-listen              make outgoing connections only\n"
      "  --client                 DHT client: make requests, never be put in\n"
      "                           other nodes' routing tables (behind NAT)\n"
      "  --join HOST:PORT         a peer to join through (repeatable, up to "
      "%d)\n"
      "  --announce HOST:PORT     where peers reach this node (repeatable, up\n"
      "                           to %d; the first goes in its records);\n"
      "                           default: the address its peers see it at,\n"
      "                           else the --listen address\n"
      "  --peers-file FILE        keep the DHT contacts' addresses there and\n"
      "                           join through them too at the next start,\n"
      "                           when the --join targets may be gone\n"
      "                           (default: none)\n"
      "  --identity FILE          node key, created if missing (default %s)\n"
      "  --moderator PUBKEY       the swarm moderator's public key (64 hex)\n"
      "  --token FILE             this node's access token from the "
      "moderator\n"
      "  --revocations FILE       moderator-signed list of revoked keys;\n"
      "                           it is also published in the DHT\n"
      "  --revocation-interval SECS  how often to look for a newer list in\n"
      "                           the DHT (default 30)\n"
      "  --open                   open swarm: no moderator, anyone may join\n"
      "  --swarm NAME             swarm name (default %s)\n"
      "  --max-conns N            connection limit, 1..65536 (default %d)\n"
      "  --status-interval SECS   log a swarm status line this often; 0 = off\n"
      "                           (default %d)\n"
      "  --log-level LEVEL        error, warn, info or debug (default info)\n"
      "  --control PATH           a unix socket (mode 0600) for beectl status\n"
      "                           and beectl leave (default: none)\n"
      "  --config FILE            read settings from FILE first\n"
      "  --check                  check the settings and everything beed\n"
      "                           would load (key, token, revocations,\n"
      "                           data, checkpoint, files), print a summary\n"
      "                           and exit 0 (it would start) or 1; opens\n"
      "                           no socket and creates nothing\n"
      "  --help, --version\n"
      "\n",
      BEE_DEFAULT_LISTEN, BEE_JOIN_MAX, BEE_ANNOUNCE_MAX, BEE_DEFAULT_IDENTITY,
      BEE_DEFAULT_SWARM, BEE_DEFAULT_MAX_CONNS, BEE_DEFAULT_STATUS_S);
  fprintf(
      f,
      "Training (on with --run-id; every bee of a run uses the same run id):\n"
      "  --run-id NAME            the run to train in: 1..%d of A-Z a-z 0-9 . "
      "_ -\n"
      "  --model NAME             mlp, cnn, resnet or gpt (default mlp); or\n"
      "                           external: the model of a trainer process\n"
      "                           (PyTorch through tools/client) that\n"
      "                           connects to --trainer-socket\n"
      "  --trainer-socket PATH    --model external: a unix socket (mode\n"
      "                           0600) where the trainer connects\n"
      "  --data DIR               images: Fashion-MNIST or MNIST IDX files, "
      "or\n"
      "                           CIFAR-10's binary batches (default\n"
      "                           %s)\n"
      "  --augment                images: random crops (padding 4) and flips\n"
      "  --batchnorm              cnn: batch norm after each convolution\n"
      "  --depth N, --width W     resnet: 18 (ImageNet's) or 6n + 2 (CIFAR's\n"
      "                           ResNet-20, -56...; default 20); the first\n"
      "                           stage's channels (default 16)\n"
      "  --tokens FILE            gpt: the training tokens "
      "(tools/train/tokenize)\n"
      "  --val-tokens FILE        gpt: held-out tokens for the test lines\n"
      "  --vocab V, --ctx T       gpt: vocabulary (default 256) and window\n"
      "                           (default 64); a sample is one window\n"
      "  --layers L, --heads H, --embd C\n"
      "                           gpt: its size (default 4, 4, 128)\n",
      PROTO_RUN_MAX, BEE_DEFAULT_DATA);
  fprintf(
      f,
      "  --batch-size N           samples per local step (default %d)\n"
      "  --target-batch-size N    samples the swarm gathers per epoch (default %d)\n"
      "  --optimizer NAME         sgd (momentum 0.9), adamw or lamb (default\n"
      "                           sgd)\n"
      "  --lr RATE                learning rate (default %g for sgd, 1e-3 for\n"
      "                           adamw and lamb)\n"
      "  --averaging MODE         gradients: the swarm averages gradients every\n"
      "                           target batch (default); diloco: each bee takes\n"
      "                           --inner-steps local steps, then the swarm\n"
      "                           averages the change and takes an outer step\n"
      "  --inner-steps H          diloco: local steps per round (default %d)\n"
      "  --outer-lr RATE          diloco: the outer Nesterov step (default %g)\n"
      "  --outer-momentum M       diloco: its momentum, [0, 1) (default %g)\n"
      "  --average-state-every N  average parameters and optimizer state too,\n"
      "                           every N epochs; 0 = never (default 0)\n"
      "  --matchmaking-time SECS  the longest a round waits for the peers it\n"
      "                           expects (default %g); the group forms this\n"
      "                           long before the swarm's estimated end of the\n"
      "                           epoch, while the last batches are computed\n"
      "  --no-match-ahead         form the group only once the target is reached\n"
      "  --compression C          none, fp16, bf16, u8 or b8 (8 bits with a\n"
      "                           scale per 4096): how gradients (DiLoCo: the\n"
      "                           change) travel in rounds (default none)\n"
      "  --error-feedback         with lossy compression, carry each round's\n"
      "                           coding error into the next\n"
      "  --clip auto|off|F        scale down a bee's gradients (DiLoCo: change)\n"
      "                           in a round where, part by part, their norm\n"
      "                           is more than F times the median of the\n"
      "                           group's (auto: F = 10; default auto)\n"
      "  --bandwidth auto|MBIT    this bee's link, Mbit/s, as its rounds size\n"
      "                           the members' spans and stripes by (auto: as\n"
      "                           its rounds measure it; default auto)\n"
      "  --delay-averaging        average an epoch's gradients while the next\n"
      "                           is computed (its step a round late)\n"
      "  --min-peers N            start training once N bees (this one too)\n"
      "                           are in the run (default 1: at once, or with\n"
      "                           the peers seen within 3 s)\n"
      "  --group-size N           average in groups of at most N in a run\n"
      "                           of more bees: Moshpit's grid, a turn per\n"
      "                           state round (needs --average-state-every;\n"
      "                           default: one group of every bee)\n"
      "  --lr-schedule S          constant, cosine or linear: a decay to\n"
      "                           --min-lr (default 0) at --total-epochs,\n"
      "                           after --warmup-epochs of linear warmup\n"
      "                           (default constant; warmup 0)\n"
      "  --max-state-uploads N    serve the state to at most N newcomers at\n"
      "                           once; the others are told to come back\n"
      "                           (default 2)\n"
      "  --label TEXT             shown beside this bee's progress (a region)\n",
      BEE_DEFAULT_BATCH, BEE_DEFAULT_TARGET_BATCH,
      BEE_DEFAULT_LR, BEE_DEFAULT_INNER_STEPS, BEE_DEFAULT_OUTER_LR,
      BEE_DEFAULT_OUTER_MOMENTUM, BEE_DEFAULT_MATCHMAKING_S);
  fputs(
      "  --threads N              compute threads, 1..64 (default 1)\n"
      "  --device D               auto, cpu, cuda or cuda:N: where the model\n"
      "                           trains (default auto: cuda:0 when a CUDA\n"
      "                           device is present, else the CPU)\n"
      "  --precision P            fp32, tf32, bf16 or fp16: on CUDA, tf32\n"
      "                           lets matrix products and convolutions round\n"
      "                           their inputs to TF32 on the tensor cores;\n"
      "                           bf16 gives the products bf16 inputs, the\n"
      "                           convolutions TF32; fp16 gives both fp16\n"
      "                           inputs and scales the loss (dynamic, as\n"
      "                           PyTorch's GradScaler) (default fp32)\n"
      "  --loss-scale L           auto, dynamic, dynamic:S or S: the loss\n"
      "                           scale a training pass multiplies the\n"
      "                           gradient by (a batch whose gradients\n"
      "                           overflow is dropped); dynamic halves it at\n"
      "                           an overflow and doubles it after 2000\n"
      "                           clean batches, from S (default 2^15); S\n"
      "                           alone keeps it; S a power of two (65536 or\n"
      "                           2^16); auto: dynamic with fp16 on CUDA,\n"
      "                           none otherwise (default auto)\n"
      "  --eval-every N           test accuracy every N epochs; 0 = never\n"
      "                           (default 1)\n"
      "  --checkpoint-dir DIR     write checkpoints there, in the background\n"
      "  --checkpoint-every N     every N epochs (default 1), and at shutdown\n"
      "  --keep-checkpoints K     keep the newest K (default 3)\n"
      "  --resume                 start from the newest valid checkpoint (or\n"
      "                           from a peer when the swarm is ahead)\n"
      "\n"
      "A config file holds 'name = value' lines with the flag names without\n"
      "their dashes ('open = true'); '#' starts a comment.  Flags override\n"
      "the file; --join flags replace the file's join lines.\n"
      "\n"
      "Exit status: 0 after a clean shutdown (SIGINT, SIGTERM), 1 when the\n"
      "node cannot start (key, token, address), 2 for a bad flag or config.\n",
      f);
}
