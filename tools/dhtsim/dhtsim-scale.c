/* dhtsim-scale.c: the DHT at internet scale, with churn.
 *
 * Tens of thousands of dht_node cores on tests/dhtsim.c's fake clock.  The
 * population is kept near --nodes: every node lives an exponential time
 * (--mean-lifetime), and when it dies a fresh node (a new identity and
 * address) joins through a random live node after an exponential gap
 * (--gap).  At the start, --keys records are put by random nodes and
 * --control-keys more by nodes that never leave; each owner republishes
 * its record (dht_put does) while it lives, so once an owner is gone its
 * record lives on only through the replicas and what they hand on.
 *
 * Measured per report interval (an hour by default) and printed as one
 * Markdown table row: the population, load gets (--gets-per-hour, of
 * records whose owner is alive, from random live nodes) with their
 * success, rounds, messages and time, a survival sample (--survey gets per
 * hour of random records, owner alive or not, and of the control records)
 * and an oracle that asks every live node's storage which records still
 * exist anywhere.  See tools/dhtsim/README.md and docs/DHT.md.
 */
#include "arena.h"
#include "dhtsim.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define MINUTE_MS (60u * 1000u)
#define HOUR_MS (60u * MINUTE_MS)
#define PUT_WAIT_MS (10u * MINUTE_MS) /* simulated time the puts may take */
#define JOIN_WAIT_MS (60u * MINUTE_MS)
#define JOIN_SLICE_MS (100u * 1000u) /* progress lines while joining */
#define VALUE_MAX 24

/* ---- options ------------------------------------------------------------ */

typedef struct options {
  size_t nodes;         /* population kept near this */
  double hours;         /* simulated time measured, after the warm-up */
  double lifetime_h;    /* mean exponential lifetime; 0: no churn */
  double gap_s;         /* mean gap before a replacement joins; 0: at once */
  size_t keys;          /* records put by ordinary (mortal) nodes */
  size_t control;       /* records put by nodes that never leave */
  double gets_per_hour; /* load gets, whole network */
  double survey;        /* survival gets per hour */
  uint64_t seed;
  uint64_t lat_min, lat_max; /* one-way, ms */
  unsigned loss;             /* permille of requests dropped */
  uint64_t stagger_ms;       /* between the initial joins */
  double warmup_min;         /* after the joins, before the puts */
  double report_min;         /* one table row per this much time */
  double refresh_min;        /* 0: dht_config_default's */
  double republish_min;      /* 0: dht_config_default's */
  bool oracle;               /* count holders of every record per row */
  double max_wall_s;         /* stop at the first row past this; 0: none */
  double max_rss_mib;        /* stop at the first row above this; 0: none */
  double max_cpu_s;          /* stop at the first row past this; 0: none */
  double stop_at_h;          /* stop at the first row at this hour; 0: none */
  int log_level;
} options;

/* Per process, never in a checkpoint: where to write checkpoints, and the
 * one to carry on from. */
static const char *ckpt_path, *resume_path;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: dhtsim-scale [options]\n"
      "  --nodes N             population kept near N (default 10000)\n"
      "  --hours H             simulated hours measured (default 24)\n"
      "  --mean-lifetime H     mean exponential node lifetime, hours\n"
      "                        (default 6, assumed; 0: no churn)\n"
      "  --gap S               mean exponential gap before a dead node's\n"
      "                        replacement joins, seconds (default 60)\n"
      "  --keys K              records put by random nodes (default 1000)\n"
      "  --control-keys C      records put by nodes that never leave\n"
      "                        (default 200)\n"
      "  --gets-per-hour G     load gets, whole network (default 10000)\n"
      "  --survey S            survival gets per hour (default 200)\n"
      "  --seed X              (default 1)\n"
      "  --latency MIN..MAX    one-way latency, ms (default 20..150)\n"
      "  --loss PERMILLE       requests dropped (default 0)\n"
      "  --stagger MS          between initial joins (default 10)\n"
      "  --warmup MIN          after the joins, before the puts (default "
      "10)\n"
      "  --report MIN          one table row per MIN (default 60)\n"
      "  --refresh MIN         bucket refresh (default: the core's, 15)\n"
      "  --republish MIN       owners' republish (default: the core's, 60)\n"
      "  --max-wall S          stop at the first row after S seconds of wall\n"
      "                        time (default 0: run all --hours)\n"
      "  --max-cpu S           the same, for S seconds of CPU time (on a\n"
      "                        shared machine, the run's own cost)\n"
      "  --max-rss MIB         stop at the first row (or join slice) with\n"
      "                        more resident memory (default 0: no limit)\n"
      "                        (SIGINT, SIGTERM or SIGUSR1 also stop a run\n"
      "                        at its next row, with the summary)\n"
      "  --stop-at H           stop at the first row at or after simulated\n"
      "                        hour H (to split a run: see --checkpoint)\n"
      "  --checkpoint FILE     after every row, write the whole simulation\n"
      "                        to FILE (replaced each time; about the RSS)\n"
      "  --resume FILE         carry on a run from its checkpoint; only the\n"
      "                        options above from --max-wall on, and --log,\n"
      "                        may be given with it (the rest is the run's)\n"
      "  --no-oracle           skip counting holders in every node's "
      "storage\n"
      "  --log LEVEL           error|warn|info|debug (default error)\n");
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-')
    return -EINVAL;
  *out = v;
  return 0;
}

static int parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= 0) || isinf(v))
    return -EINVAL;
  *out = v;
  return 0;
}

/* "MIN..MAX" or one number for both. */
static int parse_range(const char *s, uint64_t *lo, uint64_t *hi) {
  char buf[64];
  if (strlen(s) >= sizeof buf)
    return -EINVAL;
  strcpy(buf, s);
  char *dots = strstr(buf, "..");
  if (!dots)
    return parse_u64(buf, lo) ? -EINVAL : parse_u64(buf, hi);
  *dots = 0;
  if (parse_u64(buf, lo) || parse_u64(dots + 2, hi) || *hi < *lo)
    return -EINVAL;
  return 0;
}

