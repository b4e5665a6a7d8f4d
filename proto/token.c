/* token.c: moderator-signed access tokens and revocation lists.
 *
 * A token is the msgpack array
 *   [1, 30, swarm, peer_pk, role, issued, expires, moderator_pk, sig]
 * and a revocation list is
 *   [1, 31, swarm, moderator_pk, seq, issued, [key...], sig]
 * Each signature is Ed25519 by the moderator over a domain string ("beed
 * token v1", "beed revocation v1") followed by the canonical encoding of
 * the same array without its sig element.  Verification rebuilds that
 * encoding from the decoded fields instead of trusting the received bytes,
 * so the signature always covers exactly the values we act on.
 *
 * Token and list files are one text line each, "beed-token-v1 <base64>" or
 * "beed-revocation-v1 <base64>", with '#' comments and blank lines allowed.
 */
#include "proto-int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sodium.h>

#define TOKEN_DOMAIN "beed token v1"
#define REVOCATION_DOMAIN "beed revocation v1"
#define TOKEN_MAGIC "beed-token-v1"
#define REVOCATION_MAGIC "beed-revocation-v1"
#define TOKEN_FILE_MAX (64u << 10)
#define REVOCATION_FILE_MAX (4u << 20)
/* Largest encoding of a list less its keys: array head (3), swarm (str 32
 * header + name), moderator key (34), seq and issued (9 each), keys array
 * header (5) and signature (66).  Each key adds a bin 8 header and 32. */
#define RL_FIXED_MAX (3 + 5 + PROTO_SWARM_MAX + 34 + 9 + 9 + 5 + 66)

/* ---- roles ------------------------------------------------------------- */

const char *proto_role_name(int role) {
  switch (role) {
  case PROTO_ROLE_BEE: return "bee";
  case PROTO_ROLE_MONITOR: return "monitor";
  case PROTO_ROLE_AUX: return "aux";
  default: return "?";
  }
}

int proto_role_parse(const char *s, int *role) {
  static const int roles[] = {PROTO_ROLE_BEE, PROTO_ROLE_MONITOR,
                              PROTO_ROLE_AUX};
  for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
    if (strcmp(s, proto_role_name(roles[i])) == 0) {
      *role = roles[i];
      return 0;
    }
  return BEE_ECONFIG;
}

static bool role_valid(uint64_t role) {
  return role == PROTO_ROLE_BEE || role == PROTO_ROLE_MONITOR ||
         role == PROTO_ROLE_AUX;
}

/* ---- shared decoding helpers ------------------------------------------- */

/* Reads a swarm name: a str of 1..PROTO_SWARM_MAX bytes without NUL (it is
 * kept as a C string, and a NUL would make two names compare equal). */
static int rd_swarm(proto_rd *r, char out[PROTO_SWARM_MAX + 1]) {
  proto_bytes b;
  int rc = proto__rd_str(r, &b, PROTO_SWARM_MAX);
  if (rc)
    return rc;
  if (b.n == 0 || memchr(b.p, 0, b.n))
    return BEE_ERANGE;
  memcpy(out, b.p, b.n);
  out[b.n] = 0;
  return 0;
}

static int check_swarm(const char *swarm) {
  size_t n = strlen(swarm);
  if (n == 0)
    return BEE_ERANGE;
  return n > PROTO_SWARM_MAX ? BEE_ETOOBIG : 0;
}

bool proto_swarm_valid(const char *name) {
  size_t n = strlen(name);
  if (n < 1 || n > PROTO_SWARM_MAX)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  }
  return true;
}

/* Reads the file at path (at most max bytes) and base64-decodes its
 * payload into a heap buffer (*out, freed by the caller). */
static int load_b64(const char *path, size_t max, const char *magic,
                    uint8_t **out, size_t *out_len) {
  uint8_t *file = NULL, *bin = NULL;
  size_t len, off = 0, n = 0;
  int rc = proto_read_file(path, max, &file, &len);
  if (rc)
    return rc;
  if ((rc = proto__text_line((const char *)file, len, magic, &off, &n)))
    goto out;
  size_t cap = n / 4 * 3 + 3;
  if (!(bin = malloc(cap))) {
    rc = -ENOMEM;
    goto out;
  }
  if (sodium_base642bin(bin, cap, (const char *)file + off, n, NULL, out_len,
                        NULL, sodium_base64_VARIANT_ORIGINAL) != 0) {
    rc = BEE_EKEYFILE;
    goto out;
  }
  *out = bin;
  bin = NULL;
out:
  free(bin);
  free(file);
  return rc;
}

