/* meter.c: the rate data reaches us at, from the times of reads
 * (proto.h, proto_conn_take_rx_mbit).  Each connection has a meter of
 * its own, and a peer's control connection has one more fed by all our
 * connections to that peer: a round striped over several streams gives
 * each stream's share of the link, the streams together the link.
 *
 * TCP sends in flights: a window's worth of segments at once, which the
 * slowest link on the path spaces out at its own rate, then a wait for
 * acknowledgements.  A flight's bytes over the time they took to arrive
 * is that link's rate, whether or not the window fills the path: the
 * figure of a link, not of a transfer still in slow start.  So reads are
 * grouped into flights, a flight ending at a pause longer than the gap
 * (the caller's: under half a round trip, above the spacing of the large
 * segments a slow link delivers); a flight's rate counts when it moved
 * PROTO__FLIGHT_MIN bytes after its first read, and the best rate since
 * the caller last took it is kept.
 *
 * A loop busy elsewhere reads late, in a burst, what arrived while it was
 * away.  Inside a flight that only stretches the flight (its last read
 * comes no earlier than its last byte), which can lower the figure but
 * never raise it; at a flight's start the burst would look like a fast
 * link, so what was waiting in the kernel at the first read (the
 * backlog, FIONREAD) is passed over, as that read's own bytes are.  In a
 * meter of several connections the same holds for each connection's
 * first read in a flight: its bytes and its backlog may predate the
 * flight.
 */
#include "proto-int.h"

static void flight_close(proto__flight *f) {
  if (f->start_ns && f->last_ns > f->start_ns &&
      f->bytes >= PROTO__FLIGHT_MIN) {
    double rate = (double)f->bytes * 1e9 / (double)(f->last_ns - f->start_ns);
    if (rate > f->best)
      f->best = rate;
  }
  f->start_ns = f->last_ns = f->bytes = f->skip = 0;
}

bool proto__flight_starts(const proto__flight *f, uint64_t now_ns,
                          uint64_t gap_ns) {
  return !f->start_ns || now_ns < f->last_ns || now_ns - f->last_ns > gap_ns;
}

void proto__flight_add(proto__flight *f, uint64_t now_ns, size_t bytes,
                       uint64_t gap_ns, uint64_t backlog, bool joins) {
  if (f->start_ns && proto__flight_starts(f, now_ns, gap_ns))
    flight_close(f);
  if (!f->start_ns) { /* its first read's bytes came before it began */
    f->start_ns = f->last_ns = now_ns ? now_ns : 1;
    f->skip = backlog;
    return;
  }
  f->last_ns = now_ns;
  if (joins) { /* the same for a source's first read within the flight */
    f->skip += backlog;
    return;
  }
  if (f->skip >= bytes) {
    f->skip -= bytes;
    return;
  }
  f->bytes += bytes - f->skip;
  f->skip = 0;
}

double proto__flight_take(proto__flight *f, uint64_t now_ns, uint64_t gap_ns) {
  if (f->start_ns && proto__flight_starts(f, now_ns, gap_ns))
    flight_close(f);
  double best = f->best;
  f->best = 0;
  return best;
}
