/* beectl.h: what beectl's command files share: flag parsing and errors. */
#ifndef BEE_BEECTL_H
#define BEE_BEECTL_H

#include "proto.h"

#define EXIT_USAGE 2
#define MAX_POSITIONAL 2

typedef struct flag {
  const char *name; /* "--out" */
  bool has_value;   /* takes an argument */
  bool required;
  bool set;
  const char *value; /* the argument, when set */
} flag;

typedef struct args {
  flag *flags;
  size_t nflags;
  const char *pos[MAX_POSITIONAL];
  size_t npos;
} args;

/* "beectl: " and the message on stderr. */
void beectl_errorf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Parses argv into a's flags ("--name VALUE" or "--name=VALUE") and up to
 * npos_max positional arguments, then checks the required flags are there.
 * Returns 0 or EXIT_USAGE (reported). */
int beectl_parse_args(args *a, int argc, char **argv, size_t npos_max);
int beectl_parse_pk(const flag *f, uint8_t pk[PROTO_PK_BYTES]);
int beectl_parse_swarm(const flag *f);
/* Parses "N" followed by s, m, h or d into seconds.  Returns 0 or -1. */
int beectl_parse_duration(const char *s, uint64_t *secs);

/* dht.c: beectl dht get|put|peers, and beectl links (argv[0] "links"). */
int beectl_dht(int argc, char **argv);

/* links.c: a bee's name (its progress label) and links record. */
typedef struct beectl_label {
  uint8_t id[PROTO_ID_BYTES];
  char label[PROTO_LABEL_MAX + 1];
} beectl_label;
typedef struct beectl_links_rec {
  uint8_t owner[PROTO_ID_BYTES];
  proto_links links;
} beectl_links_rec;
/* Prints the link matrices (or with pairs one line per measured pair).
 * Returns the exit status. */
int beectl_links_print(const beectl_label *labels, size_t nlabels,
                       const beectl_links_rec *recs, size_t nrecs, bool pairs);
/* control.c: beectl status|leave [--control PATH]. */
int beectl_control(const char *cmd, int argc, char **argv);

#endif
