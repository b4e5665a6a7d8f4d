/* pool.c: the CPU backend's worker threads (trainer-int.h).
 *
 * One pool for the process, sized by trn_cpu_threads_set: a job runs as
 * n parts at once, part 0 on the calling thread and parts 1..n-1 on the
 * pool's workers, and the call returns when all are done.  Callers split
 * their work by part number, statically, so that a result depends on the
 * number of threads and on nothing else (no work stealing, no order of
 * arrival).  While a job runs, OpenBLAS is held to one thread, so that the
 * parts' own matrix products do not each start a team of their own.
 */
#include "trainer-int.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>

typedef struct pool {
  int n; /* parts: the caller and n - 1 workers */
  pthread_t th[TRN__THREADS_MAX];
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  uint64_t gen; /* jobs started */
  int finished; /* workers done with the current job */
  bool stop;
  bool busy; /* a job is running */
  void (*fn)(void *arg, int part, int parts);
  void *arg;
} pool;

static pool *the; /* NULL: one thread, jobs run inline */

typedef struct worker_arg {
  pool *p;
  int part;
} worker_arg;

static worker_arg args[TRN__THREADS_MAX];

static void *worker(void *a) {
  worker_arg *w = a;
  pool *p = w->p;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->stop && p->gen == seen)
      pthread_cond_wait(&p->go, &p->mu);
    if (p->stop)
      break;
    seen = p->gen;
    void (*fn)(void *, int, int) = p->fn;
    void *arg = p->arg;
    int n = p->n;
    pthread_mutex_unlock(&p->mu);
    fn(arg, w->part, n);
    pthread_mutex_lock(&p->mu);
    if (++p->finished == n - 1)
      pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void pool_stop(void) {
  pool *p = the;
  if (!p)
    return;
  the = NULL;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->n; i++)
    pthread_join(p->th[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->go);
  pthread_cond_destroy(&p->done);
  free(p);
}

int trn__pool_resize(int n) {
  if (n < 1 || n > TRN__THREADS_MAX)
    return -1;
  if ((the ? the->n : 1) == n)
    return 0;
  pool_stop();
  if (n == 1)
    return 0;
  pool *p = calloc(1, sizeof *p);
  if (!p)
    return -1;
  p->n = n;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->go, NULL);
  pthread_cond_init(&p->done, NULL);
  for (int i = 1; i < n; i++) {
    args[i] = (worker_arg){p, i};
    if (pthread_create(&p->th[i], NULL, worker, &args[i]) != 0) {
      /* Fewer threads than asked: run with those that started. */
      p->n = i;
      break;
    }
  }
  the = p;
  return p->n == n ? 0 : -1;
}

int trn__pool_size(void) { return the ? the->n : 1; }

int trn__pool_run(void (*fn)(void *arg, int part, int parts), void *arg) {
  pool *p = the;
  bool mine = false;
  if (p) { /* busy with another thread's job: this one runs alone */
    pthread_mutex_lock(&p->mu);
    if (!p->busy)
      p->busy = mine = true;
    pthread_mutex_unlock(&p->mu);
  }
  if (!mine) {
    fn(arg, 0, 1);
    return 1;
  }
  openblas_set_num_threads(1);
  pthread_mutex_lock(&p->mu);
  p->fn = fn, p->arg = arg, p->finished = 0;
  p->gen++;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  fn(arg, 0, p->n);
  pthread_mutex_lock(&p->mu);
  while (p->finished < p->n - 1)
    pthread_cond_wait(&p->done, &p->mu);
  p->busy = false;
  pthread_mutex_unlock(&p->mu);
  openblas_set_num_threads(p->n);
  return p->n;
}

void trn__pool_range(size_t n, int part, int parts, size_t *a, size_t *b) {
  *a = n * (size_t)part / (size_t)parts;
  *b = n * (size_t)(part + 1) / (size_t)parts;
}

typedef struct range_job {
  void (*fn)(void *arg, size_t a, size_t b);
  void *arg;
  size_t n;
} range_job;

static void range_part(void *arg, int part, int parts) {
  range_job *j = arg;
  size_t a, b;
  trn__pool_range(j->n, part, parts, &a, &b);
  if (a < b)
    j->fn(j->arg, a, b);
}

void trn__pool_for(size_t n, size_t grain,
                   void (*fn)(void *arg, size_t a, size_t b), void *arg) {
  if (trn__pool_size() < 2 || n < 2 * grain) {
    if (n)
      fn(arg, 0, n);
    return;
  }
  range_job j = {fn, arg, n};
  trn__pool_run(range_part, &j);
}