static void options_default(options *o) {
  memset(o, 0, sizeof *o);
  o->nodes = 10000;
  o->hours = 24;
  o->lifetime_h = 6;
  o->gap_s = 60;
  o->keys = 1000;
  o->control = 200;
  o->gets_per_hour = 10000;
  o->survey = 200;
  o->seed = 1;
  o->lat_min = 20;
  o->lat_max = 150;
  o->stagger_ms = 10;
  o->warmup_min = 10;
  o->report_min = 60;
  o->oracle = true;
  o->log_level = BEE_LOG_ERROR;
}

/* The options that take a number: where it goes, and whether it is a
 * count (an unsigned integer) or a quantity (a non-negative real). */
typedef struct opt_spec {
  const char *name;
  size_t off;
  enum { O_SIZE, O_U64, O_UINT, O_DOUBLE } kind;
} opt_spec;

static const opt_spec opt_specs[] = {
    {"--nodes", offsetof(options, nodes), O_SIZE},
    {"--keys", offsetof(options, keys), O_SIZE},
    {"--control-keys", offsetof(options, control), O_SIZE},
    {"--seed", offsetof(options, seed), O_U64},
    {"--loss", offsetof(options, loss), O_UINT},
    {"--stagger", offsetof(options, stagger_ms), O_U64},
    {"--hours", offsetof(options, hours), O_DOUBLE},
    {"--mean-lifetime", offsetof(options, lifetime_h), O_DOUBLE},
    {"--gap", offsetof(options, gap_s), O_DOUBLE},
    {"--gets-per-hour", offsetof(options, gets_per_hour), O_DOUBLE},
    {"--survey", offsetof(options, survey), O_DOUBLE},
    {"--warmup", offsetof(options, warmup_min), O_DOUBLE},
    {"--report", offsetof(options, report_min), O_DOUBLE},
    {"--refresh", offsetof(options, refresh_min), O_DOUBLE},
    {"--republish", offsetof(options, republish_min), O_DOUBLE},
    {"--max-wall", offsetof(options, max_wall_s), O_DOUBLE},
    {"--max-rss", offsetof(options, max_rss_mib), O_DOUBLE},
    {"--max-cpu", offsetof(options, max_cpu_s), O_DOUBLE},
    {"--stop-at", offsetof(options, stop_at_h), O_DOUBLE},
};

/* Options that belong to one process (budgets, where to write, the log),
 * not to the run: the only ones --resume accepts beside itself. */
static bool per_process(const char *name) {
  static const char *const names[] = {
      "--max-wall",   "--max-rss", "--max-cpu", "--stop-at",
      "--checkpoint", "--resume",  "--log",
  };
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (!strcmp(name, names[i]))
      return true;
  return false;
}

/* One option with its value; returns 0 or -EINVAL. */
static int parse_opt(options *o, const char *name, const char *val) {
  if (!strcmp(name, "--latency"))
    return parse_range(val, &o->lat_min, &o->lat_max);
  if (!strcmp(name, "--log"))
    return bee_log_level_parse(val, &o->log_level) ? -EINVAL : 0;
  for (size_t i = 0; i < sizeof opt_specs / sizeof *opt_specs; i++) {
    const opt_spec *sp = &opt_specs[i];
    if (strcmp(name, sp->name) != 0)
      continue;
    char *field = (char *)o + sp->off;
    uint64_t u;
    if (sp->kind == O_DOUBLE)
      return parse_double(val, (double *)(void *)field);
    if (parse_u64(val, &u) != 0)
      return -EINVAL;
    if (sp->kind == O_SIZE && u <= SIZE_MAX)
      *(size_t *)(void *)field = (size_t)u;
    else if (sp->kind == O_UINT && u <= 1000000)
      *(unsigned *)(void *)field = (unsigned)u;
    else if (sp->kind == O_U64)
      *(uint64_t *)(void *)field = u;
    else
      return -EINVAL;
    return 0;
  }
  return -EINVAL;
}

static int parse_args(int argc, char **argv, options *o) {
  options_default(o);
  const char *run_opt = NULL; /* an option of the run's, if one was given */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      exit(0);
    }
    if (!per_process(argv[i]))
      run_opt = argv[i];
    if (!strcmp(argv[i], "--no-oracle")) {
      o->oracle = false;
      continue;
    }
    if (i + 1 < argc &&
        (!strcmp(argv[i], "--checkpoint") || !strcmp(argv[i], "--resume"))) {
      *(argv[i][2] == 'c' ? &ckpt_path : &resume_path) = argv[i + 1];
      i++;
      continue;
    }
    if (i + 1 >= argc || parse_opt(o, argv[i], argv[i + 1]) != 0) {
      fprintf(stderr, "dhtsim-scale: bad option or value: %s%s%s\n", argv[i],
              i + 1 < argc ? " " : "", i + 1 < argc ? argv[i + 1] : "");
      return -EINVAL;
    }
    i++;
  }
  if (resume_path && run_opt) {
    fprintf(stderr,
            "dhtsim-scale: %s belongs to the run, which --resume carries on "
            "as it was started\n",
            run_opt);
    return -EINVAL;
  }
  const char *bad = NULL;
  if ((ckpt_path && !*ckpt_path) || (resume_path && !*resume_path))
    bad = "--checkpoint and --resume need a file name";
  else if (o->nodes < 2 || o->nodes > DHTSIM_NODES_MAX / 4)
    bad = "--nodes must be 2 or more (and leave room for replacements)";
  else if (o->loss > 1000)
    bad = "--loss is in permille, 0..1000";
  else if (o->hours <= 0 || o->report_min <= 0)
    bad = "--hours and --report must be positive";
  else if (o->control > o->nodes / 2)
    bad = "--control-keys needs that many nodes that never leave";
  else if (o->hours * 3600 + 7200 > DHT_TTL_MAX_S)
    bad = "--hours: records cannot live that long (DHT_TTL_MAX_S)";
  if (bad) {
    fprintf(stderr, "dhtsim-scale: %s\n", bad);
    return -EINVAL;
  }
  return 0;
}

/* ---- small helpers ------------------------------------------------------ */

static void *xrealloc(void *p, size_t n) {
  p = realloc(p, n ? n : 1);
  if (!p) {
    fprintf(stderr, "dhtsim-scale: out of memory (%zu bytes)\n", n);
    abort();
  }
  return p;
}

