#!/usr/bin/python3
"""bench-train-torch.py: PyTorch's CPU training samples per second, timed
as bench-train times beed's (tools/bench/run-train).  A benchmark tool;
never a runtime dependency.

The same model (mlp 784-256-10: Linear, ReLU, Linear; or cnn: conv 5x5 to
32, ReLU, max-pool 2, conv 5x5 to 64, ReLU, max-pool 2, dense 1024, ReLU,
dropout 0.5, dense 10; or resnet: the ResNet that tests/gen-trainer-ref.py
checks trainer/resnet.c against, --depth and --width; or gpt: that
file's Gpt at trainer.h's default size on random tokens), Fashion-MNIST's
training set normalized once up front as float32 (or, with --data
synthetic:CxHxW:K, uniform noise made each step as bench-train makes its
own), --threads threads in both of PyTorch's pools: torch.set_num_threads
for ATen's OpenMP, and OPENBLAS_NUM_THREADS for the matrix products, which
Debian's torch does in the system OpenBLAS, whose own pthread pool ignores
torch.set_num_threads (without it "1 thread" ran its products on every
core), with OMP_WAIT_POLICY=PASSIVE (see below).  Per step: a batch from
a shuffled order (index_select), zero_grad, forward, cross-entropy, backward, SGD with momentum 0.9.
--warmup uncounted steps, then --steps timed.  Prints "RESULT impl=torch
model=mlp batch=B threads=T samples_per_s=... loss=... cores=..."; cores
is CPU time over wall time in the timed steps, so a run that used more
cores than it was given shows.
"""
import argparse
import contextlib
import gzip
import importlib.util
import os
import sys
import time


def threads_arg(argv):
    """--threads N or --threads=N from argv, before argparse runs: the
    OpenBLAS pool is sized when numpy or torch first loads it."""
    for i, v in enumerate(argv):
        if v == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if v.startswith("--threads="):
            return v.split("=", 1)[1]
    return "1"


os.environ["OPENBLAS_NUM_THREADS"] = threads_arg(sys.argv[1:])
# With two pools (OpenMP's and OpenBLAS's) on the same cores, OpenMP's
# spinning workers starve OpenBLAS's: PyTorch ran 2 to 4 times slower on 2
# threads than on 1 here until its idle workers were told to sleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import numpy as np  # noqa: E402 (after OPENBLAS_NUM_THREADS)
import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F


def load(d):
    with gzip.open(f"{d}/train-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(f"{d}/train-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(y.astype(np.int64))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--step-every", type=int, default=1)
    p.add_argument("--precision", default="fp32",
                   choices=("fp32", "tf32", "bf16", "fp16"))
    a = p.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda":
        # --precision fp32: plain fp32 (no TF32 on the tensor cores), as
        # beed's CUDA backend computes by default; tf32: both allowed, as
        # beed's --precision tf32; bf16: fp32 tensors whose matrix
        # products may take bf16 inputs ("medium"), convolutions on TF32,
        # as beed's --precision bf16; fp16: automatic mixed precision
        # (autocast to float16, GradScaler), PyTorch's recipe for what
        # beed's --precision fp16 does (autocast also keeps activations in
        # fp16, beed keeps them fp32).  cuDNN times its algorithms
        # (benchmark), as beed's does by default.
        tf32 = a.precision != "fp32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if a.precision == "bf16":
            torch.set_float32_matmul_precision("medium")
        torch.backends.cudnn.benchmark = True
    if a.model not in ("mlp", "cnn", "resnet", "gpt"):
        p.error("--model is mlp, cnn, resnet or gpt")
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    synth = None
    ref = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "../../tests/gen-trainer-ref.py")
    if a.model in ("resnet", "gpt"):
        spec = importlib.util.spec_from_file_location("ref", ref)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    if a.model == "gpt":
        # trainer.h's default gpt: vocabulary 256, context 64, 4 layers of
        # 4 heads, 128 wide; random tokens, a sample a window of 64.
        mod.Gpt.V, mod.Gpt.CTX, mod.Gpt.L, mod.Gpt.NH, mod.Gpt.C = \
            256, 64, 4, 4, 128
        x = y = None
    elif a.data.startswith("synthetic:"):
        shape, k = a.data[10:].split(":")
        synth = tuple(int(v) for v in shape.split("x")), int(k)
        x = y = None
    else:
        x, y = load(a.data)
    if a.model == "gpt":
        model = mod.Gpt()
    elif a.model == "resnet":
        (c, h, w), k = synth if synth else ((1, 28, 28), 10)
        if x is not None:
            x = x.reshape(-1, c, h, w)
        model = mod.ResNet(a.depth, a.width, c, k)
    elif a.model == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(),
                              nn.Linear(256, 10))
    else:
        x = x.reshape(-1, 1, 28, 28)
        model = nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(3136, 1024), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(1024, 10))
    if synth and a.model != "resnet":
        p.error("--data synthetic is for resnet")
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    order = torch.randperm(len(x)) if x is not None else None
    # Synthetic data: 4 batches made on the host before the clock starts
    # and taken in turn, as bench-train does.
    pool = []
    if synth:
        (c, h, w), k = synth
        pool = [(torch.rand(a.batch, c, h, w) * 2 - 1,
                 torch.randint(0, k, (a.batch,))) for _ in range(4)]
    at = 0
    t0 = 0.0
    loss = torch.tensor(0.0)
    amp = dev.type == "cuda" and a.precision == "fp16"
    # torch.amp.GradScaler since 2.3 (torch.cuda.amp's is deprecated
    # there); Debian's 1.13 has only the older one.
    scaler = (torch.amp.GradScaler("cuda", enabled=amp)
              if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")
              else torch.cuda.amp.GradScaler(enabled=amp))
    for s in range(-a.warmup, a.steps):
        if s == 0:
            t0 = time.perf_counter()
            c0 = time.process_time()
        if a.model == "gpt":
            xb = torch.randint(0, 256, (a.batch, 64))
            yb = torch.randint(0, 256, (a.batch * 64,))
        elif synth:
            xb, yb = pool[(s + a.warmup) % len(pool)]
        else:
            if at + a.batch > len(x):
                order = torch.randperm(len(x))
                at = 0
            idx = order[at:at + a.batch]
            at += a.batch
            xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        # The batch is made on the host and sent, as beed's bench does.
        xb, yb = xb.to(dev), yb.to(dev)
        with (torch.autocast(device_type="cuda", dtype=torch.float16)
              if amp else contextlib.nullcontext()):
            loss = F.cross_entropy(model(xb), yb)
        scaler.scale(loss).backward()
        if (s + a.warmup + 1) % a.step_every == 0:
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    cores = (time.process_time() - c0) / dt
    print(f"RESULT impl=torch device={dev.type} precision={a.precision} "
          f"step_every={a.step_every} "
          f"model={a.model} batch={a.batch} "
          f"threads={a.threads} steps={a.steps} "
          f"samples_per_s={a.steps * a.batch / dt:.1f} loss={loss.item():.4f} "
          f"cores={cores:.2f}",
          flush=True)


if __name__ == "__main__":
    main()
