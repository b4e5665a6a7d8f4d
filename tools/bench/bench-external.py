"""bench-external.py: a PyTorch model's training alone, and through
beed.Optimizer with its beed, in one run (issue 31's benchmarks;
tools/bench/run-external starts the beeds).

Both take the same steps: K batches of B samples, their gradients added
up, then an AdamW step with the mean.  Alone, PyTorch does it by
itself; with beed, every batch goes to beed (BATCH), and the swarm's
step comes back when the swarm has gathered its target (K * B samples a
bee).  Runs alternate, R of each; prints the median samples/s of each,
the ratio, and how many times beed.Optimizer had to copy gradients into
the shared memory (0 when backward adds into it, as it should).

  bench-external.py --socket PATH --run RUN [--batches N] [--reps R]
                    [--batch B] [--per-step K] [--width W]
                    [--start T --phase-s S --target N]
Alone, R runs of N batches each.  With --start (several trainers, one
per beed of a swarm, started together): the runs are phases of S
seconds on the wall clock from time T (seconds since the epoch), alone
and in the swarm in turn, so that every trainer is alone, or in the
swarm, at the same time; --target is the swarm's (every bee's K * B
times the bees).  Then it also prints "rates: alone A1 A2 ... swarm S1
S2 ..." for run-external to gather.
"""

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import beed


class Net(nn.Module):
    """A small ResNet-style net for 28x28 images (two residual blocks)."""

    def __init__(self, w):
        super().__init__()
        self.stem = nn.Conv2d(1, w, 3, padding=1)
        self.bn0 = nn.BatchNorm2d(w)
        self.c1 = nn.Conv2d(w, w, 3, padding=1)
        self.b1 = nn.BatchNorm2d(w)
        self.c2 = nn.Conv2d(w, w, 3, padding=1)
        self.b2 = nn.BatchNorm2d(w)
        self.fc = nn.Linear(w, 10)

    def forward(self, x):
        x = F.relu(self.bn0(self.stem(x)))
        x = F.max_pool2d(x, 2)
        y = F.relu(self.b1(self.c1(x)))
        x = F.relu(x + self.b2(self.c2(y)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def run(model, step, xs, ys, batches, until=None):
    """samples/s over batches, or (until) over the batches begun before
    that wall-clock time, the time of the last one's step included."""
    t0 = time.perf_counter()
    i = 0
    while (i < batches) if until is None else (time.time() < until):
        x, y = xs[i % len(xs)], ys[i % len(ys)]
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        step(loss)
        i += 1
    return i * xs[0].shape[0] / (time.perf_counter() - t0)


def wait_until(t):
    left = t - time.time()
    if left > 0:
        time.sleep(left)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--batches", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--per-step", type=int, default=256)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--start", type=float)
    ap.add_argument("--phase-s", type=float, default=20.0)
    ap.add_argument("--target", type=int)
    a = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(a.batch, 1, 28, 28, generator=g) for _ in range(8)]
    ys = [torch.randint(0, 10, (a.batch,), generator=g) for _ in range(8)]
    torch.manual_seed(0)
    alone_model = Net(a.width)
    torch.manual_seed(0)
    beed_model = Net(a.width)
    alone_opt = torch.optim.AdamW(alone_model.parameters(), lr=1e-3)
    n = [0]

    def alone_step(loss):
        n[0] += 1
        if n[0] % a.per_step == 0:
            for p in alone_model.parameters():
                p.grad.div_(a.per_step)
            alone_opt.step()
            alone_opt.zero_grad(set_to_none=False)

    opt = beed.Optimizer(beed_model.named_parameters(), torch.optim.AdamW,
                         lr=1e-3, run_id=a.run, batch_size_per_step=a.batch,
                         target_batch_size=a.target or a.batch * a.per_step,
                         model=beed_model, socket=a.socket)

    def beed_step(loss):
        opt.step(loss=loss)
        opt.zero_grad()

    alone, swarm = [], []
    if a.start is None:
        run(alone_model, alone_step, xs, ys, a.per_step)  # warm-up, both
        run(beed_model, beed_step, xs, ys, a.per_step)
        e0 = opt.epoch
        for _ in range(a.reps):
            alone.append(run(alone_model, alone_step, xs, ys, a.batches))
            swarm.append(run(beed_model, beed_step, xs, ys, a.batches))
        runs = f"{a.reps} runs of {a.batches} batches each"
    else:  # phases on the wall clock, as every trainer of the swarm has
        e0 = opt.epoch
        t = a.start
        for _ in range(a.reps):
            wait_until(t)
            t += a.phase_s
            alone.append(run(alone_model, alone_step, xs, ys, 0, until=t))
            wait_until(t)
            t += a.phase_s
            swarm.append(run(beed_model, beed_step, xs, ys, 0, until=t))
        runs = f"{a.reps} phases of {a.phase_s:g} s each"
    ma, ms = statistics.median(alone), statistics.median(swarm)
    params = sum(p.numel() for p in beed_model.parameters())
    print(f"model: {params} parameters, batch {a.batch}, a step every "
          f"{a.per_step} batches; {runs}")
    print(f"alone:             {ma:10.1f} samples/s (runs: "
          + ", ".join(f"{v:.0f}" for v in alone) + ")")
    print(f"beed.Optimizer:    {ms:10.1f} samples/s (runs: "
          + ", ".join(f"{v:.0f}" for v in swarm) + ")")
    print(f"beed / alone:      {ms / ma:10.3f} (target >= 0.97)")
    print(f"swarm steps taken: {opt.epoch - e0}, {opt.peers} peers; "
          f"gradient copies into the shared memory: {opt.grad_copies}")
    if a.start is not None:
        print("rates: alone " + " ".join(f"{v:.1f}" for v in alone)
              + " swarm " + " ".join(f"{v:.1f}" for v in swarm), flush=True)
    opt.close()


if __name__ == "__main__":
    main()
