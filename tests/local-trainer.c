/* local-trainer.c: a trainer process in C for beed's --model external
 * (tools/client/beed-client.h), for tests/test-net-external.sh.
 *
 * Softmax regression of CLASSES classes over FEATURES features, on a
 * stream of its own (--seed) drawn around class centres every trainer
 * shares; momentum SGD as its optimizer (the momentum and a step count
 * its optimizer state), and a running mean of the inputs as a buffer.
 * Gradient mode: each batch's mean gradient is added to the shared
 * gradients; at a STEP, its optimizer steps with the swarm's mean.
 * DiLoCo (--diloco): each batch is a plain SGD step of its own, and
 * beed takes the outer steps.  After --epochs epochs it prints
 * "trainer: epoch E loss L parameters HASH" (HASH as beed's step lines
 * print it, over the shared memory) and says goodbye.
 * With beed's --delay-averaging (WELCOME's delayed) a STEP answers a
 * batch of the next epoch: after it the gradients must be those the
 * trainer had added by then, bit for bit (beed kept them aside through
 * the step); it checks that at each such STEP, exits 1 on the first
 * that is not, and prints how many it checked.
 *
 *   local-trainer --socket PATH --run RUN [--batch B] [--epochs N]
 *                 [--seed S] [--diloco] [--features F] [--lr LR]
 *                 [--kill-at EPOCH] [--batch-ms MS]
 * --features changes the schema (a trainer beed's swarm must refuse);
 * --kill-at exits at once, without a goodbye, once EPOCH begins;
 * --batch-ms makes each batch take that long at least (a model's compute),
 * so that epochs last seconds, as the swarm's records need.
 */
#include "beed-client.h"

#include <math.h>
#include <stdbool.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CLASSES 4

static uint64_t rng_state;

static double uniform(void) { /* xorshift64*, in [0, 1) */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ull) >> 11) /
         9007199254740992.0;
}

static void hash_hex(const float *p, size_t n, char out[17]) {
  uint8_t h[8];
  crypto_generichash(h, sizeof h, (const uint8_t *)p, n * sizeof(float), NULL,
                     0);
  for (int i = 0; i < 8; i++)
    snprintf(out + 2 * i, 3, "%02x", h[i]);
}

