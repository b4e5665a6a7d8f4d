/* handshake.c: the session handshake as a state machine without I/O.
 *
 * Three messages and a verdict (docs/PROTOCOL.md has the byte layouts):
 *
 *   I -> R  HELLO    swarm, purpose, ciphers, moderated, eI
 *   R -> I  AUTH     cipher, eR, box_R{idR, tokenR, sigR}
 *   I -> R  AUTH     box_I{idI, tokenI, sigI}       (or box_I{RESULT refusal})
 *   R -> I  RESULT   box_R'{code, text}             (0: welcome)
 *
 * Keys come from X25519(eI, eR) and a running BLAKE2b transcript hash, so
 * each signature covers both ephemeral keys and binds the signer's identity
 * and token to this one session.  Identities travel only inside boxes.
 * Ephemeral secrets are wiped once the traffic keys exist (forward
 * secrecy).  A refusal after the key exchange is sealed, so the peer logs a
 * reason it can trust came from the other end.
 */
#include "proto-int.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  HS_I_START,
  HS_I_WAIT_AUTH,
  HS_I_WAIT_RESULT,
  HS_R_WAIT_HELLO,
  HS_R_WAIT_AUTH,
  HS_DONE,
  HS_FAILED,
};

#define BOX_MAX 1536 /* sealed inner message, tag included */

struct proto_hs {
  const proto_auth *auth;
  bool initiator;
  int purpose;
  uint64_t now;
  int state;
  int cipher;
  uint8_t e_pk[32], e_sk[32];
  uint8_t shared[32];
  uint8_t th[32]; /* running transcript hash */
  uint8_t k_i[32], k_r[32]; /* handshake box keys, one per direction */
  uint64_t n_r;             /* boxes R has sealed under k_r */
  proto_peer peer;
  proto_sealer tx, rx;
  char remote_text[PROTO_TEXT_MAX + 1];
};

proto_hs *proto_hs_new(const proto_auth *auth, bool initiator, int purpose,
                       uint64_t now) {
  if (sodium_init() < 0)
    return NULL;
  proto_hs *hs = calloc(1, sizeof *hs);
  if (!hs)
    return NULL;
  hs->auth = auth;
  hs->initiator = initiator;
  hs->purpose = purpose;
  hs->now = now;
  hs->state = initiator ? HS_I_START : HS_R_WAIT_HELLO;
  crypto_box_keypair(hs->e_pk, hs->e_sk); /* X25519 pair */
  return hs;
}

void proto_hs_free(proto_hs *hs) {
  if (!hs)
    return;
  proto_sealer_clear(&hs->tx); /* unless proto_hs_result moved them */
  proto_sealer_clear(&hs->rx);
  sodium_memzero(hs, sizeof *hs);
  free(hs);
}

const char *proto_hs_remote_text(const proto_hs *hs) { return hs->remote_text; }

/* th = H(th || a || b). */
static void th_mix(uint8_t th[32], const void *a, size_t an, const void *b,
                   size_t bn) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, 32);
  crypto_generichash_update(&st, th, 32);
  crypto_generichash_update(&st, a, an);
  if (bn)
    crypto_generichash_update(&st, b, bn);
  crypto_generichash_final(&st, th, 32);
}

/* out = BLAKE2b-256 keyed with the DH secret over label || th. */
static void kdf(const proto_hs *hs, const char *label, uint8_t out[32]) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, hs->shared, 32, 32);
  crypto_generichash_update(&st, (const uint8_t *)label, strlen(label));
  crypto_generichash_update(&st, hs->th, 32);
  crypto_generichash_final(&st, out, 32);
  sodium_memzero(&st, sizeof st); /* it was keyed with the DH secret */
}

static void box_nonce(uint64_t n, uint8_t nonce[24]) {
  memset(nonce, 0, 24);
  nonce[23] = (uint8_t)n;
}

