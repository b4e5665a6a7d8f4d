/* fuzz-handshake.c: libFuzzer target for the handshake message decoders.
 *
 * The first input byte picks HELLO, AUTH, the inner AUTH plaintext or
 * RESULT; the rest is the message.  Whatever a decoder accepts must encode
 * again and decode to the same message, or the target aborts.
 */
#include "proto-int.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define OUT_MAX 4096 /* larger than any handshake message */

static bool bytes_eq(proto_bytes a, proto_bytes b) {
  return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0);
}

static void hello(const uint8_t *p, size_t n, uint8_t *out) {
  proto_hello a, b;
  size_t len;
  if (proto__hello_decode(p, n, &a) != 0)
    return;
  if (proto__hello_encode(&a, out, OUT_MAX, &len) != 0 ||
      proto__hello_decode(out, len, &b) != 0)
    abort();
  if (!bytes_eq(a.swarm, b.swarm) || a.purpose != b.purpose ||
      a.ciphers != b.ciphers || a.moderated != b.moderated ||
      memcmp(a.eph_pk, b.eph_pk, sizeof a.eph_pk) != 0)
    abort();
}

static void auth(const uint8_t *p, size_t n, uint8_t *out) {
  proto_auth_msg a, b;
  size_t len;
  if (proto__auth_decode(p, n, &a) != 0)
    return;
  if (proto__auth_encode(&a, out, OUT_MAX, &len) != 0 ||
      proto__auth_decode(out, len, &b) != 0)
    abort();
  if (a.cipher != b.cipher || a.has_eph != b.has_eph ||
      memcmp(a.eph_pk, b.eph_pk, sizeof a.eph_pk) != 0 ||
      !bytes_eq(a.sealed, b.sealed))
    abort();
}

static void auth_inner(const uint8_t *p, size_t n, uint8_t *out) {
  proto_auth_inner a, b;
  size_t len;
  if (proto__auth_inner_decode(p, n, &a) != 0)
    return;
  if (proto__auth_inner_encode(&a, out, OUT_MAX, &len) != 0 ||
      proto__auth_inner_decode(out, len, &b) != 0)
    abort();
  if (memcmp(a.id_pk, b.id_pk, sizeof a.id_pk) != 0 ||
      !bytes_eq(a.token, b.token) || memcmp(a.sig, b.sig, sizeof a.sig) != 0)
    abort();
}

static void result(const uint8_t *p, size_t n, uint8_t *out) {
  int64_t code, code2;
  proto_bytes text, text2;
  char s[PROTO_TEXT_MAX + 1];
  size_t len;
  if (proto__result_decode(p, n, &code, &text) != 0)
    return;
  /* The encoder takes a C string, so text up to its first NUL goes back. */
  memcpy(s, text.p, text.n);
  s[text.n] = 0;
  text.n = strlen(s);
  if (proto__result_encode(code, s, out, OUT_MAX, &len) != 0 ||
      proto__result_decode(out, len, &code2, &text2) != 0)
    abort();
  if (code != code2 || !bytes_eq(text, text2))
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uint8_t out[OUT_MAX];
  if (size < 1)
    return 0;
  switch (data[0] % 4) {
  case 0: hello(data + 1, size - 1, out); break;
  case 1: auth(data + 1, size - 1, out); break;
  case 2: auth_inner(data + 1, size - 1, out); break;
  default: result(data + 1, size - 1, out); break;
  }
  return 0;
}