/* Writes "magic <base64 of p>\n" to path (mode 0644, atomic replace). */
static int save_b64(const char *path, const char *magic, const uint8_t *p,
                    size_t n) {
  size_t ml = strlen(magic);
  size_t b64 = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
  char *text = malloc(ml + 1 + b64 + 1);
  if (!text)
    return -ENOMEM;
  memcpy(text, magic, ml);
  text[ml] = ' ';
  sodium_bin2base64(text + ml + 1, b64, p, n, sodium_base64_VARIANT_ORIGINAL);
  size_t len = ml + 1 + strlen(text + ml + 1);
  text[len++] = '\n';
  int rc = proto_write_file(path, text, len, 0644, false);
  free(text);
  return rc;
}

/* ---- tokens ------------------------------------------------------------ */

/* Writes the token array; with_sig false gives the signed-over form. */
static void token_wr(proto_wr *w, const proto_token *t, bool with_sig) {
  proto__wr_head(w, PROTO_T_TOKEN, with_sig ? 7 : 6);
  proto__wr_str(w, t->swarm, strlen(t->swarm));
  proto__wr_bin(w, t->peer_pk, PROTO_PK_BYTES);
  proto__wr_uint(w, (uint64_t)t->role);
  proto__wr_uint(w, t->issued);
  proto__wr_uint(w, t->expires);
  proto__wr_bin(w, t->moderator_pk, PROTO_PK_BYTES);
  if (with_sig)
    proto__wr_bin(w, t->sig, PROTO_SIG_BYTES);
}

/* Builds the signed message (domain + canonical unsigned array) in buf. */
static int token_signed_msg(const proto_token *t, uint8_t *buf, size_t cap,
                            size_t *len) {
  size_t dl = sizeof TOKEN_DOMAIN - 1;
  proto_wr w;
  memcpy(buf, TOKEN_DOMAIN, dl);
  proto__wr_init(&w, buf + dl, cap - dl);
  token_wr(&w, t, false);
  if (w.err)
    return w.err;
  *len = dl + w.len;
  return 0;
}

/* Checks the arguments as the decoder would (swarm 1..PROTO_SWARM_MAX
 * bytes, one valid role, expires not before issued), so every token issued
 * decodes. */
int proto_token_issue(proto_token *out, const proto_identity *moderator,
                      const char *swarm, const uint8_t peer_pk[PROTO_PK_BYTES],
                      int role, uint64_t issued, uint64_t expires) {
  uint8_t msg[sizeof TOKEN_DOMAIN + PROTO_TOKEN_MAX];
  size_t len;
  proto_wr w;
  int rc = check_swarm(swarm);
  if (rc)
    return rc;
  if (!proto_swarm_valid(swarm)) /* no daemon would run in it */
    return BEE_ERANGE;
  if (role < 0 || !role_valid((uint64_t)role) || expires < issued)
    return BEE_ERANGE;
  memset(out, 0, sizeof *out);
  memcpy(out->swarm, swarm, strlen(swarm));
  memcpy(out->peer_pk, peer_pk, PROTO_PK_BYTES);
  memcpy(out->moderator_pk, moderator->pk, PROTO_PK_BYTES);
  out->role = role;
  out->issued = issued;
  out->expires = expires;
  if ((rc = token_signed_msg(out, msg, sizeof msg, &len)))
    return rc;
  crypto_sign_detached(out->sig, NULL, msg, len, moderator->sk);
  proto__wr_init(&w, out->raw, sizeof out->raw);
  token_wr(&w, out, true);
  if (w.err)
    return w.err;
  out->raw_len = w.len;
  return 0;
}

/* Only the canonical encoding is accepted (BEE_ERANGE otherwise), so a
 * token's bytes are exactly what its moderator produced and cannot be
 * reshaped by anyone on the way.  On failure *out is zeroed, so a
 * half-decoded token is never used. */
