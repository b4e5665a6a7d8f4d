/* links.c: beectl links, the swarm's link matrix as its bees measured it.
 *
 * Each bee publishes a signed links record under "<run>_links": for each
 * peer it averaged with, downloaded from or probed, the least round trip
 * and the rate data from that peer reached it at.  This prints them as
 * the two matrices a person compares with a provider's figures (rate and
 * round trip, the row's bee to the column's), names taken from the bees'
 * progress labels, or as one line per measured pair with --pairs.
 */
#include "beectl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NODES_MAX 256 /* bees shown; the rest are counted */

typedef struct node {
  uint8_t id[PROTO_ID_BYTES];
  char name[PROTO_LABEL_MAX + 1];
} node;

static size_t node_index(node *v, size_t *n, const uint8_t id[PROTO_ID_BYTES],
                         const beectl_label *labels, size_t nlabels) {
  for (size_t i = 0; i < *n; i++)
    if (memcmp(v[i].id, id, PROTO_ID_BYTES) == 0)
      return i;
  if (*n == NODES_MAX)
    return SIZE_MAX;
  node *e = &v[(*n)++];
  memcpy(e->id, id, PROTO_ID_BYTES);
  proto_hex(id, 4, e->name);
  for (size_t i = 0; i < nlabels; i++)
    if (memcmp(labels[i].id, id, PROTO_ID_BYTES) == 0 && labels[i].label[0])
      snprintf(e->name, sizeof e->name, "%s", labels[i].label);
  return (size_t)(e - v);
}

/* The cell of the pair (from, to): the entry `to` published for `from`. */
static const proto_link *cell(const beectl_links_rec *recs, size_t nrecs,
                              const node *from, const node *to) {
  for (size_t r = 0; r < nrecs; r++) {
    if (memcmp(recs[r].owner, to->id, PROTO_ID_BYTES) != 0)
      continue;
    for (size_t i = 0; i < recs[r].links.n; i++)
      if (memcmp(recs[r].links.links[i].id, from->id, PROTO_ID_BYTES) == 0)
        return &recs[r].links.links[i];
  }
  return NULL;
}

static void matrix(const char *title, const node *v, size_t n,
                   const beectl_links_rec *recs, size_t nrecs, bool rtt) {
  printf("%-14s", title);
  for (size_t j = 0; j < n; j++)
    printf(" %10.10s", v[j].name);
  printf("\n");
  for (size_t i = 0; i < n; i++) {
    printf("%-14.14s", v[i].name);
    for (size_t j = 0; j < n; j++) {
      const proto_link *l = i == j ? NULL : cell(recs, nrecs, &v[i], &v[j]);
      if (i == j)
        printf(" %10s", "-");
      else if (!l || (rtt ? l->rtt_us == 0 : l->mbit <= 0))
        printf(" %10s", "?");
      else if (rtt)
        printf(" %10.1f", (double)l->rtt_us / 1000);
      else
        printf(" %10.1f", l->mbit);
    }
    printf("\n");
  }
}

int beectl_links_print(const beectl_label *labels, size_t nlabels,
                       const beectl_links_rec *recs, size_t nrecs, bool pairs) {
  node *v = calloc(NODES_MAX, sizeof *v);
  size_t n = 0, measured = 0;
  bool left_out = false;
  if (!v)
    return 1;
  for (size_t r = 0; r < nrecs; r++) {
    if (node_index(v, &n, recs[r].owner, labels, nlabels) == SIZE_MAX)
      left_out = true;
    for (size_t i = 0; i < recs[r].links.n; i++) {
      const proto_link *l = &recs[r].links.links[i];
      if (node_index(v, &n, l->id, labels, nlabels) == SIZE_MAX)
        left_out = true;
      measured++;
    }
  }
  if (pairs) {
    for (size_t r = 0; r < nrecs; r++) {
      size_t to = node_index(v, &n, recs[r].owner, labels, nlabels);
      for (size_t i = 0; i < recs[r].links.n && to != SIZE_MAX; i++) {
        const proto_link *l = &recs[r].links.links[i];
        size_t from = node_index(v, &n, l->id, labels, nlabels);
        char a[2 * PROTO_ID_BYTES + 1], b[2 * PROTO_ID_BYTES + 1];
        if (from == SIZE_MAX)
          continue;
        proto_hex(l->id, PROTO_ID_BYTES, a);
        proto_hex(recs[r].owner, PROTO_ID_BYTES, b);
        printf("%s\t%s\t%s\t%s\t%.3f\t%.3f\t%llu\n", a, v[from].name, b,
               v[to].name, (double)l->rtt_us / 1000, l->mbit,
               (unsigned long long)l->age_s);
      }
    }
  } else {
    printf("%zu bees, %zu links measured (from the row's bee to the "
           "column's)\n",
           n, measured);
    matrix("Mbit/s", v, n, recs, nrecs, false);
    printf("\n");
    matrix("round trip ms", v, n, recs, nrecs, true);
  }
  if (left_out)
    fprintf(stderr, "beectl: more than %d bees: the others are not shown\n",
            NODES_MAX);
  free(v);
  return 0;
}