static double secs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU time of the process so far (user + system), seconds: the cost of
 * a run, whatever else shares the machine. */
static double cpu_secs(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* Peak resident memory of the process, MiB. */
static double maxrss_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss / 1024.0; /* Linux: KiB */
}

/* Resident memory now, MiB (Linux /proc; 0 where there is none). */
static double rss_mib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long size, res;
  double mib = 0;
  if (f && fscanf(f, "%lu %lu", &size, &res) == 2)
    mib = (double)res * 4096.0 / (1024.0 * 1024.0);
  if (f)
    fclose(f);
  return mib;
}

/* Exponential with the given mean, from the network's generator so that a
 * run stays reproducible from its seed. */
static uint64_t rand_exp_ms(dhtsim *s, double mean_ms) {
  double u = (double)(dhtsim_rand(s) >> 11) * 0x1.0p-53; /* [0, 1) */
  return (uint64_t)(-mean_ms * log1p(-u));
}

/* A growable vector of samples. */
typedef struct uvec {
  unsigned *v;
  size_t n, cap;
} uvec;

static void uvec_push(uvec *u, unsigned x) {
  if (u->n == u->cap) {
    u->cap = u->cap ? 2 * u->cap : 256;
    u->v = xrealloc(u->v, u->cap * sizeof *u->v);
  }
  u->v[u->n++] = x;
}

