/* meter.c: a member's link rate, measured from the round messages that
 * reach it (averager-int.h).  It backs avg_node_bandwidth_mbit, which a
 * daemon declares with `--bandwidth auto` so that bandwidth-aware spans
 * (spans.c) follow the links as they are rather than as configured. */
#include "averager-int.h"

#include <string.h>

void avg__meter_start(avg__meter *m, uint64_t now_ms) {
  m->on = true;
  m->start_ms = m->win_ms = now_ms;
  m->bytes = m->win_bytes = 0;
  m->best = m->second = 0;
}

/* Closes the current window at now_ms if it counts, keeping its rate. */
static void close_window(avg__meter *m, uint64_t now_ms) {
  uint64_t ms = now_ms - m->win_ms;
  if (ms > 0 && m->win_bytes >= AVG__METER_MIN_BYTES) {
    double rate = (double)m->win_bytes * 1e3 / (double)ms;
    if (rate > m->best) {
      m->second = m->best;
      m->best = rate;
    } else if (rate > m->second) {
      m->second = rate;
    }
  }
  m->win_ms = now_ms;
  m->win_bytes = 0;
}

void avg__meter_add(avg__meter *m, uint64_t now_ms, size_t bytes) {
  if (!m->on)
    return;
  if (now_ms - m->win_ms >= AVG__METER_WINDOW_MS)
    close_window(m, now_ms);
  m->win_bytes += bytes;
  m->bytes += bytes;
}

void avg__meter_end(avg__meter *m, uint64_t now_ms) {
  if (!m->on)
    return;
  m->on = false;
  /* Not the round's last window: cut short, it may hold a burst that
   * waited in the socket buffers and say nothing of the link.  The whole
   * round instead, which is never above the link's rate; it is all a
   * round shorter than a window gives. */
  double est = m->second > 0 ? m->second : m->best;
  uint64_t ms = now_ms - m->start_ms;
  if (ms > 0 && m->bytes >= AVG__METER_MIN_BYTES) {
    double rate = (double)m->bytes * 1e3 / (double)ms;
    if (rate > est)
      est = rate;
  }
  if (est <= 0)
    return; /* nothing that counts: the estimate stays as it was */
  m->past[m->next] = est;
  m->next = (m->next + 1) % AVG__METER_ROUNDS;
  if (m->npast < AVG__METER_ROUNDS)
    m->npast++;
}

double avg__meter_mbit(const avg__meter *m) {
  double best = 0;
  for (size_t i = 0; i < m->npast; i++)
    if (m->past[i] > best)
      best = m->past[i];
  return best * 8 / 1e6;
}