/* Seals plain into out (plain_len + 16 bytes) under key with nonce n. */
static void box_seal(const uint8_t key[32], uint64_t n, const uint8_t *plain,
                     size_t plain_len, uint8_t *out) {
  uint8_t nonce[24];
  box_nonce(n, nonce);
  crypto_aead_xchacha20poly1305_ietf_encrypt(out, NULL, plain, plain_len, NULL,
                                             0, NULL, nonce, key);
}

static int box_open(const uint8_t key[32], uint64_t n, proto_bytes box,
                    uint8_t *out, size_t *out_len) {
  uint8_t nonce[24];
  unsigned long long m;
  if (box.n < PROTO_TAG_BYTES || box.n > BOX_MAX)
    return BEE_EAUTH;
  box_nonce(n, nonce);
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(out, &m, NULL, box.p, box.n,
                                                 NULL, 0, nonce, key) != 0)
    return BEE_EAUTH;
  *out_len = (size_t)m;
  return 0;
}

/* What a signature covers: label, transcript, identity and token hash. */
static void sig_msg(const char *label, const uint8_t th[32],
                    const uint8_t pk[32], proto_bytes token, uint8_t *msg,
                    size_t *len) {
  size_t l = strlen(label);
  memcpy(msg, label, l);
  memcpy(msg + l, th, 32);
  memcpy(msg + l + 32, pk, 32);
  crypto_generichash(msg + l + 64, 32, token.p, token.n, NULL, 0);
  *len = l + 96;
}

#define LABEL_R "beed hs v1 responder"
#define LABEL_I "beed hs v1 initiator"

/* Builds our AUTH inner message, signed over the transcript. */
static int inner_build(proto_hs *hs, const char *label, uint8_t *out,
                       size_t *len) {
  proto_auth_inner in;
  uint8_t msg[128];
  size_t mlen;
  memcpy(in.id_pk, hs->auth->id->pk, 32);
  in.token.p = hs->auth->token ? hs->auth->token->raw : NULL;
  in.token.n = hs->auth->token ? hs->auth->token->raw_len : 0;
  sig_msg(label, hs->th, in.id_pk, in.token, msg, &mlen);
  crypto_sign_detached(in.sig, NULL, msg, mlen, hs->auth->id->sk);
  return proto__auth_inner_encode(&in, out, BOX_MAX - PROTO_TAG_BYTES, len);
}

/* Checks the peer's inner message: signature over the transcript, the
 * peer's token, and that it is not us.  Fills hs->peer. */
static int inner_check(proto_hs *hs, const char *label,
                       const proto_auth_inner *in, int accept_roles) {
  const proto_auth *a = hs->auth;
  uint8_t msg[128];
  size_t mlen;
  sig_msg(label, hs->th, in->id_pk, in->token, msg, &mlen);
  if (crypto_sign_verify_detached(in->sig, msg, mlen, in->id_pk) != 0)
    return BEE_EAUTH;
  if (sodium_memcmp(in->id_pk, a->id->pk, 32) == 0)
    return BEE_ESELF;
  memset(&hs->peer, 0, sizeof hs->peer);
  memcpy(hs->peer.pk, in->id_pk, 32);
  proto_peer_id(in->id_pk, hs->peer.id);
  hs->peer.purpose = hs->purpose;
  hs->peer.cipher = hs->cipher;
  if (!a->moderator_pk) {
    if (in->token.n)
      return BEE_EOPEN_MISMATCH;
    hs->peer.role = PROTO_ROLE_BEE;
    return 0;
  }
  if (!in->token.n)
    return BEE_ENOTOKEN;
  proto_token tok;
  int rc = proto_token_decode(in->token.p, in->token.n, &tok);
  if (rc)
    return rc;
  rc = proto_token_verify(&tok, a->moderator_pk, a->swarm, in->id_pk,
                          accept_roles, hs->now, a->revoked);
  if (rc)
    return rc;
  hs->peer.role = tok.role;
  hs->peer.token_expires = tok.expires;
  return 0;
}

/* Derives the traffic sealers from the final transcript and wipes every
 * ephemeral secret. */
