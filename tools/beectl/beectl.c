/* beectl.c: the key, token and revocation tool for beed swarms.
 *
 * Makes node and moderator keys, issues and inspects moderator-signed
 * access tokens, and keeps a swarm's signed revocation list.  It is a thin
 * front end over proto's identity and token functions; see README.md for
 * the commands and the file formats.
 *
 * Exit status: 0 on success, 1 when an operation fails (the message names
 * the file and the reason), 2 on bad usage (the message names the flag).
 */
#include "beectl.h"
#include "bee-config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DURATION_S (36525ull * 86400) /* 100 years */

static const char usage_text[] =
    "usage: beectl COMMAND [ARGS]\n"
    "\n"
    "  keygen [--moderator] --out FILE\n"
    "      Create a new secret key file (mode 0600; never overwrites).\n"
    "  pubkey --key FILE\n"
    "      Print the public key and peer id of a key file.\n"
    "  token issue --moderator-key FILE --swarm NAME --peer PUBKEY\n"
    "              --role bee|monitor|aux --expires DURATION --out FILE\n"
    "      Sign an access token valid from now for DURATION (Ns, Nm, Nh, Nd).\n"
    "  token show FILE [--moderator PUBKEY [--swarm NAME] [--peer PUBKEY]]\n"
    "      Print a token; with --moderator also check it (swarm and peer\n"
    "      default to the token's own).\n"
    "  revoke --moderator-key FILE --swarm NAME --peer PUBKEY --list FILE\n"
    "      Add a peer to the swarm's revocation list (created if missing).\n"
    "  revocation show FILE --moderator PUBKEY --swarm NAME\n"
    "      Check and print a revocation list.\n"
    "  dht get KEY [--latest] | put KEY VALUE --ttl DURATION [--plain] | peers\n"
    "      --join HOST:PORT --swarm NAME (--open | --moderator PUBKEY\n"
    "      --token FILE) --identity FILE\n"
    "      Use a swarm's DHT through any of its peers, as a client node.\n"
    "      put stores VALUE under the caller's own signed subkey of KEY\n"
    "      (--plain: as the key's plain value).\n"
    "  status [--control PATH] | leave [--control PATH]\n"
    "      Ask the beed on this machine (started with --control PATH;\n"
    "      default beed.sock) for its state, or to leave the swarm cleanly.\n"
    "  --help, --version\n"
    "\n"
    "PUBKEY is 64 hex digits, as printed by keygen and pubkey.\n";

void beectl_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("beectl: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* Reports a runtime failure on file and returns the exit status. */
static int fail(const char *file, int rc) {
  beectl_errorf("%s: %s", file, bee_strerror(rc));
  return 1;
}

/* ---- flags ------------------------------------------------------------- */

static flag *find_flag(args *a, const char *name, size_t len) {
  for (size_t i = 0; i < a->nflags; i++)
    if (strlen(a->flags[i].name) == len &&
        memcmp(a->flags[i].name, name, len) == 0)
      return &a->flags[i];
  return NULL;
}

int beectl_parse_args(args *a, int argc, char **argv, size_t npos_max) {
  a->npos = 0;
  for (int i = 0; i < argc; i++) {
    const char *s = argv[i];
    if (strncmp(s, "--", 2) != 0 || s[2] == 0) {
      if (a->npos >= npos_max) {
        beectl_errorf("unexpected argument '%s'", s);
        return EXIT_USAGE;
      }
      a->pos[a->npos++] = s;
      continue;
    }
    const char *eq = strchr(s, '=');
    size_t len = eq ? (size_t)(eq - s) : strlen(s);
    flag *f = find_flag(a, s, len);
    if (!f) {
      beectl_errorf("unknown flag '%.*s'", (int)len, s);
      return EXIT_USAGE;
    }
    if (f->set) {
      beectl_errorf("%s given twice", f->name);
      return EXIT_USAGE;
    }
    f->set = true;
    if (!f->has_value) {
      if (eq) {
        beectl_errorf("%s takes no value", f->name);
        return EXIT_USAGE;
      }
      continue;
    }
    if (eq) {
      f->value = eq + 1;
    } else if (i + 1 < argc) {
      f->value = argv[++i];
    } else {
      beectl_errorf("%s needs a value", f->name);
      return EXIT_USAGE;
    }
    if (!*f->value) {
      beectl_errorf("%s needs a non-empty value", f->name);
      return EXIT_USAGE;
    }
  }
  for (size_t i = 0; i < a->nflags; i++)
    if (a->flags[i].required && !a->flags[i].set) {
      beectl_errorf("missing %s", a->flags[i].name);
      return EXIT_USAGE;
    }
  return 0;
}

int beectl_parse_pk(const flag *f, uint8_t pk[PROTO_PK_BYTES]) {
  if (proto_unhex(f->value, pk, PROTO_PK_BYTES) != 0) {
    beectl_errorf("%s: expected a public key of %d hex digits", f->name,
           2 * PROTO_PK_BYTES);
    return EXIT_USAGE;
  }
  return 0;
}

int beectl_parse_swarm(const flag *f) {
  if (!proto_swarm_valid(f->value)) {
    beectl_errorf("%s: a swarm name is 1 to %d characters of A-Z a-z 0-9 . _ -",
           f->name, PROTO_SWARM_MAX);
    return EXIT_USAGE;
  }
  return 0;
}

/* Parses "N" followed by s, m, h or d into seconds, 0 < secs < 100 years.
 * Returns 0 or -1. */
int beectl_parse_duration(const char *s, uint64_t *secs) {
  uint64_t n = 0, mult;
  const char *p = s;
  if (*p < '0' || *p > '9')
    return -1;
  for (; *p >= '0' && *p <= '9'; p++) {
    n = n * 10 + (uint64_t)(*p - '0');
    if (n >= MAX_DURATION_S)
      return -1;
  }
  switch (*p) {
  case 's': mult = 1; break;
  case 'm': mult = 60; break;
  case 'h': mult = 3600; break;
  case 'd': mult = 86400; break;
  default: return -1;
  }
  if (p[1] != 0 || n == 0 || n * mult >= MAX_DURATION_S)
    return -1;
  *secs = n * mult;
  return 0;
}

/* ---- printing ---------------------------------------------------------- */

static uint64_t now_s(void) {
  time_t t = time(NULL);
  return t < 0 ? 0 : (uint64_t)t;
}

static void print_time(const char *label, uint64_t t) {
  struct tm tm;
  char buf[64];
  time_t tt = (time_t)(t <= 253402300799u ? t : 0); /* up to year 9999 */
  if (t <= 253402300799u && gmtime_r(&tt, &tm) &&
      strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm) > 0)
    printf("%s %s\n", label, buf);
  else
    printf("%s @%" PRIu64 "\n", label, t);
}