int proto_token_decode(const uint8_t *buf, size_t len, proto_token *out) {
  proto_rd r;
  proto_wr w;
  uint64_t role;
  int type, rc;
  memset(out, 0, sizeof *out);
  if (len > PROTO_TOKEN_MAX)
    return BEE_ETOOBIG;
  proto__rd_init(&r, buf, len);
  if ((rc = proto__rd_head(&r, PROTO_T_TOKEN, 7, &type)) ||
      (rc = rd_swarm(&r, out->swarm)) ||
      (rc = proto__rd_fixbin(&r, out->peer_pk, PROTO_PK_BYTES)) ||
      (rc = proto__rd_uint(&r, &role)))
    goto out;
  if (!role_valid(role)) {
    rc = BEE_ERANGE;
    goto out;
  }
  out->role = (int)role;
  if ((rc = proto__rd_uint(&r, &out->issued)) ||
      (rc = proto__rd_uint(&r, &out->expires)))
    goto out;
  if (out->expires < out->issued) {
    rc = BEE_ERANGE;
    goto out;
  }
  if ((rc = proto__rd_fixbin(&r, out->moderator_pk, PROTO_PK_BYTES)) ||
      (rc = proto__rd_fixbin(&r, out->sig, PROTO_SIG_BYTES)) ||
      (rc = proto__rd_end(&r)))
    goto out;
  proto__wr_init(&w, out->raw, sizeof out->raw);
  token_wr(&w, out, true);
  if (w.err || w.len != len || memcmp(out->raw, buf, len) != 0) {
    rc = BEE_ERANGE; /* not the canonical encoding */
    goto out;
  }
  out->raw_len = len;
out:
  if (rc)
    memset(out, 0, sizeof *out);
  return rc;
}

/* The checks run in the order proto.h lists, so a refusal names the first
 * thing wrong.  The signature comes before swarm, peer, role and times, so
 * those reasons are only ever given about values the moderator signed. */
int proto_token_verify(const proto_token *tok,
                       const uint8_t moderator_pk[PROTO_PK_BYTES],
                       const char *swarm, const uint8_t peer_pk[PROTO_PK_BYTES],
                       int accept_roles, uint64_t now,
                       const proto_revocation *rl) {
  uint8_t msg[sizeof TOKEN_DOMAIN + PROTO_TOKEN_MAX];
  size_t len;
  if (memcmp(tok->moderator_pk, moderator_pk, PROTO_PK_BYTES) != 0)
    return BEE_ETOKEN_MODERATOR;
  /* A token whose fields cannot be encoded was never signed by anyone. */
  if (check_swarm(tok->swarm) || token_signed_msg(tok, msg, sizeof msg, &len) ||
      crypto_sign_verify_detached(tok->sig, msg, len, moderator_pk) != 0)
    return BEE_ETOKEN_FORGED;
  if (strcmp(tok->swarm, swarm) != 0)
    return BEE_ETOKEN_SWARM;
  if (memcmp(tok->peer_pk, peer_pk, PROTO_PK_BYTES) != 0)
    return BEE_ETOKEN_PEER;
  if ((tok->role & accept_roles) == 0)
    return BEE_ETOKEN_ROLE;
  if (tok->issued > now && tok->issued - now > PROTO_CLOCK_SKEW_S)
    return BEE_ETOKEN_EARLY;
  if (tok->expires <= now)
    return BEE_ETOKEN_EXPIRED;
  if (rl && proto_revocation_has(rl, peer_pk))
    return BEE_EREVOKED;
  return 0;
}

bool proto_file_changed(proto_file_watch *w, const char *path, int *err) {
  struct stat st;
  *err = 0;
  if (stat(path, &st) < 0) {
    if (!w->failed)
      *err = -errno;
    w->failed = true;
    w->error = -errno;
    return false;
  }
  proto_file_watch now = {.dev = (uint64_t)st.st_dev,
                          .ino = (uint64_t)st.st_ino,
                          .size = (uint64_t)st.st_size,
                          .mtime_s = (uint64_t)st.st_mtim.tv_sec,
                          .mtime_ns = (uint64_t)st.st_mtim.tv_nsec};
  bool was_failed = w->failed;
  w->failed = false;
  if (!was_failed && now.dev == w->dev && now.ino == w->ino &&
      now.size == w->size && now.mtime_s == w->mtime_s &&
      now.mtime_ns == w->mtime_ns)
    return false;
  *w = now;
  return true;
}