static int finish(proto_hs *hs) {
  uint8_t k_i2r[32], k_r2i[32];
  kdf(hs, "beed traffic i2r", k_i2r);
  kdf(hs, "beed traffic r2i", k_r2i);
  int rc = proto__sealer_init(&hs->tx, hs->cipher, hs->initiator ? k_i2r : k_r2i);
  if (!rc)
    rc = proto__sealer_init(&hs->rx, hs->cipher, hs->initiator ? k_r2i : k_i2r);
  sodium_memzero(k_i2r, 32);
  sodium_memzero(k_r2i, 32);
  sodium_memzero(hs->e_sk, 32);
  sodium_memzero(hs->shared, 32);
  sodium_memzero(hs->k_i, 32);
  sodium_memzero(hs->k_r, 32);
  return rc;
}

/* Key exchange: shared secret, transcript with cipher and eR, box keys. */
static int exchange(proto_hs *hs, const uint8_t peer_e[32], const uint8_t eR[32]) {
  uint8_t c = (uint8_t)hs->cipher;
  if (crypto_scalarmult(hs->shared, hs->e_sk, peer_e) != 0)
    return BEE_EAUTH; /* low-order point */
  th_mix(hs->th, &c, 1, eR, 32);
  kdf(hs, "beed hs box i2r", hs->k_i);
  kdf(hs, "beed hs box r2i", hs->k_r);
  return 0;
}

/* A plaintext or sealed RESULT into out.  The plaintext form is only used
 * before keys exist. */
static void verdict(proto_hs *hs, int code, const uint8_t *key, uint64_t n,
                    uint8_t *out, size_t *out_len) {
  uint8_t plain[PROTO_TEXT_MAX + 32];
  size_t len = 0;
  if (proto__result_encode(code, code ? bee_strerror(code) : "welcome", plain,
                           sizeof plain, &len) != 0) {
    *out_len = 0;
    return;
  }
  if (!key) {
    memcpy(out, plain, len);
    *out_len = len;
    return;
  }
  uint8_t box[PROTO_TEXT_MAX + 64];
  box_seal(key, n, plain, len, box);
  proto_auth_msg m = {.cipher = 0, .has_eph = false,
                      .sealed = {box, len + PROTO_TAG_BYTES}};
  if (proto__auth_encode(&m, out, PROTO_HS_OUT_MAX, out_len) != 0)
    *out_len = 0;
}

/* Takes a RESULT's code and text as the peer's verdict. */
static int remote(proto_hs *hs, const uint8_t *buf, size_t len, int *remote_code) {
  int64_t code;
  proto_bytes text;
  int rc = proto__result_decode(buf, len, &code, &text);
  if (rc)
    return rc;
  bee_printable(text.p, text.n, hs->remote_text, sizeof hs->remote_text);
  *remote_code = code < INT32_MIN || code > INT32_MAX ? BEE_ERANGE : (int)code;
  return code == 0 ? 0 : BEE_EREMOTE;
}

static int i_start(proto_hs *hs, uint8_t *out, size_t *out_len) {
  const proto_auth *a = hs->auth;
  proto_hello h = {
      .swarm = {(const uint8_t *)a->swarm, strlen(a->swarm)},
      .purpose = hs->purpose,
      .ciphers = a->ciphers & proto__ciphers_local(),
      .moderated = a->moderator_pk != NULL,
  };
  if (!h.ciphers)
    return BEE_ECIPHER;
  memcpy(h.eph_pk, hs->e_pk, 32);
  int rc = proto__hello_encode(&h, out, PROTO_HS_OUT_MAX, out_len);
  if (rc)
    return rc;
  th_mix(hs->th, "beed hs v1", 10, out, *out_len);
  hs->state = HS_I_WAIT_AUTH;
  return 0;
}