static void print_hex(const char *label, const uint8_t *p, size_t n) {
  char hex[2 * PROTO_PK_BYTES + 1];
  proto_hex(p, n, hex);
  printf("%s %s\n", label, hex);
}

/* Prints a swarm name from a file, escaping bytes a terminal would act on. */
static void print_swarm(const char *s) {
  fputs("swarm ", stdout);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p == 0x7f || *p == '\\')
      printf("\\x%02x", *p);
    else
      putchar(*p);
  }
  putchar('\n');
}

static void print_pub(const uint8_t pk[PROTO_PK_BYTES]) {
  uint8_t id[PROTO_ID_BYTES];
  proto_peer_id(pk, id);
  print_hex("public-key", pk, PROTO_PK_BYTES);
  print_hex("peer-id", id, PROTO_ID_BYTES);
}

static void print_token(const proto_token *t) {
  uint8_t id[PROTO_ID_BYTES];
  proto_peer_id(t->peer_pk, id);
  print_swarm(t->swarm);
  print_hex("peer", t->peer_pk, PROTO_PK_BYTES);
  print_hex("peer-id", id, PROTO_ID_BYTES);
  printf("role %s\n", proto_role_name(t->role));
  print_time("issued", t->issued);
  print_time("expires", t->expires);
  print_hex("moderator", t->moderator_pk, PROTO_PK_BYTES);
}

/* ---- commands ---------------------------------------------------------- */

static int cmd_keygen(int argc, char **argv) {
  flag fl[] = {{"--moderator", false, false, false, NULL},
               {"--out", true, true, false, NULL}};
  args a = {fl, sizeof fl / sizeof fl[0], {NULL}, 0};
  proto_identity id;
  int rc;
  if ((rc = beectl_parse_args(&a, argc, argv, 0)))
    return rc;
  proto_identity_generate(&id);
  rc = proto_identity_save(&id, fl[1].value);
  if (rc == -EEXIST) {
    beectl_errorf("%s: %s (refusing to overwrite)", fl[1].value, bee_strerror(rc));
    rc = 1;
    goto out;
  }
  if (rc) {
    rc = fail(fl[1].value, rc);
    goto out;
  }
  if (fl[0].set)
    printf("# moderator key: nodes check tokens against its public key\n");
  print_pub(id.pk);
out:
  proto_identity_clear(&id);
  return rc;
}

