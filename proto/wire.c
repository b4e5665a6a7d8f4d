/* wire.c: the strict msgpack reader and the capped msgpack writer.
 *
 * Decoding peer input goes through this cursor rather than msgpack-c's
 * unpacker: msgpack-c sizes its object arrays from the counts in the
 * headers it reads, so a five-byte array header from a peer could ask for
 * gigabytes.  The cursor checks every length against the bytes actually
 * left, returns views instead of copies and never allocates.  Encoding uses
 * msgpack-c's packer, writing into a fixed buffer.
 */
#include "proto-int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

void proto__rd_init(proto_rd *r, const uint8_t *buf, size_t len) {
  r->p = buf;
  r->end = buf + len;
}

/* Reads a big-endian unsigned integer of n bytes at p. */
static uint64_t be(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v = v << 8 | p[i];
  return v;
}

/* BEE_ETRUNCATED unless n more bytes are there. */
static int need(const proto_rd *r, size_t n) {
  return proto__rd_left(r) < n ? BEE_ETRUNCATED : 0;
}

static int container(proto_rd *r, uint32_t *n, bool map) {
  int rc = need(r, 1);
  if (rc)
    return rc;
  uint8_t t = r->p[0];
  size_t hdr = 1;
  uint64_t count;
  if (!map && t >= 0x90 && t <= 0x9f) {
    count = t & 0x0f;
  } else if (map && t >= 0x80 && t <= 0x8f) {
    count = t & 0x0f;
  } else if (t == (map ? 0xde : 0xdc)) {
    if ((rc = need(r, 3)))
      return rc;
    count = be(r->p + 1, 2);
    hdr = 3;
  } else if (t == (map ? 0xdf : 0xdd)) {
    if ((rc = need(r, 5)))
      return rc;
    count = be(r->p + 1, 4);
    hdr = 5;
  } else {
    return t == 0xc1 ? BEE_EMALFORMED : BEE_ETYPE;
  }
  /* Each element needs at least one byte (two for a map entry). */
  if (count * (map ? 2u : 1u) > proto__rd_left(r) - hdr)
    return BEE_ETRUNCATED;
  r->p += hdr;
  *n = (uint32_t)count;
  return 0;
}

int proto__rd_array(proto_rd *r, uint32_t *n) { return container(r, n, false); }
int proto__rd_map(proto_rd *r, uint32_t *n) { return container(r, n, true); }

/* Decodes the integer at the cursor without moving it.  *neg tells a
 * negative value (then *v holds it as int64 bits). */
static int peek_int(const proto_rd *r, uint64_t *v, bool *neg, size_t *size) {
  int rc = need(r, 1);
  if (rc)
    return rc;
  uint8_t t = r->p[0];
  *neg = false;
  if (t <= 0x7f) {
    *v = t;
    *size = 1;
    return 0;
  }
  if (t >= 0xe0) {
    *v = (uint64_t)(int64_t)(int8_t)t;
    *neg = true;
    *size = 1;
    return 0;
  }
  int n;
  bool sig;
  switch (t) {
  case 0xcc: n = 1; sig = false; break;
  case 0xcd: n = 2; sig = false; break;
  case 0xce: n = 4; sig = false; break;
  case 0xcf: n = 8; sig = false; break;
  case 0xd0: n = 1; sig = true; break;
  case 0xd1: n = 2; sig = true; break;
  case 0xd2: n = 4; sig = true; break;
  case 0xd3: n = 8; sig = true; break;
  case 0xc1: return BEE_EMALFORMED;
  default: return BEE_ETYPE;
  }
  if ((rc = need(r, 1 + (size_t)n)))
    return rc;
  uint64_t u = be(r->p + 1, n);
  if (sig) {
    int shift = 64 - 8 * n;
    int64_t s = (int64_t)(u << shift) >> shift; /* sign-extend */
    *neg = s < 0;
    u = (uint64_t)s;
  }
  *v = u;
  *size = 1 + (size_t)n;
  return 0;
}

int proto__rd_uint(proto_rd *r, uint64_t *v) {
  uint64_t u;
  bool neg;
  size_t size;
  int rc = peek_int(r, &u, &neg, &size);
  if (rc)
    return rc;
  if (neg)
    return BEE_ERANGE;
  r->p += size;
  *v = u;
  return 0;
}

int proto__rd_int(proto_rd *r, int64_t *v) {
  uint64_t u;
  bool neg;
  size_t size;
  int rc = peek_int(r, &u, &neg, &size);
  if (rc)
    return rc;
  if (!neg && u > (uint64_t)INT64_MAX)
    return BEE_ERANGE;
  r->p += size;
  *v = (int64_t)u;
  return 0;
}

