/* bench-mpi.c: OpenMPI's MPI_Allreduce (sum of fp32) timed as bench-avg
 * times beed's, for tools/bench/run-avg.  Run under mpirun; run-avg
 * restricts it to TCP over loopback (--mca btl tcp,self), so that it
 * moves its bytes the way beed and Gloo do, not through shared memory.
 *
 * For every size: --warmup uncounted rounds, then --reps rounds, each
 * after a barrier; a round's time is the slowest rank's.  The sum is
 * divided by the number of ranks afterwards, as a mean needs (beed's
 * round returns the mean itself), and checked.
 *
 * Output: "RESULT impl=openmpi procs=N bytes=S reps=R ms_median=...
 * ms_min=... busbw_gbs=...", one line per size, from rank 0.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int rank, procs, reps = 5, warmup = 2;
  size_t sizes[16] = {4, 1u << 20, 100u << 20};
  int nsizes = 3;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &procs);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
      warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
      nsizes = 0;
      for (char *s = argv[++i], *end; *s && nsizes < 16; s = end) {
        sizes[nsizes++] = strtoull(s, &end, 10);
        if (end == s)
          break;
        if (*end == ',')
          end++;
      }
    }
  }
  if (reps < 1)
    reps = 1;
  int bad = 0;
  for (int s = 0; s < nsizes; s++) {
    size_t n = sizes[s] / 4;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    double *t = calloc((size_t)reps, sizeof *t);
    if (!x || !y || !t)
      MPI_Abort(MPI_COMM_WORLD, 1);
    for (int r = -warmup; r < reps; r++) {
      for (size_t j = 0; j < n; j++)
        x[j] = (float)(rank + 1);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(x, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      float inv = 1.0f / (float)procs;
      for (size_t j = 0; j < n; j++)
        y[j] *= inv;
      double mine = (MPI_Wtime() - t0) * 1e3, slowest;
      MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (fabsf(y[0] - (float)(procs + 1) / 2) > 1e-6f * procs)
        bad = 1;
      if (r >= 0 && rank == 0)
        t[r] = slowest;
    }
    if (rank == 0) {
      qsort(t, (size_t)reps, sizeof *t, cmp_double);
      double med = reps % 2 ? t[reps / 2] : (t[reps / 2 - 1] + t[reps / 2]) / 2;
      double bus = 2.0 * (procs - 1) / procs * (double)sizes[s];
      printf("RESULT impl=openmpi procs=%d bytes=%zu reps=%d ms_median=%.4f "
             "ms_min=%.4f busbw_gbs=%.4f\n",
             procs, sizes[s], reps, med, t[0], bus / (med * 1e-3) / 1e9);
      fflush(stdout);
    }
    free(x);
    free(y);
    free(t);
  }
  if (bad)
    fprintf(stderr, "bench-mpi: rank %d: wrong mean\n", rank);
  MPI_Finalize();
  return bad;
}
