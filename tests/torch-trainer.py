"""torch-trainer.py: a PyTorch trainer in a beed swarm, for
tests/test-net-torch.sh (Debian's python3-torch; tools/client/python).

A small conv net with batch norm (a model beed's own trainer does not
have) on Fashion-MNIST, read here from the IDX files, each trainer on
its own shard (--shard K of --shards N), AdamW through beed.Optimizer.
Every trainer seeds torch alike, so the run starts from one set of
weights.  Prints one line per swarm epoch it reaches, then, after
--epochs epochs, the test accuracy (also reported to beed) and
"torch: parameters HASH": BLAKE2b-64 of the parameters' bytes in order,
as beed's step lines print it.

  torch-trainer.py --socket PATH --run RUN --data DIR --shard K --shards N
                   [--epochs E] [--batch B] [--target T] [--lr LR]
                   [--batch-ms MS] [--diloco INNER_STEPS] [--delay]
                   [--batches FILE] [--eval-at EPOCH] [--compression C]
--diloco trains with beed.DiLoCo (AdamW as the inner optimizer), saying
INNER_STEPS as the run's.
--delay says delay_averaging=True (beed's --delay-averaging), and
--compression the rounds' codec (beed's --compression).
--batches writes to FILE the swarm's epoch each batch went in at, one a
line, as it goes (tests/torch-reference.py retraces the swarm from it).
--eval-at prints "torch: test accuracy at epoch EPOCH: A%" when the
swarm's step takes the trainer to EPOCH, with batch norm's statistics
made afresh (calibrated_test).
--batch-ms makes each batch take that long at least, so that the
swarm's epochs last the seconds its records need on a shared machine.
"""

import argparse
import gzip
import hashlib
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import beed


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        x = torch.frombuffer(bytearray(data[16:]), dtype=torch.uint8)
        return x.view(n, 1, rows, cols).float().div_(255).sub_(0.2860).div_(0.3530)
    return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).long()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def calibrated_test(model, x, tx, ty, n=4096):
    """The test accuracy of the model's parameters alone: batch norm's
    statistics made afresh from the first n training images (a cumulative
    mean), used, and put back as they were.  The statistics a trainer
    keeps are its own batches' (beed does not average buffers); these are
    the same for the same parameters wherever they are computed."""
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        saved = [b.clone() for b in model.buffers()]
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
        model.train()
        for i in range(0, n, 512):
            model(x[i:i + 512])
        model.eval()
        acc = (model(tx).argmax(1) == ty).float().mean().item()
        for m in bns:
            m.momentum = 0.1
        for b, v in zip(model.buffers(), saved):
            b.copy_(v)
    model.train()
    return acc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--shard", type=int, required=True)
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--target", type=int)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-ms", type=float, default=0)
    ap.add_argument("--diloco", type=int)
    ap.add_argument("--delay", action="store_true")
    ap.add_argument("--compression")
    ap.add_argument("--batches")
    ap.add_argument("--eval-at", type=int)
    a = ap.parse_args()
    torch.set_num_threads(1)
    x = idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"))
    y = idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))
    tx = idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz"))
    ty = idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz"))
    calib = x[:4096]
    x, y = x[a.shard::a.shards], y[a.shard::a.shards]
    torch.manual_seed(0)  # one set of first weights for the run
    model = Net()
    if a.diloco:
        opt = beed.DiLoCo(model, torch.optim.AdamW, lr=a.lr, run_id=a.run,
                          batch_size_per_step=a.batch, inner_steps=a.diloco,
                          socket=a.socket)
    else:
        opt = beed.Optimizer(model.named_parameters(), torch.optim.AdamW,
                             lr=a.lr, run_id=a.run,
                             batch_size_per_step=a.batch,
                             target_batch_size=a.target, model=model,
                             delay_averaging=True if a.delay else None,
                             compression=a.compression,
                             socket=a.socket)
    print(f"torch: welcome at epoch {opt.epoch}, "
          f"{'a state loaded' if opt.loaded else 'fresh'}", flush=True)
    g = torch.Generator().manual_seed(1000 + a.shard)
    seen = opt.epoch
    model.train()
    log = open(a.batches, "a", buffering=1) if a.batches else None

    def test():
        model.eval()
        with torch.no_grad():
            out = model(tx)
            acc = (out.argmax(1) == ty).float().mean().item()
            tl = F.cross_entropy(out, ty).item()
        model.train()
        return acc, tl

    while opt.epoch < a.epochs:
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(order) - a.batch + 1, a.batch):
            t0 = time.monotonic()
            b = order[i:i + a.batch]
            loss = F.cross_entropy(model(x[b]), y[b])
            loss.backward()
            left = a.batch_ms / 1000 - (time.monotonic() - t0)
            if left > 0:
                time.sleep(left)
            at = opt.epoch
            opt.step(loss=loss)
            opt.zero_grad()
            if log:
                log.write(f"{at}\n")
            if opt.epoch != seen:
                seen = opt.epoch
                print(f"torch: epoch {seen}, {opt.peers} peers", flush=True)
                if seen == a.eval_at:
                    acc = calibrated_test(model, calib, tx, ty)
                    print(f"torch: test accuracy at epoch {seen}: "
                          f"{100 * acc:.2f}%", flush=True)
            if opt.epoch >= a.epochs:
                break
    if log:
        log.close()
    acc, tl = test()
    opt.report_test(tl, acc)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    h = hashlib.blake2b(params.numpy().tobytes(), digest_size=8).hexdigest()
    print(f"torch: test accuracy {100 * acc:.2f}% loss {tl:.4f}", flush=True)
    print(f"torch: parameters {h}", flush=True)
    # state_dict and load_state_dict: the state comes back into the
    # shared memory, values and places unchanged.
    sd = opt.state_dict()
    where = [opt.opt.state[p][k].data_ptr() for p, k in opt._state]
    before = [opt.opt.state[p][k].clone() for p, k in opt._state]
    opt.load_state_dict(sd)
    ok = all(opt.opt.state[p][k].data_ptr() == w and
             torch.equal(opt.opt.state[p][k], b)
             for (p, k), w, b in zip(opt._state, where, before))
    print(f"torch: state_dict round trip {'ok' if ok else 'BROKEN'} "
          f"({len(where)} state tensors, epoch {sd['epoch']})", flush=True)
    opt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