static int r_hello(proto_hs *hs, const uint8_t *in, size_t in_len,
                   uint8_t *out, size_t *out_len) {
  const proto_auth *a = hs->auth;
  proto_hello h;
  int rc = proto__hello_decode(in, in_len, &h);
  if (rc)
    return rc; /* garbage: close without a word */
  int common = h.ciphers & a->ciphers & proto__ciphers_local();
  int roles = h.purpose == PROTO_PURPOSE_BULK ? a->accept_bulk_roles : a->accept_roles;
  if (h.swarm.n != strlen(a->swarm) || memcmp(h.swarm.p, a->swarm, h.swarm.n))
    rc = BEE_ETOKEN_SWARM;
  else if (h.moderated != (a->moderator_pk != NULL))
    rc = BEE_EOPEN_MISMATCH;
  else if (!common)
    rc = BEE_ECIPHER;
  else if (!roles)
    rc = BEE_ETOKEN_ROLE; /* this purpose is not served at all */
  if (rc) {
    verdict(hs, rc, NULL, 0, out, out_len);
    return rc;
  }
  hs->purpose = h.purpose;
  hs->cipher = common & PROTO_CIPHER_AES256GCM ? PROTO_CIPHER_AES256GCM
                                               : PROTO_CIPHER_XCHACHA20POLY1305;
  th_mix(hs->th, "beed hs v1", 10, in, in_len);
  if ((rc = exchange(hs, h.eph_pk, hs->e_pk)))
    return rc;
  uint8_t plain[BOX_MAX], box[BOX_MAX];
  size_t plen;
  if ((rc = inner_build(hs, LABEL_R, plain, &plen)))
    return rc;
  box_seal(hs->k_r, hs->n_r++, plain, plen, box);
  th_mix(hs->th, plain, plen, NULL, 0);
  proto_auth_msg m = {.cipher = hs->cipher, .has_eph = true,
                      .sealed = {box, plen + PROTO_TAG_BYTES}};
  memcpy(m.eph_pk, hs->e_pk, 32);
  if ((rc = proto__auth_encode(&m, out, PROTO_HS_OUT_MAX, out_len)))
    return rc;
  hs->state = HS_R_WAIT_AUTH;
  return 0;
}

static int i_auth(proto_hs *hs, const uint8_t *in, size_t in_len, uint8_t *out,
                  size_t *out_len, int *remote_code) {
  proto_auth_msg m;
  int rc = proto__auth_decode(in, in_len, &m);
  if (rc == BEE_EUNKNOWN) { /* a plaintext refusal of our HELLO */
    rc = remote(hs, in, in_len, remote_code);
    return rc ? rc : BEE_ETYPE; /* a plaintext "welcome" is never valid */
  }
  if (rc)
    return rc;
  if (!m.has_eph || !(m.cipher & proto__ciphers_local() & hs->auth->ciphers))
    return BEE_ECIPHER;
  hs->cipher = m.cipher;
  if ((rc = exchange(hs, m.eph_pk, m.eph_pk)))
    return rc;
  uint8_t plain[BOX_MAX], box[BOX_MAX];
  size_t plen;
  proto_auth_inner inner;
  if ((rc = box_open(hs->k_r, hs->n_r++, m.sealed, plain, &plen)) ||
      (rc = proto__auth_inner_decode(plain, plen, &inner)))
    return rc;
  rc = inner_check(hs, LABEL_R, &inner, hs->auth->accept_roles);
  th_mix(hs->th, plain, plen, NULL, 0);
  if (rc) { /* tell the responder why, sealed, then give up */
    uint8_t res[PROTO_TEXT_MAX + 32];
    size_t rlen;
    if (proto__result_encode(rc, bee_strerror(rc), res, sizeof res, &rlen) == 0) {
      box_seal(hs->k_i, 0, res, rlen, box);
      proto_auth_msg r = {.sealed = {box, rlen + PROTO_TAG_BYTES}};
      if (proto__auth_encode(&r, out, PROTO_HS_OUT_MAX, out_len) != 0)
        *out_len = 0;
    }
    return rc;
  }
  if ((rc = inner_build(hs, LABEL_I, plain, &plen)))
    return rc;
  box_seal(hs->k_i, 0, plain, plen, box);
  th_mix(hs->th, plain, plen, NULL, 0);
  proto_auth_msg r = {.sealed = {box, plen + PROTO_TAG_BYTES}};
  if ((rc = proto__auth_encode(&r, out, PROTO_HS_OUT_MAX, out_len)))
    return rc;
  hs->state = HS_I_WAIT_RESULT;
  return 0;
}