int proto__rd_bool(proto_rd *r, bool *v) {
  int rc = need(r, 1);
  if (rc)
    return rc;
  if (r->p[0] != 0xc2 && r->p[0] != 0xc3)
    return r->p[0] == 0xc1 ? BEE_EMALFORMED : BEE_ETYPE;
  *v = r->p[0] == 0xc3;
  r->p++;
  return 0;
}

/* msgpack floats are IEEE 754 bit patterns; so must double be here. */
_Static_assert(sizeof(double) == sizeof(uint64_t), "double is not 64-bit");

int proto__rd_f64(proto_rd *r, double *v) {
  int rc = need(r, 1);
  if (rc)
    return rc;
  if (r->p[0] != 0xcb)
    return r->p[0] == 0xc1 ? BEE_EMALFORMED : BEE_ETYPE;
  if ((rc = need(r, 9)))
    return rc;
  uint64_t bits = be(r->p + 1, 8);
  memcpy(v, &bits, sizeof *v); /* IEEE 754 binary64, as msgpack says */
  r->p += 9;
  return 0;
}

int proto__rd_nil(proto_rd *r) {
  int rc = need(r, 1);
  if (rc)
    return rc;
  if (r->p[0] != 0xc0)
    return 0;
  r->p++;
  return 1;
}

/* Reads a str (want_bin false) or bin header and its bytes as a view. */
static int blob(proto_rd *r, proto_bytes *out, size_t max, bool want_bin) {
  int rc = need(r, 1);
  if (rc)
    return rc;
  uint8_t t = r->p[0];
  size_t hdr;
  uint64_t n;
  if (!want_bin && t >= 0xa0 && t <= 0xbf) {
    hdr = 1;
    n = t & 0x1f;
  } else {
    int w;
    if (t == (want_bin ? 0xc4 : 0xd9))
      w = 1;
    else if (t == (want_bin ? 0xc5 : 0xda))
      w = 2;
    else if (t == (want_bin ? 0xc6 : 0xdb))
      w = 4;
    else
      return t == 0xc1 ? BEE_EMALFORMED : BEE_ETYPE;
    if ((rc = need(r, 1 + (size_t)w)))
      return rc;
    hdr = 1 + (size_t)w;
    n = be(r->p + 1, w);
  }
  if (n > proto__rd_left(r) - hdr)
    return BEE_ETRUNCATED;
  if (n > max)
    return BEE_ETOOBIG;
  out->p = r->p + hdr;
  out->n = (size_t)n;
  r->p += hdr + n;
  return 0;
}

int proto__rd_str(proto_rd *r, proto_bytes *out, size_t max) {
  return blob(r, out, max, false);
}

int proto__rd_bin(proto_rd *r, proto_bytes *out, size_t max) {
  return blob(r, out, max, true);
}

int proto__rd_fixbin(proto_rd *r, uint8_t *out, size_t n) {
  proto_rd save = *r;
  proto_bytes b;
  int rc = blob(r, &b, SIZE_MAX, true);
  if (rc)
    return rc;
  if (b.n != n) {
    *r = save;
    return BEE_ERANGE;
  }
  memcpy(out, b.p, n);
  return 0;
}