int proto_token_renewal(const char *path, const proto_token *cur,
                        const uint8_t moderator_pk[PROTO_PK_BYTES],
                        const char *swarm, const uint8_t pk[PROTO_PK_BYTES],
                        int accept_roles, uint64_t now,
                        const proto_revocation *rl, proto_token *out) {
  int rc = proto_token_load(out, path);
  if (rc) {
    sodium_memzero(out, sizeof *out);
    return rc;
  }
  if ((rc = proto_token_verify(out, moderator_pk, swarm, pk, accept_roles, now,
                               rl)))
    return rc;
  if (out->role != cur->role)
    return BEE_ETOKEN_ROLE;
  return out->raw_len == cur->raw_len &&
                 memcmp(out->raw, cur->raw, cur->raw_len) == 0
             ? 0
             : 1;
}

unsigned proto_token_warnings_due(int64_t left) {
  static const int64_t at[] = {86400, 6 * 3600, 3600, 600, 0};
  unsigned k = 0;
  while (k < sizeof at / sizeof at[0] && left <= at[k])
    k++;
  return k;
}

int proto_token_save(const proto_token *tok, const char *path) {
  if (tok->raw_len == 0 || tok->raw_len > PROTO_TOKEN_MAX)
    return BEE_ERANGE;
  return save_b64(path, TOKEN_MAGIC, tok->raw, tok->raw_len);
}

int proto_token_load(proto_token *out, const char *path) {
  uint8_t *bin = NULL;
  size_t len;
  int rc = load_b64(path, TOKEN_FILE_MAX, TOKEN_MAGIC, &bin, &len);
  if (rc)
    return rc;
  rc = proto_token_decode(bin, len, out);
  free(bin);
  return rc;
}

/* ---- revocation lists -------------------------------------------------- */

void proto_revocation_init(proto_revocation *rl) { memset(rl, 0, sizeof *rl); }

void proto_revocation_close(proto_revocation *rl) {
  free(rl->keys);
  free(rl->raw);
  proto_revocation_init(rl);
}