int main(int argc, char **argv) {
  const char *sock = NULL, *run = NULL;
  unsigned batch = 32, epochs = 3, features = 16, kill_at = 0, batch_ms = 0;
  uint64_t seed = 1;
  int mode = BEED_GRADIENTS;
  double lr = 0.5;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--diloco") == 0) {
      mode = BEED_DILOCO;
      continue;
    }
    if (!v) {
      fprintf(stderr, "local-trainer: %s needs a value\n", a);
      return 2;
    }
    i++;
    if (strcmp(a, "--socket") == 0)
      sock = v;
    else if (strcmp(a, "--run") == 0)
      run = v;
    else if (strcmp(a, "--batch") == 0)
      batch = (unsigned)atoi(v);
    else if (strcmp(a, "--epochs") == 0)
      epochs = (unsigned)atoi(v);
    else if (strcmp(a, "--seed") == 0)
      seed = strtoull(v, NULL, 10);
    else if (strcmp(a, "--features") == 0)
      features = (unsigned)atoi(v);
    else if (strcmp(a, "--lr") == 0)
      lr = atof(v);
    else if (strcmp(a, "--kill-at") == 0)
      kill_at = (unsigned)atoi(v);
    else if (strcmp(a, "--batch-ms") == 0)
      batch_ms = (unsigned)atoi(v);
    else {
      fprintf(stderr, "local-trainer: unknown flag %s\n", a);
      return 2;
    }
  }
  if (!sock || !run || !batch || !features || sodium_init() < 0) {
    fprintf(stderr, "local-trainer: --socket and --run are needed\n");
    return 2;
  }
  const unsigned F = features;
  const char *names[] = {"fc.weight",
                         "fc.bias",
                         "state.fc.weight.momentum",
                         "state.fc.bias.momentum",
                         "state.step",
                         "inputs.running_mean"};
  int roles[] = {BEED_PARAM, BEED_PARAM, BEED_STATE,
                 BEED_STATE, BEED_STATE, BEED_BUFFER};
  unsigned ndims[] = {2, 1, 2, 1, 0, 1};
  uint64_t dims[] = {CLASSES, F, CLASSES, CLASSES, F, CLASSES, F};
  beed_client *c;
  char err[512];
  if (beed_client_new(6, names, roles, ndims, dims, &c, err, sizeof err)) {
    fprintf(stderr, "local-trainer: %s\n", err);
    return 1;
  }
  float *w = beed_client_data(c, 0), *b = beed_client_data(c, 1);
  float *gw = beed_client_grad(c, 0), *gb = beed_client_grad(c, 1);
  float *mw = beed_client_data(c, 2), *mb = beed_client_data(c, 3);
  float *steps = beed_client_data(c, 4), *mean = beed_client_data(c, 5);
  size_t np = CLASSES * F + CLASSES; /* w and b lie together */
  /* The class centres every trainer shares; initial weights from the
   * run's seed (the same for all), the data from --seed. */
  float *centre = malloc(sizeof(float) * CLASSES * F);
  float *x = malloc(sizeof(float) * F * batch);
  float *mine = malloc(sizeof(float) * np); /* the gradients at a BATCH */
  int *y = malloc(sizeof(int) * batch);
  rng_state = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < CLASSES * F; i++)
    centre[i] = (float)(2 * uniform() - 1);
  for (size_t i = 0; i < CLASSES * F; i++)
    w[i] = (float)(0.1 * (2 * uniform() - 1));
  rng_state = 0x5851f42d4c957f2dull ^ (seed * 0x9e3779b97f4a7c15ull);
  beed_answer a;
  if (beed_client_hello(c, sock, run, mode, batch, 0, &a)) {
    fprintf(stderr, "local-trainer: %s\n", beed_client_error(c));
    beed_client_close(c);
    return 1;
  }
  printf("trainer: welcome at epoch %llu (%s), target %llu, %llu peers\n",
         (unsigned long long)a.epoch, a.loaded ? "a state loaded" : "fresh",
         (unsigned long long)a.target, (unsigned long long)a.peers);
  fflush(stdout);
  uint64_t epoch = a.epoch;
  double loss = 0;
  int rc = 0, delayed = a.delayed;
  unsigned held = 0;
  uint64_t cur = a.epoch; /* beed's epoch, by its last answer */
  while (epoch < epochs) {
    if (kill_at && epoch >= kill_at) {
      printf("trainer: dying at epoch %llu\n", (unsigned long long)epoch);
      fflush(stdout);
      _exit(3);
    }
    /* A batch: the mean gradient of the cross-entropy, added in. */
    loss = 0;
    for (unsigned s = 0; s < batch; s++) {
      y[s] = (int)(uniform() * CLASSES) % CLASSES;
      for (unsigned f = 0; f < F; f++)
        x[s * F + f] = centre[y[s] * F + f] + (float)(1.5 * (uniform() - 0.5));
    }
    float *dst_w = gw, *dst_b = gb;
    for (unsigned s = 0; s < batch; s++) {
      double z[CLASSES], zmax = -1e300, sum = 0;
      for (int k = 0; k < CLASSES; k++) {
        z[k] = b[k];
        for (unsigned f = 0; f < F; f++)
          z[k] += (double)w[k * F + f] * x[s * F + f];
        zmax = z[k] > zmax ? z[k] : zmax;
      }
      for (int k = 0; k < CLASSES; k++)
        sum += exp(z[k] - zmax);
      loss -= (z[y[s]] - zmax - log(sum)) / batch;
      for (int k = 0; k < CLASSES; k++) {
        double d = (exp(z[k] - zmax) / sum - (k == y[s])) / batch;
        for (unsigned f = 0; f < F; f++)
          dst_w[k * F + f] += (float)(d * x[s * F + f]);
        dst_b[k] += (float)d;
      }
    }
    for (unsigned f = 0; f < F; f++) { /* the buffer: the inputs' mean */
      double m = 0;
      for (unsigned s = 0; s < batch; s++)
        m += x[s * F + f];
      mean[f] = (float)(0.9 * mean[f] + 0.1 * m / batch);
    }
    if (mode == BEED_DILOCO) { /* an inner step of its own */
      for (size_t i = 0; i < np; i++) {
        w[i] -= (float)lr * gw[i];
        gw[i] = 0;
      }
    }
    if (batch_ms) {
      struct timespec ts = {batch_ms / 1000, (long)(batch_ms % 1000) * 1000000};
      nanosleep(&ts, NULL);
    }
    memcpy(mine, gw, sizeof(float) * np); /* w and b's gradients lie together */
    uint64_t at = cur;
    if ((rc = beed_client_batch(c, batch, loss, &a)))
      break;
    bool stepped = a.type == BEED_STEP;
    while (a.type == BEED_STEP) {
      if (a.apply) { /* momentum SGD with the swarm's mean gradient */
        for (size_t i = 0; i < np; i++) {
          mw[i] = 0.9f * mw[i] + gw[i];
          w[i] -= (float)lr * mw[i];
        }
        steps[0] += 1;
      }
      epoch = a.epoch + 1;
      if ((rc = beed_client_stepped(c, a.epoch, &a)))
        break;
    }
    if (rc)
      break;
    /* A delayed step within the epoch: the gradients are the trainer's
     * again. */
    if (delayed && stepped && a.type == BEED_GO && a.epoch == at) {
      if (memcmp(mine, gw, sizeof(float) * np) != 0) {
        printf("trainer: after the delayed step of epoch %llu the "
               "gradients are not those added before it\n",
               (unsigned long long)epoch - 1);
        fflush(stdout);
        rc = 1;
        break;
      }
      held++;
    }
    cur = a.epoch;
    if (a.type == BEED_LOADED) {
      epoch = a.epoch;
      printf("trainer: the swarm's state of epoch %llu loaded\n",
             (unsigned long long)epoch);
      fflush(stdout);
    }
    (void)mb;
  }
  if (rc && rc != 1)
    fprintf(stderr, "local-trainer: %s\n", beed_client_error(c));
  if (rc == 0 && delayed)
    printf("trainer: %u delayed steps, the gradients added before each "
           "kept through it\n",
           held);
  if (rc == 0) {
    char hex[17];
    hash_hex(w, np, hex);
    printf("trainer: epoch %llu loss %.4f parameters %s steps %.0f\n",
           (unsigned long long)epoch, loss, hex, steps[0]);
  }
  beed_client_close(c);
  free(centre);
  free(mine);
  free(x);
  free(y);
  return rc ? 1 : 0;
}
