"""torch-reference.py: the model of tests/torch-trainer.py trained by one
PyTorch process on the very batches a swarm of its trainers averaged,
for tests/test-net-torch.sh's quality check.

In the swarm each trainer (shard K of N) draws batches from its shard in
an order of its own (torch-trainer.py: a generator seeded 1000 + K, one
permutation per pass) and writes down, with --batches, the swarm's epoch
each batch went in at.  beed's log says for each epoch how many samples
of the bee's went into the step ("train: epoch E done: S local samples,
... averaged in a group"): the last S / batch of the trainer's batches
of that epoch (batches before a state load are dropped, and a bee whose
round missed the step adds none).  Here one process takes exactly those
batches, epoch by epoch, a batch of each shard in turn, sums their mean
gradients and steps AdamW with the mean over the batches, as the
swarm's trainers do with beed's average.  After --epochs steps it prints
"reference: test accuracy A%" on the test set, with batch norm's
statistics made afresh as the trainers' --eval-at makes them.

  torch-reference.py --data DIR --shards N --epochs E --lr LR
                     --logs B0.log,B1.log,... --batches T0,T1,...
                     [--batch B]
"""

import argparse
import os
import re
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch_trainer = __import__("torch-trainer")

DONE = re.compile(r"train: epoch (\d+) done: (\d+) local samples, (.*)")


def used_samples(log, epochs):
    """Per epoch: the bee's samples in the swarm's step (first line)."""
    out = {}
    with open(log, errors="replace") as f:
        for line in f:
            m = DONE.search(line)
            if not m or int(m.group(1)) >= epochs:
                continue
            e = int(m.group(1))
            if e not in out:
                averaged = "averaged in a group" in m.group(3)
                out[e] = int(m.group(2)) if averaged else 0
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    logs, batch_files = a.logs.split(","), a.batches.split(",")
    if len(logs) != a.shards or len(batch_files) != a.shards:
        print("reference: one log and one batch file per shard",
              file=sys.stderr)
        return 2
    idx = torch_trainer.idx
    x = idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"))
    y = idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))
    tx = idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz"))
    ty = idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz"))
    shards = [(x[k::a.shards], y[k::a.shards]) for k in range(a.shards)]
    # Each shard's stream of batches as its trainer drew them.
    streams = []
    for k, (sx, sy) in enumerate(shards):
        g = torch.Generator().manual_seed(1000 + k)
        with open(batch_files[k]) as f:
            at = [int(v) for v in f.read().split()]
        per_pass = len(sx) // a.batch
        orders = [torch.randperm(len(sx), generator=g)
                  for _ in range(len(at) // per_pass + 1)]
        stream = [orders[i // per_pass][(i % per_pass) * a.batch:
                                        (i % per_pass + 1) * a.batch]
                  for i in range(len(at))]
        streams.append((at, stream, used_samples(logs[k], a.epochs)))
    torch.manual_seed(0)  # the trainers' first weights
    model = torch_trainer.Net()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    model.train()
    counts = []
    for e in range(a.epochs):
        picks = []
        for k, (at, stream, used) in enumerate(streams):
            mine = [stream[i] for i, v in enumerate(at) if v == e]
            n = used.get(e, 0)
            if n % a.batch or n // a.batch > len(mine):
                print(f"reference: shard {k} epoch {e}: {n} samples in the "
                      f"step, {len(mine)} batches of {a.batch} drawn",
                      file=sys.stderr)
                return 2
            picks.append(mine[len(mine) - n // a.batch:])
        counts.append("+".join(str(len(p)) for p in picks))
        batches = 0
        for i in range(max(len(p) for p in picks)):
            for k, p in enumerate(picks):
                if i < len(p):
                    sx, sy = shards[k]
                    F.cross_entropy(model(sx[p[i]]), sy[p[i]]).backward()
                    batches += 1
        if batches == 0:
            continue
        for p in model.parameters():
            p.grad.div_(batches)
        opt.step()
        opt.zero_grad()
    acc = torch_trainer.calibrated_test(model, x[:4096], tx, ty)
    print(f"reference: batches per epoch and shard {' '.join(counts)}",
          flush=True)
    print(f"reference: test accuracy {100 * acc:.2f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