/* Index of the first key not below pk; *found tells an exact match. */
static size_t rl_search(const proto_revocation *rl,
                        const uint8_t pk[PROTO_PK_BYTES], bool *found) {
  size_t lo = 0, hi = rl->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = memcmp(rl->keys[mid], pk, PROTO_PK_BYTES);
    if (c == 0) {
      *found = true;
      return mid;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *found = false;
  return lo;
}

bool proto_revocation_has(const proto_revocation *rl,
                          const uint8_t pk[PROTO_PK_BYTES]) {
  bool found;
  rl_search(rl, pk, &found);
  return found;
}

int proto_revocation_add(proto_revocation *rl,
                         const uint8_t pk[PROTO_PK_BYTES]) {
  bool found;
  size_t i = rl_search(rl, pk, &found);
  if (found)
    return 0;
  if (rl->n >= PROTO_REVOKED_MAX)
    return BEE_ETOOBIG;
  free(rl->raw); /* no longer what the moderator signed */
  rl->raw = NULL;
  rl->raw_len = 0;
  /* Lists change rarely (one revocation at a time), so grow by one. */
  uint8_t(*keys)[PROTO_PK_BYTES] =
      realloc(rl->keys, (rl->n + 1) * sizeof *rl->keys);
  if (!keys)
    return -ENOMEM;
  memmove(keys + i + 1, keys + i, (rl->n - i) * sizeof *keys);
  memcpy(keys[i], pk, PROTO_PK_BYTES);
  rl->keys = keys;
  rl->n++;
  return 0;
}

static size_t rl_encoded_max(size_t n) {
  return RL_FIXED_MAX + n * (2 + PROTO_PK_BYTES);
}

/* Writes the list array with moderator_pk as its moderator field;
 * with_sig false gives the signed-over form. */
static void rl_wr(proto_wr *w, const proto_revocation *rl,
                  const uint8_t moderator_pk[PROTO_PK_BYTES],
                  const uint8_t *sig) {
  proto__wr_head(w, PROTO_T_REVOCATION, sig ? 6 : 5);
  proto__wr_str(w, rl->swarm, strlen(rl->swarm));
  proto__wr_bin(w, moderator_pk, PROTO_PK_BYTES);
  proto__wr_uint(w, rl->seq);
  proto__wr_uint(w, rl->issued);
  proto__wr_array(w, (uint32_t)rl->n);
  for (size_t i = 0; i < rl->n; i++)
    proto__wr_bin(w, rl->keys[i], PROTO_PK_BYTES);
  if (sig)
    proto__wr_bin(w, sig, PROTO_SIG_BYTES);
}

/* Builds the signed message of rl in a heap buffer (*out). */
static int rl_signed_msg(const proto_revocation *rl,
                         const uint8_t moderator_pk[PROTO_PK_BYTES],
                         uint8_t **out, size_t *len) {
  size_t dl = sizeof REVOCATION_DOMAIN - 1;
  size_t cap = dl + rl_encoded_max(rl->n);
  uint8_t *buf = malloc(cap);
  proto_wr w;
  if (!buf)
    return -ENOMEM;
  memcpy(buf, REVOCATION_DOMAIN, dl);
  proto__wr_init(&w, buf + dl, cap - dl);
  rl_wr(&w, rl, moderator_pk, NULL);
  if (w.err) {
    free(buf);
    return w.err;
  }
  *out = buf;
  *len = dl + w.len;
  return 0;
}

static bool all_zero(const uint8_t *p, size_t n) {
  uint8_t acc = 0;
  for (size_t i = 0; i < n; i++)
    acc |= p[i];
  return acc == 0;
}

/* The moderator field is the signer's key.  Refuses (BEE_ERANGE) keys out
 * of order, which no decoder would accept. */
int proto_revocation_encode(const proto_revocation *rl,
                            const proto_identity *moderator, uint8_t **out,
                            size_t *len) {
  uint8_t *msg = NULL, *buf = NULL;
  uint8_t sig[PROTO_SIG_BYTES];
  size_t msg_len, cap;
  proto_wr w;
  int rc = check_swarm(rl->swarm);
  if (rc)
    return rc;
  if (rl->n > PROTO_REVOKED_MAX)
    return BEE_ETOOBIG;
  for (size_t i = 1; i < rl->n; i++) /* decoders refuse anything else */
    if (memcmp(rl->keys[i - 1], rl->keys[i], PROTO_PK_BYTES) >= 0)
      return BEE_ERANGE;
  /* A list loaded for one moderator is not re-signed by another; a fresh
   * list (moderator_pk all zero) takes the signer's key. */
  if (!all_zero(rl->moderator_pk, PROTO_PK_BYTES) &&
      memcmp(rl->moderator_pk, moderator->pk, PROTO_PK_BYTES) != 0)
    return BEE_ETOKEN_MODERATOR;
  if ((rc = rl_signed_msg(rl, moderator->pk, &msg, &msg_len)))
    return rc;
  crypto_sign_detached(sig, NULL, msg, msg_len, moderator->sk);
  cap = rl_encoded_max(rl->n);
  if (!(buf = malloc(cap))) {
    rc = -ENOMEM;
    goto out;
  }
  proto__wr_init(&w, buf, cap);
  rl_wr(&w, rl, moderator->pk, sig);
  if ((rc = w.err))
    goto out;
  *out = buf;
  *len = w.len;
  buf = NULL;
out:
  free(buf);
  free(msg);
  return rc;
}

/* rl's previous contents are overwritten, not freed: pass a list that is
 * freshly initialized or closed.  Structure and key order are checked
 * before the moderator, the signature and the swarm, in that order. */
int proto_revocation_decode(const uint8_t *buf, size_t len,
                            const uint8_t moderator_pk[PROTO_PK_BYTES],
                            const char *swarm, proto_revocation *rl) {
  proto_revocation tmp;
  proto_rd r;
  uint8_t sig[PROTO_SIG_BYTES];
  uint8_t *msg = NULL;
  size_t msg_len;
  uint32_t n;
  int type, rc;
  proto_revocation_init(&tmp);
  proto_revocation_init(rl);
  proto__rd_init(&r, buf, len);
  if ((rc = proto__rd_head(&r, PROTO_T_REVOCATION, 6, &type)) ||
      (rc = rd_swarm(&r, tmp.swarm)) ||
      (rc = proto__rd_fixbin(&r, tmp.moderator_pk, PROTO_PK_BYTES)) ||
      (rc = proto__rd_uint(&r, &tmp.seq)) ||
      (rc = proto__rd_uint(&r, &tmp.issued)) || (rc = proto__rd_array(&r, &n)))
    goto out;
  if (n > PROTO_REVOKED_MAX) {
    rc = BEE_ETOOBIG;
    goto out;
  }
  if (n > 0 && !(tmp.keys = malloc((size_t)n * sizeof *tmp.keys))) {
    rc = -ENOMEM;
    goto out;
  }
  for (tmp.n = 0; tmp.n < n; tmp.n++) {
    if ((rc = proto__rd_fixbin(&r, tmp.keys[tmp.n], PROTO_PK_BYTES)))
      goto out;
    if (tmp.n > 0 &&
        memcmp(tmp.keys[tmp.n - 1], tmp.keys[tmp.n], PROTO_PK_BYTES) >= 0) {
      rc = BEE_ERANGE; /* unsorted or duplicate */
      goto out;
    }
  }
  if ((rc = proto__rd_fixbin(&r, sig, PROTO_SIG_BYTES)) || (rc = proto__rd_end(&r)))
    goto out;
  /* Only the canonical encoding, as for tokens. */
  if (!(msg = malloc(len))) {
    rc = -ENOMEM;
    goto out;
  }
  proto_wr w;
  proto__wr_init(&w, msg, len);
  rl_wr(&w, &tmp, tmp.moderator_pk, sig);
  if (w.err || w.len != len || memcmp(msg, buf, len) != 0) {
    rc = BEE_ERANGE;
    goto out;
  }
  free(msg);
  msg = NULL;
  if (memcmp(tmp.moderator_pk, moderator_pk, PROTO_PK_BYTES) != 0) {
    rc = BEE_ETOKEN_MODERATOR;
    goto out;
  }
  if ((rc = rl_signed_msg(&tmp, moderator_pk, &msg, &msg_len)))
    goto out;
  if (crypto_sign_verify_detached(sig, msg, msg_len, moderator_pk) != 0) {
    rc = BEE_ETOKEN_FORGED;
    goto out;
  }
  if (strcmp(tmp.swarm, swarm) != 0) {
    rc = BEE_ETOKEN_SWARM;
    goto out;
  }
  if (!(tmp.raw = malloc(len ? len : 1))) {
    rc = -ENOMEM;
    goto out;
  }
  memcpy(tmp.raw, buf, len);
  tmp.raw_len = len;
  *rl = tmp;
  tmp.keys = NULL;
  tmp.raw = NULL;
out:
  free(msg);
  free(tmp.keys);
  free(tmp.raw);
  return rc;
}

int proto_revocation_save(const proto_revocation *rl,
                          const proto_identity *moderator, const char *path) {
  uint8_t *buf;
  size_t len;
  int rc = proto_revocation_encode(rl, moderator, &buf, &len);
  if (rc)
    return rc;
  rc = save_b64(path, REVOCATION_MAGIC, buf, len);
  free(buf);
  return rc;
}

/* Like proto_revocation_decode, rl is overwritten; it is empty on failure. */
int proto_revocation_load(proto_revocation *rl, const char *path,
                          const uint8_t moderator_pk[PROTO_PK_BYTES],
                          const char *swarm) {
  uint8_t *bin = NULL;
  size_t len;
  proto_revocation_init(rl);
  int rc = load_b64(path, REVOCATION_FILE_MAX, REVOCATION_MAGIC, &bin, &len);
  if (rc)
    return rc;
  rc = proto_revocation_decode(bin, len, moderator_pk, swarm, rl);
  free(bin);
  return rc;
}