static int cmp_unsigned(const void *a, const void *b) {
  unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile q of u (sorts it); 0 when empty. */
static unsigned pct(uvec *u, unsigned q) {
  if (u->n == 0)
    return 0;
  qsort(u->v, u->n, sizeof *u->v, cmp_unsigned);
  size_t rank = (u->n * q + 99) / 100;
  return u->v[rank ? rank - 1 : 0];
}

static double percent(size_t a, size_t b) {
  return b ? 100.0 * (double)a / (double)b : NAN;
}

/* ---- the run ------------------------------------------------------------ */

enum { EV_DEATH, EV_BIRTH, EV_GET, EV_SURVEY, EV_REPORT };
enum { CAT_UP, CAT_GONE, CAT_CONTROL, CATS }; /* a record's owner */

/* One of our own events (deaths, births, gets, reports), kept apart from
 * the simulator's queue and run between its slices of time. */
typedef struct tev {
  uint64_t at, seq;
  size_t node;
  int type;
} tev;

typedef struct record {
  uint8_t key[PROTO_DHT_KEY_BYTES];
  char value[VALUE_MAX];
  size_t owner;
  bool control;
} record;

/* Figures of one report interval (or, as totals, of the whole run). */
typedef struct period {
  size_t gets, found, missing, errors, canceled;
  size_t local;     /* found in the getter's own storage: no request sent */
  size_t miss_held; /* missing though some live node held the record */
  uvec rounds, msgs, ms;
  size_t surv[CATS], surv_found[CATS];
  size_t joins, leaves;
} period;

typedef struct run run;

typedef struct put_op {
  run *r;
  int status; /* 1 while pending */
  unsigned stored;
} put_op;

struct run {
  options o;
  dhtsim *s;
  /* live set: live[pos[i]] == i for each live node i */
  size_t *live, nlive, live_cap;
  size_t *pos;
  uint8_t *immortal;
  size_t idx_cap;
  record *recs;
  size_t nrecs; /* o.keys mortal-owned, then o.control */
  tev *q;
  size_t qn, qcap;
  uint64_t qseq;
  period cur, all;
  uint64_t t0, end; /* simulated ms: churn starts, run ends */
  size_t pending;   /* our gets and puts in flight */
  bool closing;
  dhtsim_counters c_prev;
  put_op *puts;
  double wall0, wall_prev, cpu_prev; /* this process's clocks */
  double wall_base, cpu_base;   /* spent by the processes before this one */
  double wall_saved, cpu_saved; /* totals when the checkpoint was written */
  double per_node;              /* bytes per joined node, for the summary */
  double rss0;                  /* MiB before the network was made */
  uint64_t row_start;           /* simulated ms the current period began */
};

typedef struct get_op {
  run *r;
  size_t rec;
  int type; /* EV_GET or EV_SURVEY */
  int cat;
} get_op;

static void q_push(run *r, uint64_t at, int type, size_t node) {
  if (r->qn == r->qcap) {
    r->qcap = r->qcap ? 2 * r->qcap : 1024;
    r->q = xrealloc(r->q, r->qcap * sizeof *r->q);
  }
  tev ev = {.at = at, .seq = r->qseq++, .node = node, .type = type};
  size_t i = r->qn++;
  while (i > 0) {
    size_t up = (i - 1) / 2;
    const tev *p = &r->q[up];
    if (p->at < ev.at || (p->at == ev.at && p->seq < ev.seq))
      break;
    r->q[i] = r->q[up];
    i = up;
  }
  r->q[i] = ev;
}

static bool tev_less(const tev *a, const tev *b) {
  return a->at < b->at || (a->at == b->at && a->seq < b->seq);
}

static tev q_pop(run *r) {
  tev top = r->q[0], last = r->q[--r->qn];
  size_t i = 0, n = r->qn;
  for (;;) {
    size_t l = 2 * i + 1, m = i;
    const tev *best = &last;
    if (l < n && tev_less(&r->q[l], best))
      best = &r->q[m = l];
    if (l + 1 < n && tev_less(&r->q[l + 1], best))
      m = l + 1;
    if (m == i)
      break;
    r->q[i] = r->q[m];
    i = m;
  }
  if (n > 0)
    r->q[i] = last;
  return top;
}

/* Makes room for node index i in the per-index arrays. */
static void index_room(run *r, size_t i) {
  if (i < r->idx_cap)
    return;
  size_t cap = r->idx_cap ? r->idx_cap : 1024;
  while (cap <= i)
    cap *= 2;
  r->pos = xrealloc(r->pos, cap * sizeof *r->pos);
  r->immortal = xrealloc(r->immortal, cap);
  for (size_t k = r->idx_cap; k < cap; k++) {
    r->pos[k] = SIZE_MAX;
    r->immortal[k] = 0;
  }
  r->idx_cap = cap;
}

static void live_add(run *r, size_t i) {
  index_room(r, i);
  if (r->nlive == r->live_cap) {
    r->live_cap = r->live_cap ? 2 * r->live_cap : 1024;
    r->live = xrealloc(r->live, r->live_cap * sizeof *r->live);
  }
  r->pos[i] = r->nlive;
  r->live[r->nlive++] = i;
}

static void live_remove(run *r, size_t i) {
  size_t p = r->pos[i], last = r->live[--r->nlive];
  r->live[p] = last;
  r->pos[last] = p;
  r->pos[i] = SIZE_MAX;
}

/* A random live node other than except, preferring one that has joined;
 * SIZE_MAX when there is none. */
static size_t pick_live(run *r, size_t except) {
  size_t any = SIZE_MAX;
  for (int tries = 0; tries < 32 && r->nlive > 0; tries++) {
    size_t i = r->live[dhtsim_rand_below(r->s, r->nlive)];
    if (i == except)
      continue;
    if (dhtsim_join_status(r->s, i) == 0 || i == 0)
      return i;
    any = i;
  }
  return any;
}

/* ---- gets --------------------------------------------------------------- */

static bool has_value(const dht_value *v, const char *want) {
  for (size_t i = 0; v && i < v->n; i++) {
    const proto_dht_record *x = &v->records[i];
    if (x->subkey.n == 0 && x->value.n == strlen(want) &&
        memcmp(x->value.p, want, x->value.n) == 0)
      return true;
  }
  return false;
}

/* Live nodes whose storage holds record k (the oracle). */
static size_t holders(run *r, size_t k) {
  size_t h = 0;
  for (size_t j = 0; j < r->nlive; j++) {
    dht_value v;
    if (dht_node_local_get(dhtsim_node(r->s, r->live[j]), r->recs[k].key, &v) ==
            0 &&
        has_value(&v, r->recs[k].value))
      h++;
  }
  return h;
}

static void count_get(run *r, period *p, const get_op *op, int status,
                      bool found, const dht_stats *st) {
  if (status == BEE_ECANCELED) {
    p->canceled++;
    return;
  }
  if (op->type == EV_SURVEY) {
    p->surv[op->cat]++;
    p->surv_found[op->cat] += found;
    return;
  }
  p->gets++;
  if (found)
    p->found++;
  if (found && st->requests == 0)
    p->local++;
  else if (status == 0 || status == -ENOENT)
    p->missing++;
  else
    p->errors++;
  uvec_push(&p->rounds, st->rounds);
  /* Each request, and each answer that came back. */
  uvec_push(&p->msgs, 2 * st->requests - st->failures);
  uvec_push(&p->ms, (unsigned)st->ms);
}

static void get_cb(dht_node *n, int status, const dht_value *v,
                   const dht_stats *st, void *arg) {
  get_op *op = arg;
  run *r = op->r;
  r->pending--;
  if (!r->closing) {
    bool found = status == 0 && has_value(v, r->recs[op->rec].value);
    count_get(r, &r->cur, op, status, found, st);
    count_get(r, &r->all, op, status, found, st);
    /* A miss of a record that still exists is the lookup's fault; one
     * that nobody holds is the data's.  Rare, so the O(N) check is
     * affordable. */
    if (op->type == EV_GET && !found && status != BEE_ECANCELED &&
        holders(r, op->rec) > 0) {
      r->cur.miss_held++;
      r->all.miss_held++;
    }
  }
  free(op);
}

static int category(run *r, size_t k) {
  if (r->recs[k].control)
    return CAT_CONTROL;
  return dhtsim_alive(r->s, r->recs[k].owner) ? CAT_UP : CAT_GONE;
}

static void start_get(run *r, size_t k, int type) {
  size_t g = pick_live(r, r->recs[k].owner);
  if (g == SIZE_MAX)
    return;
  get_op *op = xrealloc(NULL, sizeof *op);
  *op = (get_op){.r = r, .rec = k, .type = type, .cat = category(r, k)};
  int rc = dht_get(dhtsim_node(r->s, g), r->recs[k].key, false, get_cb, op);
  if (rc != 0) {
    fprintf(stderr, "dhtsim-scale: dht_get from node %zu: %s\n", g,
            bee_strerror(rc));
    free(op);
    return;
  }
  r->pending++;
}

/* A load get: a record whose owner is alive (so it is in the DHT by
 * design), chosen at random; a control record when few owners are left. */
static void load_get(run *r) {
  if (r->nrecs == 0)
    return;
  for (int tries = 0; tries < 32; tries++) {
    size_t k = dhtsim_rand_below(r->s, r->nrecs);
    if (category(r, k) != CAT_GONE) {
      start_get(r, k, EV_GET);
      return;
    }
  }
  if (r->o.control)
    start_get(r, r->o.keys + dhtsim_rand_below(r->s, r->o.control), EV_GET);
}

/* A survival get: any record, owner alive or gone, control ones as often
 * as each of the others. */
static void survey_get(run *r) {
  if (r->nrecs)
    start_get(r, dhtsim_rand_below(r->s, r->nrecs), EV_SURVEY);
}

/* ---- puts --------------------------------------------------------------- */

static void put_cb(dht_node *n, int status, unsigned stored,
                   const dht_stats *st, void *arg) {
  put_op *op = arg;
  op->status = status;
  op->stored = stored;
  op->r->pending--;
}

static bool none_pending(void *arg) { return ((run *)arg)->pending == 0; }

/* Owners: the control records' first, each a distinct node that never
 * leaves, then the others' among the remaining nodes. */
static void pick_owners(run *r) {
  for (size_t k = r->nrecs; k-- > 0;) {
    record *x = &r->recs[k];
    x->control = k >= r->o.keys;
    do
      x->owner = pick_live(r, SIZE_MAX);
    while (r->immortal[x->owner]);
    if (x->control)
      r->immortal[x->owner] = 1;
  }
}

/* Puts every record (TTL: the whole run and two hours more) from its
 * owner and waits for the puts.  Returns 0, or -1 when they did not
 * finish in time. */
static int put_records(run *r) {
  r->nrecs = r->o.keys + r->o.control;
  r->recs = xrealloc(NULL, (r->nrecs ? r->nrecs : 1) * sizeof *r->recs);
  /* Freed at the end: a put still pending then is canceled into it. */
  r->puts = xrealloc(NULL, (r->nrecs ? r->nrecs : 1) * sizeof *r->puts);
  uint64_t exp = dhtsim_wall(r->s) + (uint64_t)(r->o.hours * 3600) + 7200;
  size_t stored_min = SIZE_MAX, failed = 0, stored_sum = 0;
  for (size_t k = 0; k < r->nrecs; k++) {
    record *x = &r->recs[k];
    char name[48];
    snprintf(name, sizeof name, "scale-%zu", k);
    dht_key(name, x->key);
    snprintf(x->value, sizeof x->value, "v%zu", k);
  }
  pick_owners(r);
  for (size_t k = 0; k < r->nrecs; k++) {
    record *x = &r->recs[k];
    r->puts[k] = (put_op){.r = r, .status = 1};
    proto_bytes v = {(const uint8_t *)x->value, strlen(x->value)};
    int rc = dht_put(dhtsim_node(r->s, x->owner), x->key,
                     (proto_bytes){NULL, 0}, v, exp, put_cb, &r->puts[k]);
    if (rc != 0)
      r->puts[k].status = rc;
    else
      r->pending++;
  }
  bool done = dhtsim_run_until(r->s, none_pending, r, PUT_WAIT_MS);
  for (size_t k = 0; k < r->nrecs; k++) {
    failed += r->puts[k].status != 0;
    stored_sum += r->puts[k].stored;
    if (r->puts[k].stored < stored_min)
      stored_min = r->puts[k].stored;
  }
  printf("# puts: %zu records (%zu by nodes that never leave); %zu failed; "
         "replicas that took each: min %zu, mean %.2f\n",
         r->nrecs, r->o.control, failed, r->nrecs ? stored_min : 0,
         r->nrecs ? (double)stored_sum / (double)r->nrecs : 0.0);
  return done ? 0 : -1;
}

/* ---- churn -------------------------------------------------------------- */

static void schedule_death(run *r, size_t i) {
  if (r->o.lifetime_h > 0 && !r->immortal[i])
    q_push(r, dhtsim_now(r->s) + rand_exp_ms(r->s, r->o.lifetime_h * HOUR_MS),
           EV_DEATH, i);
}

static void death(run *r, size_t i) {
  if (!dhtsim_alive(r->s, i))
    return;
  live_remove(r, i);
  dhtsim_kill(r->s, i);
  r->cur.leaves++;
  r->all.leaves++;
  q_push(r, dhtsim_now(r->s) + rand_exp_ms(r->s, r->o.gap_s * 1000), EV_BIRTH,
         0);
}

static void birth(run *r) {
  size_t i = dhtsim_add(r->s);
  if (i == SIZE_MAX) {
    fprintf(stderr, "dhtsim-scale: no room for another node\n");
    return;
  }
  size_t via = pick_live(r, SIZE_MAX);
  live_add(r, i);
  r->cur.joins++;
  r->all.joins++;
  if (via != SIZE_MAX)
    dhtsim_join(r->s, i, via);
  schedule_death(r, i);
}

/* ---- reports ------------------------------------------------------------ */

/* Oracle: per category, how many records some live node still holds, and
 * the median and largest number of live nodes holding one. */
typedef struct census {
  size_t held[CATS], total[CATS];
  unsigned copies50, copies_max;
} census;

static void oracle(run *r, census *out) {
  memset(out, 0, sizeof *out);
  if (!r->o.oracle)
    return;
  uvec copies = {0};
  for (size_t k = 0; k < r->nrecs; k++) {
    int c = category(r, k);
    size_t h = holders(r, k);
    out->total[c]++;
    out->held[c] += h > 0;
    uvec_push(&copies, (unsigned)h);
  }
  out->copies50 = pct(&copies, 50);
  out->copies_max = pct(&copies, 100);
  free(copies.v);
}

static void print_header(void) {
  printf(
      "| h | live | joins | leaves | gets | found %% | local | lookup misses | "
      "rounds p50/p99 | msgs p50/p99 | ms p50/p99 | survival %% (n) | "
      "owner gone %% (n) | control %% (n) | held %% all/gone/ctl | "
      "msgs/node/s | wall s | cpu s | RSS MiB |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
         "---|---|---|\n");
}

static void fmt_pct(char *out, size_t cap, size_t a, size_t b) {
  if (b)
    snprintf(out, cap, "%.1f (%zu)", percent(a, b), b);
  else
    snprintf(out, cap, "- (0)");
}

/* A comment line under each row: the whole network's traffic in the
 * period (counters' deltas) and the sum of what the live cores hold. */
static void print_diag(run *r, const dhtsim_counters *c,
                       const dhtsim_counters *p, const census *cs) {
  size_t contacts = 0, keys = 0, records = 0, lookups = 0, banned = 0;
  for (size_t j = 0; j < r->nlive; j++) {
    dht_info info;
    dht_node_info(dhtsim_node(r->s, r->live[j]), &info);
    contacts += info.contacts;
    keys += info.keys;
    records += info.records;
    lookups += info.lookups;
    banned += info.blacklisted;
  }
  double n = (double)(r->nlive ? r->nlive : 1);
  printf("#   traffic: requests %" PRIu64 ", answers %" PRIu64
         ", timeouts %" PRIu64 ", lost %" PRIu64 ", dropped %" PRIu64
         ", %" PRIu64 " MiB, ticks %" PRIu64 ", events %" PRIu64
         "; per live node: contacts %.1f, keys %.1f, records %.1f, "
         "lookups running %.2f, blacklisted %.1f; live copies of a record: "
         "median %u, max %u\n",
         c->requests - p->requests, c->answers - p->answers,
         c->timeouts - p->timeouts, c->lost - p->lost, c->dropped - p->dropped,
         (c->bytes - p->bytes) >> 20, c->ticks - p->ticks,
         c->events - p->events, (double)contacts / n, (double)keys / n,
         (double)records / n, (double)lookups / n, (double)banned / n,
         cs->copies50, cs->copies_max);
}

/* One row for period p, ending at the simulated time now; resets p. */
static void print_row(run *r, period *p, double hour) {
  dhtsim_counters c;
  dhtsim_counters_get(r->s, &c);
  uint64_t msgs =
      (c.requests + c.answers) - (r->c_prev.requests + r->c_prev.answers);
  uint64_t now = dhtsim_now(r->s);
  double span_s = (double)(now - r->row_start) / 1000;
  r->row_start = now;
  dhtsim_counters prev = r->c_prev;
  r->c_prev = c;
  census cs;
  oracle(r, &cs);
  const size_t *held = cs.held, *total = cs.total;
  size_t sa = p->surv[CAT_UP] + p->surv[CAT_GONE];
  size_t sf = p->surv_found[CAT_UP] + p->surv_found[CAT_GONE];
  char s_all[32], s_gone[32], s_ctl[32], h_all[48];
  fmt_pct(s_all, sizeof s_all, sf, sa);
  fmt_pct(s_gone, sizeof s_gone, p->surv_found[CAT_GONE], p->surv[CAT_GONE]);
  fmt_pct(s_ctl, sizeof s_ctl, p->surv_found[CAT_CONTROL],
          p->surv[CAT_CONTROL]);
  if (r->o.oracle)
    snprintf(
        h_all, sizeof h_all, "%.1f/%.1f/%.1f",
        percent(held[CAT_UP] + held[CAT_GONE], total[CAT_UP] + total[CAT_GONE]),
        percent(held[CAT_GONE], total[CAT_GONE]),
        percent(held[CAT_CONTROL], total[CAT_CONTROL]));
  else
    snprintf(h_all, sizeof h_all, "-");
  double wall = secs(), cpu = cpu_secs();
  printf("| %g | %zu | %zu | %zu | %zu | %.2f | %zu | %zu | %u/%u | %u/%u | "
         "%u/%u | "
         "%s | %s | %s | %s | %.2f | %.0f | %.0f | %.0f |\n",
         hour, r->nlive, p->joins, p->leaves, p->gets,
         percent(p->found, p->gets), p->local, p->miss_held,
         pct(&p->rounds, 50), pct(&p->rounds, 99), pct(&p->msgs, 50),
         pct(&p->msgs, 99), pct(&p->ms, 50), pct(&p->ms, 99), s_all, s_gone,
         s_ctl, h_all,
         (double)msgs / (span_s > 0 ? span_s : 1) /
             (double)(r->nlive ? r->nlive : 1),
         wall - r->wall_prev, cpu - r->cpu_prev, rss_mib());
  print_diag(r, &c, &prev, &cs);
  fflush(stdout);
  r->wall_prev = wall;
  r->cpu_prev = cpu;
  free(p->rounds.v);
  free(p->msgs.v);
  free(p->ms.v);
  memset(p, 0, sizeof *p);
}

/* ---- main loop ---------------------------------------------------------- */

/* Set by SIGINT, SIGTERM or SIGUSR1: end at the next row, with the summary,
 * as a budget would. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) { stop_signal = sig; }

/* The limit a run has gone past ("--max-wall", "--max-cpu", "--max-rss",
 * "--stop-at" or a signal), or NULL.  The budgets are this process's. */
static const char *over_budget(const run *r) {
  if (r->o.stop_at_h > 0 && r->t0 && /* t0: once the churn has begun */
      dhtsim_now(r->s) - r->t0 >= (uint64_t)(r->o.stop_at_h * HOUR_MS))
    return "--stop-at";
  if (stop_signal)
    return stop_signal == SIGUSR1  ? "SIGUSR1"
           : stop_signal == SIGINT ? "SIGINT"
                                   : "SIGTERM";
  if (r->o.max_wall_s > 0 && secs() - r->wall0 > r->o.max_wall_s)
    return "--max-wall";
  if (r->o.max_cpu_s > 0 && cpu_secs() > r->o.max_cpu_s)
    return "--max-cpu";
  if (r->o.max_rss_mib > 0 && rss_mib() > r->o.max_rss_mib)
    return "--max-rss";
  return NULL;
}

static uint64_t next_report(const run *r) {
  uint64_t at = dhtsim_now(r->s) + (uint64_t)(r->o.report_min * MINUTE_MS);
  return at < r->end ? at : r->end;
}

/* Writes the whole simulation to ckpt_path: between two of our events,
 * where everything lives in the arena and is reachable from r.  A failed
 * write is reported and the run goes on (the previous file stays). */
static void checkpoint(run *r) {
  double t = secs();
  r->wall_saved = r->wall_base + (t - r->wall0);
  r->cpu_saved = r->cpu_base + cpu_secs();
  fflush(stdout);
  const char *why = NULL;
  if (arena_save(ckpt_path, r, &why) != 0) {
    printf("# checkpoint not written: %s\n", why);
    fprintf(stderr, "dhtsim-scale: checkpoint not written: %s\n", why);
    return;
  }
  printf("# checkpoint: hour %.2f in %s, %.0f MiB in %.1f s\n",
         (double)(dhtsim_now(r->s) - r->t0) / HOUR_MS, ckpt_path,
         (double)arena_used() / (1024.0 * 1024.0), secs() - t);
}

static void handle(run *r, const tev *ev) {
  uint64_t now = dhtsim_now(r->s);
  switch (ev->type) {
  case EV_DEATH: death(r, ev->node); break;
  case EV_BIRTH: birth(r); break;
  case EV_GET:
    load_get(r);
    q_push(r, now + rand_exp_ms(r->s, HOUR_MS / r->o.gets_per_hour), EV_GET, 0);
    break;
  case EV_SURVEY:
    survey_get(r);
    q_push(r, now + rand_exp_ms(r->s, HOUR_MS / r->o.survey), EV_SURVEY, 0);
    break;
  case EV_REPORT:
    print_row(r, &r->cur, (double)(now - r->t0) / HOUR_MS);
    if (now >= r->end)
      break;
    /* The checkpoint holds the next report, and the run's own end: a
     * budget stops this process only. */
    q_push(r, next_report(r), EV_REPORT, 0);
    if (ckpt_path)
      checkpoint(r);
    if (over_budget(r)) {
      printf("# stopped by %s after %.2f of %g simulated hours\n",
             over_budget(r), (double)(now - r->t0) / HOUR_MS, r->o.hours);
      r->end = now;
    }
    break;
  default: break;
  }
}

/* Runs the simulator and our own events, in time order, to r->end. */
static void churn_loop(run *r) {
  while (r->qn > 0 && r->q[0].at <= r->end) {
    tev ev = q_pop(r);
    uint64_t now = dhtsim_now(r->s);
    if (ev.at > now)
      dhtsim_run_for(r->s, ev.at - now);
    handle(r, &ev);
  }
}

/* Starts the churn, the load and the reports, and runs them. */
static void churn(run *r) {
  for (size_t j = 0; j < r->nlive; j++)
    schedule_death(r, r->live[j]);
  uint64_t now = dhtsim_now(r->s);
  if (r->o.gets_per_hour > 0)
    q_push(r, now + rand_exp_ms(r->s, HOUR_MS / r->o.gets_per_hour), EV_GET, 0);
  if (r->o.survey > 0)
    q_push(r, now + rand_exp_ms(r->s, HOUR_MS / r->o.survey), EV_SURVEY, 0);
  r->row_start = now;
  q_push(r, next_report(r), EV_REPORT, 0);
  churn_loop(r);
}

/* Joins the initial population and lets it settle. */
static int join_all(run *r) {
  double t = secs();
  uint64_t limit =
      dhtsim_now(r->s) + JOIN_WAIT_MS + r->o.nodes * r->o.stagger_ms;
  dhtsim_join_all(r->s, DHTSIM_VIA_RANDOM, r->o.stagger_ms);
  dhtsim_counters c;
  /* In slices, to show progress on a big network and stop within
   * --max-wall and --max-rss. */
  while (!dhtsim_run_until(r->s, dhtsim_joined, r->s, JOIN_SLICE_MS)) {
    dhtsim_counters_get(r->s, &c);
    printf("#   joining: %" PRIu64 " joined, %" PRIu64 " failed at %.0f "
           "simulated s; %.1f s wall, %.1f s cpu, RSS %.0f MiB\n",
           c.joins_ok, c.joins_failed,
           (double)(dhtsim_now(r->s) - DHTSIM_CLOCK_START_MS) / 1000,
           secs() - r->wall0, cpu_secs(), rss_mib());
    if (dhtsim_now(r->s) >= limit) {
      fprintf(stderr, "dhtsim-scale: joins still pending\n");
      return -1;
    }
    if (over_budget(r)) {
      printf("# stopped by %s while joining: RSS %.0f MiB, %.0f bytes per "
             "node made so far\n",
             over_budget(r), rss_mib(),
             (rss_mib() - r->rss0) * 1024 * 1024 / (double)r->o.nodes);
      return -1;
    }
  }
  dhtsim_counters_get(r->s, &c);
  printf("# joined: %" PRIu64 " ok, %" PRIu64 " failed in %.0f simulated s "
         "(%.1f s wall, %.1f s cpu so far)\n",
         c.joins_ok, c.joins_failed,
         (double)(dhtsim_now(r->s) - DHTSIM_CLOCK_START_MS) / 1000, secs() - t,
         cpu_secs());
  dhtsim_run_for(r->s, (uint64_t)(r->o.warmup_min * MINUTE_MS));
  size_t cmin = SIZE_MAX, csum = 0, bsum = 0;
  for (size_t j = 0; j < r->nlive; j++) {
    dht_info info;
    dht_node_info(dhtsim_node(r->s, r->live[j]), &info);
    csum += info.contacts;
    bsum += info.buckets;
    if (info.contacts < cmin)
      cmin = info.contacts;
  }
  printf("# after %.0f min warm-up: contacts min %zu, mean %.1f; buckets "
         "mean %.1f (%.1f s cpu so far)\n",
         r->o.warmup_min, cmin, (double)csum / (double)r->nlive,
         (double)bsum / (double)r->nlive, cpu_secs());
  return 0;
}

static void print_config(const run *r, const dht_config *cfg) {
  const options *o = &r->o;
  printf("# dhtsim-scale: nodes %zu, %g simulated h, mean lifetime %g h, "
         "replacement gap %g s, keys %zu + %zu control, %g gets/h, survey "
         "%g/h, seed %" PRIu64 ", latency %" PRIu64 "..%" PRIu64
         " ms, loss %u permille\n",
         o->nodes, o->hours, o->lifetime_h, o->gap_s, o->keys, o->control,
         o->gets_per_hour, o->survey, o->seed, o->lat_min, o->lat_max, o->loss);
  printf("# core: k %d, alpha %u, replicas %u, rpc timeout %" PRIu64
         " ms, stall %" PRIu64 " ms, refresh %" PRIu64
         " min, republish %" PRIu64 " min\n",
         DHT_K, cfg->alpha, cfg->replicas, cfg->rpc_timeout_ms, cfg->stall_ms,
         cfg->refresh_ms / MINUTE_MS, cfg->republish_ms / MINUTE_MS);
}

static void summary(run *r) {
  double wall = r->wall_base + secs() - r->wall0, rss_nodes = r->per_node;
  period *a = &r->all;
  dhtsim_counters c;
  dhtsim_counters_get(r->s, &c);
  size_t sa = a->surv[CAT_UP] + a->surv[CAT_GONE];
  size_t sf = a->surv_found[CAT_UP] + a->surv_found[CAT_GONE];
  census cs;
  oracle(r, &cs);
  const size_t *held = cs.held, *total = cs.total;
  printf(
      "SUMMARY nodes=%zu hours=%.2f lifetime_h=%g seed=%" PRIu64
      " live=%zu joins=%zu leaves=%zu gets=%zu found_pct=%.2f "
      "local=%zu lookup_misses=%zu errors=%zu rounds_p50=%u rounds_p99=%u "
      "msgs_p50=%u msgs_p99=%u ms_p50=%u ms_p99=%u survival_pct=%.1f "
      "gone_pct=%.1f control_pct=%.1f end_held_pct=%.1f end_gone_held_pct="
      "%.1f end_control_held_pct=%.1f events=%" PRIu64 " msgs=%" PRIu64
      " wall_s=%.0f cpu_s=%.0f maxrss_mib=%.0f bytes_per_node=%.0f\n",
      r->o.nodes, (double)(r->end - r->t0) / HOUR_MS, r->o.lifetime_h,
      r->o.seed, r->nlive, a->joins, a->leaves, a->gets,
      percent(a->found, a->gets), a->local, a->miss_held, a->errors,
      pct(&a->rounds, 50), pct(&a->rounds, 99), pct(&a->msgs, 50),
      pct(&a->msgs, 99), pct(&a->ms, 50), pct(&a->ms, 99), percent(sf, sa),
      percent(a->surv_found[CAT_GONE], a->surv[CAT_GONE]),
      percent(a->surv_found[CAT_CONTROL], a->surv[CAT_CONTROL]),
      percent(held[CAT_UP] + held[CAT_GONE], total[CAT_UP] + total[CAT_GONE]),
      percent(held[CAT_GONE], total[CAT_GONE]),
      percent(held[CAT_CONTROL], total[CAT_CONTROL]), c.events,
      c.requests + c.answers, wall, r->cpu_base + cpu_secs(), maxrss_mib(),
      rss_nodes);
}

/* The process's side: the log, line-buffered rows, signals that stop a
 * run at its next row. */
static void process_setup(int log_level) {
  bee_log_set_level(log_level);
  setvbuf(stdout, NULL, _IOLBF, 0); /* rows show as they come, in a file too */
  struct sigaction sa = {.sa_handler = on_stop_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
}

/* Frees the run (the arena's memory goes with the process anyway, but a
 * run without one is checked by the sanitizers). */
static void run_free(run *r) {
  r->closing = true;
  dhtsim_free(r->s);
  free(r->all.rounds.v);
  free(r->all.msgs.v);
  free(r->all.ms.v);
  free(r->cur.rounds.v);
  free(r->cur.msgs.v);
  free(r->cur.ms.v);
  free(r->recs);
  free(r->puts);
  free(r->q);
  free(r->live);
  free(r->pos);
  free(r->immortal);
  free(r);
}

/* Carries on the run saved in resume_path, with this process's options
 * (budgets, --stop-at, --checkpoint, --log) from o. */
static int resume(const options *o) {
  double t = secs();
  const char *why = NULL;
  run *r = arena_load(resume_path, &why);
  if (!r) {
    fprintf(stderr, "dhtsim-scale: cannot resume from %s: %s\n", resume_path,
            why);
    return 1;
  }
  if (sodium_init() < 0) {
    fprintf(stderr, "dhtsim-scale: libsodium cannot start\n");
    return 1;
  }
  process_setup(o->log_level);
  r->o.max_wall_s = o->max_wall_s;
  r->o.max_rss_mib = o->max_rss_mib;
  r->o.max_cpu_s = o->max_cpu_s;
  r->o.stop_at_h = o->stop_at_h;
  r->o.log_level = o->log_level;
  r->wall_base = r->wall_saved;
  r->cpu_base = r->cpu_saved;
  r->wall0 = t;
  printf("# resumed from %s at hour %.2f of %g (%.0f MiB read in %.1f s; "
         "%.0f s of CPU before)\n",
         resume_path, (double)(dhtsim_now(r->s) - r->t0) / HOUR_MS, r->o.hours,
         (double)arena_used() / (1024.0 * 1024.0), secs() - t, r->cpu_base);
  r->wall_prev = secs();
  r->cpu_prev = cpu_secs();
  churn_loop(r);
  summary(r);
  run_free(r);
  return 0;
}

int main(int argc, char **argv) {
  options o;
  if (parse_args(argc, argv, &o) != 0) {
    usage(stderr);
    return 2;
  }
  if (ckpt_path || resume_path) {
    int rc = arena_fixed_layout(argv);
    if (rc != 0) {
      fprintf(stderr,
              "dhtsim-scale: cannot turn address randomization off (%s); "
              "--checkpoint and --resume need it\n",
              strerror(-rc));
      return 3;
    }
  }
  if (resume_path)
    return resume(&o);
  /* From here every allocation is in the arena (when there is one), so a
   * checkpoint holds the whole run. */
  int rc = arena_start();
  if (rc != 0 && ckpt_path) {
    fprintf(stderr, "dhtsim-scale: --checkpoint needs the arena: %s\n",
            rc == -ENOTSUP ? "this build (AddressSanitizer) has none"
                           : strerror(-rc));
    return 3;
  }
  run *r = xrealloc(NULL, sizeof *r);
  memset(r, 0, sizeof *r);
  r->o = o;
  process_setup(r->o.log_level);
  r->wall0 = r->wall_prev = secs();
  dht_config cfg;
  dht_config_default(&cfg);
  if (r->o.refresh_min > 0)
    cfg.refresh_ms = (uint64_t)(r->o.refresh_min * MINUTE_MS);
  if (r->o.republish_min > 0)
    cfg.republish_ms = (uint64_t)(r->o.republish_min * MINUTE_MS);
  print_config(r, &cfg);
  r->rss0 = rss_mib();
  r->s = dhtsim_new(r->o.nodes, r->o.seed, &cfg);
  if (!r->s) {
    fprintf(stderr, "dhtsim-scale: cannot make the network\n");
    free(r);
    return 1;
  }
  dhtsim_set_latency(r->s, r->o.lat_min, r->o.lat_max);
  dhtsim_set_loss(r->s, r->o.loss);
  for (size_t i = 0; i < r->o.nodes; i++)
    live_add(r, i);
  rc = 1;
  if (join_all(r) != 0)
    goto out;
  /* What one joined node costs: the cores, their routing tables and the
   * simulator's own node struct, before any record is stored. */
  r->per_node = (rss_mib() - r->rss0) * 1024 * 1024 / (double)r->o.nodes;
  printf("# memory after the joins: RSS %.0f MiB, %.0f bytes per node\n",
         rss_mib(), r->per_node);
  if (put_records(r) != 0) {
    fprintf(stderr, "dhtsim-scale: puts still pending\n");
    goto out;
  }
  r->t0 = dhtsim_now(r->s);
  r->end = r->t0 + (uint64_t)(r->o.hours * HOUR_MS);
  dhtsim_counters_get(r->s, &r->c_prev);
  printf("# setup took %.1f s wall, %.1f s cpu\n", secs() - r->wall0,
         cpu_secs());
  print_header();
  r->wall_prev = secs();
  r->cpu_prev = cpu_secs();
  churn(r);
  summary(r);
  rc = 0;
out:
  run_free(r);
  return rc;
}
