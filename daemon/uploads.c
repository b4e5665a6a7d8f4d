/* uploads.c: the state downloads a donor serves at once (see bee.h).
 *
 * "state.get" requests carry no session: a download is the run of chunk
 * requests one peer makes, so the table is keyed by the asking peer's id
 * and an entry lapses when its peer stops asking.  A bounded number of
 * them run at once, so a donor that many newcomers find at the same time
 * keeps its upload for the ones it serves (each gets its state sooner)
 * and its averaging rounds; the others hear "busy" at once and ask
 * another donor, or come back later, instead of waiting on timeouts.
 */
#include "bee.h"

#include <string.h>

static void drop(bee_uploads *u, size_t i) { u->u[i] = u->u[--u->n]; }

bee_upload *bee_uploads_admit(bee_uploads *u, const uint8_t id[PROTO_ID_BYTES],
                              uint64_t now_ms, unsigned max, bool *fresh,
                              void (*unpin)(void *pin, void *arg), void *arg) {
  *fresh = false;
  for (size_t i = 0; i < u->n;) {
    if (now_ms - u->u[i].last_ms >= BEE_UPLOAD_IDLE_MS) {
      if (unpin && u->u[i].pin)
        unpin(u->u[i].pin, arg);
      drop(u, i);
    } else {
      i++;
    }
  }
  for (size_t i = 0; i < u->n; i++)
    if (memcmp(u->u[i].id, id, PROTO_ID_BYTES) == 0) {
      u->u[i].last_ms = now_ms;
      return &u->u[i];
    }
  if (max > BEE_STATE_UPLOADS_MAX)
    max = BEE_STATE_UPLOADS_MAX;
  if (u->n >= max)
    return NULL;
  bee_upload *up = &u->u[u->n++];
  memset(up, 0, sizeof *up);
  memcpy(up->id, id, PROTO_ID_BYTES);
  up->start_ms = up->last_ms = now_ms;
  *fresh = true;
  return up;
}

size_t bee_uploads_active(const bee_uploads *u, uint64_t now_ms) {
  size_t k = 0;
  for (size_t i = 0; i < u->n; i++)
    k += now_ms - u->u[i].last_ms < BEE_UPLOAD_IDLE_MS;
  return k;
}

void bee_uploads_end(bee_uploads *u, bee_upload *up) {
  drop(u, (size_t)(up - u->u));
}
