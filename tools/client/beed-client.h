/* beed-client.h: the trainer's side of beed's local trainer protocol
 * (docs/PROTOCOL.md section 13), for any program that trains a model of
 * its own in a beed swarm: PyTorch through tools/client/python/beed.py,
 * or C as below.  beed runs with --model external --trainer-socket PATH.
 *
 *   const char *names[] = {"w", "b"};
 *   int roles[] = {BEED_PARAM, BEED_PARAM};
 *   unsigned ndims[] = {2, 1};
 *   uint64_t dims[] = {10, 784, 10};
 *   beed_client *c;
 *   char err[256];
 *   beed_client_new(2, names, roles, ndims, dims, &c, err, sizeof err);
 *   float *w = beed_client_data(c, 0), *gw = beed_client_grad(c, 0);
 *   ... the initial weights into w ...
 *   beed_answer a;
 *   beed_client_hello(c, "/run/beed/lab.trainer", "lab",
 *                     BEED_GRADIENTS, 64, 0, &a);
 *   for (;;) {
 *     ... add a batch's mean gradient into gw (the memory is ours until
 *     the next call) ...
 *     beed_client_batch(c, 64, loss, &a);
 *     if (a.type == BEED_STEP) {  // gw holds the swarm's mean
 *       ... the optimizer's step on w, with gw; zero gw ...
 *       beed_client_stepped(c, a.epoch, &a);
 *     }
 *   }
 *   beed_client_close(c);
 *
 * The tensors live in memory shared with beed (a sealed memfd): beed
 * reads and writes it in place, never through the socket, and only
 * while the trainer waits in one of these calls.  Each call returns 0
 * or a negative code, with beed_client_error's text; none waits longer
 * than the timeout for beed's answer.  Not thread-safe: one thread
 * talks to beed.
 */
#ifndef BEED_CLIENT_H
#define BEED_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { BEED_GRADIENTS = 0, BEED_DILOCO = 1 };             /* averaging modes */
enum { BEED_PARAM = 0, BEED_STATE = 1, BEED_BUFFER = 2 }; /* tensor roles */
#define BEED_DIMS_MAX 8

/* beed's answers (PROTO_T_LOCAL_*'s numbers). */
enum {
  BEED_WELCOME = 81, /* to HELLO: the run as it stands */
  BEED_GO = 83,      /* train on */
  BEED_STEP = 84,    /* the round is in the memory: step, then stepped */
  BEED_LOADED = 86,  /* the swarm's state replaced ours; train on */
};

typedef struct beed_answer {
  int type;             /* BEED_WELCOME, _GO, _STEP, _LOADED */
  uint64_t epoch;       /* the epoch it is about */
  int loaded;           /* WELCOME: the memory holds a state beed loaded */
  int apply;            /* STEP: 1, the optimizer steps with the mean gradients;
                     0, beed stepped the parameters (DiLoCo) */
  int mode;             /* WELCOME: the run's averaging */
  uint64_t target;      /* WELCOME: the run's global batch */
  uint64_t samples;     /* GO: the swarm's samples in the epoch, as last seen */
  uint64_t peers;       /* WELCOME, GO: bees in the swarm */
  uint64_t inner_steps; /* WELCOME, DiLoCo: local steps between rounds */
  double outer_lr, outer_momentum; /* WELCOME, DiLoCo: the outer step's */
  /* WELCOME: 1, beed runs with --delay-averaging: an epoch's STEP comes
   * after a BATCH of the next epoch, and the gradients added since stay
   * in the memory through the step */
  int delayed;
  char compression[16]; /* WELCOME: the round's codec (--compression) */
} beed_answer;

typedef struct beed_client beed_client;

/* The shared memory for n tensors: names[i] (1..200 printable ASCII
 * bytes, no space), roles[i], ndims[i] dimensions (0..BEED_DIMS_MAX)
 * taken in turn from dims.  float32 all, zeroed.  Nothing is sent yet. */
int beed_client_new(size_t n, const char *const *names, const int *roles,
                    const unsigned *ndims, const uint64_t *dims,
                    beed_client **out, char *err, size_t errlen);
/* Tensor i in the memory, and a parameter's gradient (NULL for others). */
float *beed_client_data(beed_client *c, size_t i);
float *beed_client_grad(beed_client *c, size_t i);
/* Its elements. */
uint64_t beed_client_elems(const beed_client *c, size_t i);
/* Connects to beed at socket, says HELLO for run, and waits for WELCOME
 * (after which the memory holds the state to train from: the swarm's,
 * when a->loaded).  timeout_ms bounds every wait for beed from now on
 * (0: 600 s; a round or a state download takes a while). */
int beed_client_hello(beed_client *c, const char *socket, const char *run,
                      int mode, uint64_t batch, unsigned timeout_ms,
                      beed_answer *a);
/* A batch's gradients were added (their mean over its samples): says so,
 * waits for the answer. */
int beed_client_batch(beed_client *c, uint64_t samples, double loss,
                      beed_answer *a);
/* After a STEP: stepped; waits for the answer. */
int beed_client_stepped(beed_client *c, uint64_t epoch, beed_answer *a);
/* A test result, for beed's log (no answer). */
int beed_client_eval(beed_client *c, uint64_t epoch, double loss,
                     double accuracy);
/* What went wrong last, in words. */
const char *beed_client_error(const beed_client *c);
/* Says goodbye (if connected), unmaps, frees; NULL is ignored. */
void beed_client_close(beed_client *c);

#ifdef __cplusplus
}
#endif

#endif /* BEED_CLIENT_H */