int proto__rd_skip(proto_rd *r, int depth) {
  if (depth <= 0)
    return BEE_EDEPTH;
  int rc = need(r, 1);
  if (rc)
    return rc;
  proto_rd save = *r;
  uint8_t t = r->p[0];
  uint32_t n;
  proto_bytes b;
  uint64_t u;
  bool neg;
  size_t size;
  if ((t >= 0x90 && t <= 0x9f) || t == 0xdc || t == 0xdd ||
      (t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf) {
    bool map = (t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf;
    if ((rc = container(r, &n, map)))
      return rc;
    uint64_t items = (uint64_t)n * (map ? 2 : 1);
    for (uint64_t i = 0; i < items; i++)
      if ((rc = proto__rd_skip(r, depth - 1))) {
        *r = save;
        return rc;
      }
    return 0;
  }
  if ((t >= 0xa0 && t <= 0xbf) || (t >= 0xd9 && t <= 0xdb))
    return blob(r, &b, SIZE_MAX, false);
  if (t >= 0xc4 && t <= 0xc6)
    return blob(r, &b, SIZE_MAX, true);
  if (t == 0xc0 || t == 0xc2 || t == 0xc3) {
    r->p++;
    return 0;
  }
  if (t == 0xca || t == 0xcb) {
    size = t == 0xca ? 5 : 9;
    if ((rc = need(r, size)))
      return rc;
    r->p += size;
    return 0;
  }
  if (t >= 0xd4 && t <= 0xd8) { /* fixext: type byte + 1..16 data bytes */
    size = 2 + ((size_t)1 << (t - 0xd4));
    if ((rc = need(r, size)))
      return rc;
    r->p += size;
    return 0;
  }
  if (t >= 0xc7 && t <= 0xc9) { /* ext8/16/32 */
    int w = t == 0xc7 ? 1 : t == 0xc8 ? 2 : 4;
    if ((rc = need(r, 2 + (size_t)w)))
      return rc;
    uint64_t len = be(r->p + 1, w);
    if (len > proto__rd_left(r) - 2 - (size_t)w)
      return BEE_ETRUNCATED;
    r->p += 2 + (size_t)w + len;
    return 0;
  }
  if ((rc = peek_int(r, &u, &neg, &size)))
    return rc;
  r->p += size;
  return 0;
}

int proto__rd_end(const proto_rd *r) {
  return r->p == r->end ? 0 : BEE_ETRAILING;
}

int proto__rd_head(proto_rd *r, int want, uint32_t nfields, int *type) {
  uint32_t n;
  uint64_t v, t;
  int rc = proto__rd_array(r, &n);
  if (rc)
    return rc;
  if (n < 2)
    return BEE_EMISSING;
  if ((rc = proto__rd_uint(r, &v)))
    return rc == BEE_ERANGE ? BEE_EVERSION : rc;
  if (v != PROTO_VERSION)
    return BEE_EVERSION;
  if ((rc = proto__rd_uint(r, &t)))
    return rc == BEE_ERANGE ? BEE_EUNKNOWN : rc;
  if (t > 255 || (want >= 0 && t != (uint64_t)want))
    return BEE_EUNKNOWN;
  *type = (int)t;
  if (n < 2 + nfields)
    return BEE_EMISSING;
  if (n > 2 + nfields)
    return BEE_ETYPE;
  return 0;
}

int proto__rd_family_head(proto_rd *r, int first, int count,
                          const uint8_t *nfields, int *type) {
  /* The field count depends on the type, which comes after the array
   * header: peek at the count, then let proto__rd_head check version and
   * type first, in the order every decoder reports them. */
  proto_rd peek = *r;
  uint32_t n;
  int rc = proto__rd_array(&peek, &n);
  if (rc || (rc = proto__rd_head(r, -1, n < 2 ? 0 : n - 2, type)))
    return rc;
  if (*type < first || *type >= first + count)
    return BEE_EUNKNOWN;
  uint32_t want = nfields[*type - first];
  if (n - 2 != want)
    return n - 2 < want ? BEE_EMISSING : BEE_ETYPE;
  return 0;
}

/* ---- writer ------------------------------------------------------------ */

static int wr_cb(void *data, const char *buf, size_t len) {
  proto_wr *w = data;
  if (w->err)
    return -1;
  if (len > w->cap - w->len) {
    w->err = BEE_ETOOBIG;
    return -1;
  }
  /* msgpack-c passes empty bodies too, maybe as NULL: memcpy must not
   * see a null pointer even for zero bytes. */
  if (len > 0)
    memcpy(w->buf + w->len, buf, len);
  w->len += len;
  return 0;
}

void proto__wr_init(proto_wr *w, uint8_t *buf, size_t cap) {
  w->buf = buf;
  w->cap = cap;
  w->len = 0;
  w->err = 0;
  msgpack_packer_init(&w->pk, w, wr_cb);
}

void proto__wr_array(proto_wr *w, uint32_t n) { msgpack_pack_array(&w->pk, n); }
void proto__wr_map(proto_wr *w, uint32_t n) { msgpack_pack_map(&w->pk, n); }
void proto__wr_uint(proto_wr *w, uint64_t v) { msgpack_pack_uint64(&w->pk, v); }
void proto__wr_int(proto_wr *w, int64_t v) { msgpack_pack_int64(&w->pk, v); }
void proto__wr_nil(proto_wr *w) { msgpack_pack_nil(&w->pk); }

void proto__wr_bool(proto_wr *w, bool v) {
  if (v)
    msgpack_pack_true(&w->pk);
  else
    msgpack_pack_false(&w->pk);
}

void proto__wr_f64(proto_wr *w, double v) { msgpack_pack_double(&w->pk, v); }

void proto__wr_str(proto_wr *w, const void *p, size_t n) {
  if (n > UINT32_MAX) {
    w->err = BEE_ETOOBIG;
    return;
  }
  msgpack_pack_str(&w->pk, n);
  msgpack_pack_str_body(&w->pk, p, n);
}

void proto__wr_bin(proto_wr *w, const void *p, size_t n) {
  proto__wr_bin_head(w, n);
  msgpack_pack_bin_body(&w->pk, p, n);
}

void proto__wr_bin_head(proto_wr *w, size_t n) {
  if (n > UINT32_MAX) {
    w->err = BEE_ETOOBIG;
    return;
  }
  msgpack_pack_bin(&w->pk, n);
}

void proto__wr_head(proto_wr *w, int type, uint32_t nfields) {
  proto__wr_array(w, 2 + nfields);
  proto__wr_uint(w, PROTO_VERSION);
  proto__wr_uint(w, (uint64_t)type);
}

/* ---- misc -------------------------------------------------------------- */

uint64_t proto__now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec;
}

int proto__text_line(const char *buf, size_t len, const char *magic,
                     size_t *off, size_t *n) {
  size_t ml = strlen(magic), i = 0;
  bool found = false;
  while (i < len) {
    size_t start = i, end;
    while (i < len && buf[i] != '\n')
      i++;
    end = i;
    if (i < len)
      i++;
    while (end > start && (buf[end - 1] == ' ' || buf[end - 1] == '\t' ||
                           buf[end - 1] == '\r'))
      end--;
    if (end == start || buf[start] == '#')
      continue;
    if (found || end - start <= ml + 1 || memcmp(buf + start, magic, ml) ||
        buf[start + ml] != ' ')
      return BEE_EKEYFILE;
    *off = start + ml + 1;
    *n = end - *off;
    found = true;
  }
  return found ? 0 : BEE_EKEYFILE;
}

int proto_read_file(const char *path, size_t max, uint8_t **out, size_t *len) {
  int rc = 0;
  uint8_t *buf = NULL;
  /* O_NONBLOCK: a FIFO named by mistake must not hang us. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return -errno;
  struct stat st;
  if (fstat(fd, &st) < 0) {
    rc = -errno;
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = BEE_EKEYFILE;
    goto out;
  }
  if ((uint64_t)st.st_size > max) {
    rc = BEE_ETOOBIG;
    goto out;
  }
  buf = malloc((size_t)st.st_size + 1);
  if (!buf) {
    rc = -ENOMEM;
    goto out;
  }
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      rc = -errno;
      goto out;
    }
    if (n == 0)
      break;
    got += (size_t)n;
  }
  buf[got] = 0;
  *out = buf;
  *len = got;
  buf = NULL;
out:
  free(buf);
  close(fd);
  return rc;
}

/* Makes a rename or link in path's directory durable. */
static void sync_dir(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  size_t n = slash ? (size_t)(slash - path) : 0;
  if (n >= sizeof dir)
    return;
  if (slash)
    memcpy(dir, path, n ? n : 1), dir[n ? n : 1] = 0;
  else
    strcpy(dir, ".");
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

int proto_write_file(const char *path, const void *p, size_t n, int mode,
                     bool exclusive) {
  int rc = 0;
  char tmp[4096];
  uint8_t rnd[8];
  char hex[17];
  if (sodium_init() < 0)
    return -EIO;
  randombytes_buf(rnd, sizeof rnd);
  proto_hex(rnd, sizeof rnd, hex);
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%s", path, hex) >= (int)sizeof tmp)
    return -ENAMETOOLONG;
  if (exclusive && access(path, F_OK) == 0)
    return -EEXIST;
  /* A fresh name, never an existing file or a planted symlink. */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0)
    return -errno;
  if (fchmod(fd, (mode_t)mode) < 0) {
    rc = -errno;
    goto out;
  }
  const uint8_t *q = p;
  while (n > 0) {
    ssize_t w = write(fd, q, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0) {
      rc = -errno;
      goto out;
    }
    q += w;
    n -= (size_t)w;
  }
  if (fsync(fd) < 0)
    rc = -errno;
out:
  close(fd);
  if (rc == 0 && (exclusive ? link(tmp, path) : rename(tmp, path)) < 0)
    rc = -errno;
  unlink(tmp); /* after link(); after rename() it is already gone */
  if (rc == 0)
    sync_dir(path);
  return rc;
}
