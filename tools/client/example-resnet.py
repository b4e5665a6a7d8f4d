#!/usr/bin/python3
"""example-resnet.py: a ResNet-style PyTorch model (no torchvision)
trained on Fashion-MNIST in a beed swarm with beed.Optimizer.

Start the bee's beed first, with the run's settings, for example:

    beed --open --run-id fmnist --target-batch-size 4096 \\
      --model external --trainer-socket /tmp/fmnist.trainer

then, on every bee (each with its own --shard of --shards):

    PYTHONPATH=tools/client/python \\
    BEED_CLIENT_LIB=build/tools/client/libbeed-client.so \\
      tools/client/example-resnet.py --socket /tmp/fmnist.trainer \\
      --run fmnist --shard 0 --shards 2

(installed beed needs neither variable).  Every --test-every epochs of
the swarm it tests the model on the test set and reports the result to
beed, whose log shows it.  Ctrl-C says goodbye to beed, which leaves
the run and keeps the state for the next trainer.
"""

import argparse
import gzip
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

import beed


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:  # images
        rows, cols = struct.unpack(">II", data[8:16])
        x = torch.frombuffer(bytearray(data[16:]), dtype=torch.uint8)
        return x.view(n, 1, rows, cols).float().div_(255).sub_(0.2860).div_(0.3530)
    return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).long()


class Block(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride,
                                                 bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNet(nn.Module):
    """ResNet-8 for 28x28 images: a stem, three stages of one block."""

    def __init__(self, width=16, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.stages = nn.Sequential(Block(width, width, 1),
                                    Block(width, 2 * width, 2),
                                    Block(2 * width, 4 * width, 2))
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x):
        x = self.stages(F.relu(self.bn(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def test(model, tx, ty):
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(tx[i:i + 1000]) for i in range(0, len(tx), 1000)])
        acc = (out.argmax(1) == ty).float().mean().item()
        loss = F.cross_entropy(out, ty).item()
    model.train()
    return loss, acc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True, help="beed's --trainer-socket")
    ap.add_argument("--run", required=True, help="beed's --run-id")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=30, help="swarm epochs")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--test-every", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    x = load_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"))
    y = load_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))
    tx = load_idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz"))
    ty = load_idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz"))
    x, y = x[a.shard::a.shards], y[a.shard::a.shards]
    torch.manual_seed(0)  # every bee's trainer starts from the same weights
    model = ResNet()
    opt = beed.Optimizer(model.named_parameters(), torch.optim.AdamW,
                         lr=a.lr, weight_decay=1e-4, run_id=a.run,
                         batch_size_per_step=a.batch, model=model,
                         socket=a.socket)
    print(f"joined run '{a.run}' at epoch {opt.epoch} "
          f"({'the swarm state loaded' if opt.loaded else 'fresh'}), "
          f"{opt.peers} peers, target {opt.target_batch_size} samples")
    g = torch.Generator().manual_seed(a.shard)
    seen = opt.epoch
    try:
        while opt.epoch < a.epochs:
            order = torch.randperm(len(x), generator=g)
            for i in range(0, len(order) - a.batch + 1, a.batch):
                b = order[i:i + a.batch]
                loss = F.cross_entropy(model(x[b]), y[b])
                loss.backward()
                opt.step(loss=loss)
                opt.zero_grad()
                if opt.epoch == seen:
                    continue
                seen = opt.epoch
                line = f"epoch {seen}: {opt.peers} peers, loss {loss.item():.4f}"
                if seen % a.test_every == 0:
                    tl, acc = test(model, tx, ty)
                    opt.report_test(tl, acc)
                    line += f", test accuracy {100 * acc:.2f}%"
                print(line, flush=True)
                if seen >= a.epochs:
                    break
    except KeyboardInterrupt:
        print("interrupted: leaving the run")
    finally:
        opt.close()


if __name__ == "__main__":
    main()