static int r_auth(proto_hs *hs, const uint8_t *in, size_t in_len, uint8_t *out,
                  size_t *out_len, bool *done, int *remote_code) {
  proto_auth_msg m;
  uint8_t plain[BOX_MAX];
  size_t plen;
  proto_auth_inner inner;
  int rc = proto__auth_decode(in, in_len, &m);
  if (rc)
    return rc;
  if (m.has_eph || (rc = box_open(hs->k_i, 0, m.sealed, plain, &plen)))
    return rc ? rc : BEE_ETYPE;
  if (proto__auth_inner_decode(plain, plen, &inner) != 0) {
    rc = remote(hs, plain, plen, remote_code); /* the initiator refused us */
    return rc ? rc : BEE_ETYPE;
  }
  int roles = hs->purpose == PROTO_PURPOSE_BULK ? hs->auth->accept_bulk_roles
                                                : hs->auth->accept_roles;
  rc = inner_check(hs, LABEL_I, &inner, roles);
  th_mix(hs->th, plain, plen, NULL, 0);
  verdict(hs, rc, hs->k_r, hs->n_r++, out, out_len);
  if (rc)
    return rc;
  if ((rc = finish(hs)))
    return rc;
  hs->state = HS_DONE;
  *done = true;
  return 0;
}

static int i_result(proto_hs *hs, const uint8_t *in, size_t in_len, bool *done,
                    int *remote_code) {
  proto_auth_msg m;
  uint8_t plain[BOX_MAX];
  size_t plen;
  int rc = proto__auth_decode(in, in_len, &m);
  if (rc)
    return rc;
  if (m.has_eph || (rc = box_open(hs->k_r, hs->n_r++, m.sealed, plain, &plen)))
    return rc ? rc : BEE_ETYPE;
  if ((rc = remote(hs, plain, plen, remote_code)))
    return rc;
  if ((rc = finish(hs)))
    return rc;
  hs->state = HS_DONE;
  *done = true;
  return 0;
}

int proto_hs_step(proto_hs *hs, const uint8_t *in, size_t in_len, uint8_t *out,
                  size_t *out_len, bool *done, int *remote_code) {
  int rc;
  *out_len = 0;
  *done = false;
  *remote_code = 0;
  if (!in && hs->state != HS_I_START)
    return BEE_EMISSING;
  switch (hs->state) {
  case HS_I_START:
    rc = i_start(hs, out, out_len);
    break;
  case HS_R_WAIT_HELLO:
    rc = r_hello(hs, in, in_len, out, out_len);
    break;
  case HS_I_WAIT_AUTH:
    rc = i_auth(hs, in, in_len, out, out_len, remote_code);
    break;
  case HS_R_WAIT_AUTH:
    rc = r_auth(hs, in, in_len, out, out_len, done, remote_code);
    break;
  case HS_I_WAIT_RESULT:
    rc = i_result(hs, in, in_len, done, remote_code);
    break;
  default:
    return BEE_ECLOSED;
  }
  if (rc)
    hs->state = HS_FAILED;
  return rc;
}

int proto_hs_result(proto_hs *hs, proto_peer *peer, proto_sealer *tx,
                    proto_sealer *rx) {
  if (hs->state != HS_DONE)
    return BEE_ECLOSED;
  *peer = hs->peer;
  *tx = hs->tx; /* moved: the caller clears them */
  *rx = hs->rx;
  sodium_memzero(&hs->tx, sizeof hs->tx);
  sodium_memzero(&hs->rx, sizeof hs->rx);
  return 0;
}