static int cmd_pubkey(int argc, char **argv) {
  flag fl[] = {{"--key", true, true, false, NULL}};
  args a = {fl, sizeof fl / sizeof fl[0], {NULL}, 0};
  proto_identity id;
  int rc;
  if ((rc = beectl_parse_args(&a, argc, argv, 0)))
    return rc;
  if ((rc = proto_identity_load(&id, fl[0].value, false)))
    return fail(fl[0].value, rc);
  print_pub(id.pk);
  proto_identity_clear(&id);
  return 0;
}

static int cmd_token_issue(int argc, char **argv) {
  flag fl[] = {{"--moderator-key", true, true, false, NULL},
               {"--swarm", true, true, false, NULL},
               {"--peer", true, true, false, NULL},
               {"--role", true, true, false, NULL},
               {"--expires", true, true, false, NULL},
               {"--out", true, true, false, NULL}};
  args a = {fl, sizeof fl / sizeof fl[0], {NULL}, 0};
  uint8_t peer[PROTO_PK_BYTES];
  proto_identity mod;
  proto_token tok;
  uint64_t dur, now = now_s();
  int role, rc;
  if ((rc = beectl_parse_args(&a, argc, argv, 0)) || (rc = beectl_parse_swarm(&fl[1])) ||
      (rc = beectl_parse_pk(&fl[2], peer)))
    return rc;
  if (proto_role_parse(fl[3].value, &role)) {
    beectl_errorf("--role: expected bee, monitor or aux, not '%s'", fl[3].value);
    return EXIT_USAGE;
  }
  if (beectl_parse_duration(fl[4].value, &dur)) {
    beectl_errorf("--expires: expected a duration like 30d, 12h, 90m or 3600s, "
           "above zero and under 100 years");
    return EXIT_USAGE;
  }
  if ((rc = proto_identity_load(&mod, fl[0].value, false)))
    return fail(fl[0].value, rc);
  rc = proto_token_issue(&tok, &mod, fl[1].value, peer, role, now, now + dur);
  proto_identity_clear(&mod);
  if (rc) {
    beectl_errorf("issuing the token: %s", bee_strerror(rc));
    return 1;
  }
  if ((rc = proto_token_save(&tok, fl[5].value)))
    return fail(fl[5].value, rc);
  print_token(&tok);
  return 0;
}

static int cmd_token_show(int argc, char **argv) {
  flag fl[] = {{"--moderator", true, false, false, NULL},
               {"--swarm", true, false, false, NULL},
               {"--peer", true, false, false, NULL}};
  args a = {fl, sizeof fl / sizeof fl[0], {NULL}, 0};
  uint8_t mod[PROTO_PK_BYTES], peer[PROTO_PK_BYTES];
  proto_token tok;
  int rc;
  if ((rc = beectl_parse_args(&a, argc, argv, 1)))
    return rc;
  if (a.npos != 1) {
    beectl_errorf("token show: missing the token FILE");
    return EXIT_USAGE;
  }
  if (!fl[0].set && (fl[1].set || fl[2].set)) {
    beectl_errorf("%s needs --moderator", fl[1].set ? "--swarm" : "--peer");
    return EXIT_USAGE;
  }
  if ((fl[0].set && (rc = beectl_parse_pk(&fl[0], mod))) ||
      (fl[1].set && (rc = beectl_parse_swarm(&fl[1]))) ||
      (fl[2].set && (rc = beectl_parse_pk(&fl[2], peer))))
    return rc;
  if ((rc = proto_token_load(&tok, a.pos[0])))
    return fail(a.pos[0], rc);
  print_token(&tok);
  if (!fl[0].set)
    return 0;
  rc = proto_token_verify(&tok, mod, fl[1].set ? fl[1].value : tok.swarm,
                          fl[2].set ? peer : tok.peer_pk, PROTO_ROLES_ALL,
                          now_s(), NULL);
  if (rc) {
    printf("verify failed: %s\n", bee_strerror(rc));
    return 1;
  }
  printf("verify ok\n");
  return 0;
}

static int cmd_revoke(int argc, char **argv) {
  flag fl[] = {{"--moderator-key", true, true, false, NULL},
               {"--swarm", true, true, false, NULL},
               {"--peer", true, true, false, NULL},
               {"--list", true, true, false, NULL}};
  args a = {fl, sizeof fl / sizeof fl[0], {NULL}, 0};
  uint8_t peer[PROTO_PK_BYTES];
  proto_identity mod;
  proto_revocation rl;
  bool listed;
  int rc;
  if ((rc = beectl_parse_args(&a, argc, argv, 0)) || (rc = beectl_parse_swarm(&fl[1])) ||
      (rc = beectl_parse_pk(&fl[2], peer)))
    return rc;
  if ((rc = proto_identity_load(&mod, fl[0].value, false)))
    return fail(fl[0].value, rc);
  rc = proto_revocation_load(&rl, fl[3].value, mod.pk, fl[1].value);
  if (rc == -ENOENT) { /* first revocation in this swarm: a new list */
    proto_revocation_init(&rl);
    memcpy(rl.swarm, fl[1].value, strlen(fl[1].value) + 1);
    memcpy(rl.moderator_pk, mod.pk, PROTO_PK_BYTES);
    rc = 0;
  }
  if (rc) {
    rc = fail(fl[3].value, rc);
    goto out;
  }
  if (rl.seq == UINT64_MAX) {
    rc = fail(fl[3].value, BEE_ERANGE);
    goto out;
  }
  listed = proto_revocation_has(&rl, peer);
  if ((rc = proto_revocation_add(&rl, peer))) {
    rc = fail(fl[3].value, rc);
    goto out;
  }
  rl.seq++;
  rl.issued = now_s();
  if ((rc = proto_revocation_save(&rl, &mod, fl[3].value))) {
    rc = fail(fl[3].value, rc);
    goto out;
  }
  print_hex(listed ? "revoked (already listed)" : "revoked", peer,
            PROTO_PK_BYTES);
  printf("seq %" PRIu64 "\nkeys %zu\n", rl.seq, rl.n);
out:
  proto_revocation_close(&rl);
  proto_identity_clear(&mod);
  return rc;
}

static int cmd_revocation_show(int argc, char **argv) {
  flag fl[] = {{"--moderator", true, true, false, NULL},
               {"--swarm", true, true, false, NULL}};
  args a = {fl, sizeof fl / sizeof fl[0], {NULL}, 0};
  uint8_t mod[PROTO_PK_BYTES];
  proto_revocation rl;
  int rc;
  if ((rc = beectl_parse_args(&a, argc, argv, 1)))
    return rc;
  if (a.npos != 1) {
    beectl_errorf("revocation show: missing the list FILE");
    return EXIT_USAGE;
  }
  if ((rc = beectl_parse_pk(&fl[0], mod)) || (rc = beectl_parse_swarm(&fl[1])))
    return rc;
  if ((rc = proto_revocation_load(&rl, a.pos[0], mod, fl[1].value)))
    return fail(a.pos[0], rc);
  print_swarm(rl.swarm);
  print_hex("moderator", rl.moderator_pk, PROTO_PK_BYTES);
  printf("seq %" PRIu64 "\n", rl.seq);
  print_time("issued", rl.issued);
  printf("keys %zu\n", rl.n);
  for (size_t i = 0; i < rl.n; i++)
    print_hex("revoked", rl.keys[i], PROTO_PK_BYTES);
  proto_revocation_close(&rl);
  return 0;
}

int main(int argc, char **argv) {
  const char *cmd = argc > 1 ? argv[1] : NULL;
  const char *sub = argc > 2 ? argv[2] : "";
  int rc;
  if (!cmd) {
    fputs(usage_text, stderr);
    return EXIT_USAGE;
  }
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    printf("beectl %s\n", BEE_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "keygen"))
    rc = cmd_keygen(argc - 2, argv + 2);
  else if (!strcmp(cmd, "pubkey"))
    rc = cmd_pubkey(argc - 2, argv + 2);
  else if (!strcmp(cmd, "token") && !strcmp(sub, "issue"))
    rc = cmd_token_issue(argc - 3, argv + 3);
  else if (!strcmp(cmd, "token") && !strcmp(sub, "show"))
    rc = cmd_token_show(argc - 3, argv + 3);
  else if (!strcmp(cmd, "revoke"))
    rc = cmd_revoke(argc - 2, argv + 2);
  else if (!strcmp(cmd, "revocation") && !strcmp(sub, "show"))
    rc = cmd_revocation_show(argc - 3, argv + 3);
  else if (!strcmp(cmd, "dht"))
    rc = beectl_dht(argc - 2, argv + 2);
  else if (!strcmp(cmd, "links"))
    rc = beectl_dht(argc - 1, argv + 1);
  else if (!strcmp(cmd, "status") || !strcmp(cmd, "leave"))
    rc = beectl_control(cmd, argc - 2, argv + 2);
  else if (!strcmp(cmd, "token") || !strcmp(cmd, "revocation")) {
    beectl_errorf("unknown %s command '%s'", cmd, sub);
    rc = EXIT_USAGE;
  } else {
    beectl_errorf("unknown command '%s'", cmd);
    rc = EXIT_USAGE;
  }
  if (rc == EXIT_USAGE)
    fputs("Try 'beectl --help'.\n", stderr);
  return rc;
}
