#!/usr/bin/python3
"""gen-trainer-ref.py: PyTorch reference values for tests/test-trainer-torch.c.

Run with Debian's python3-torch (a test-time tool, never a runtime
dependency of beed):

    /usr/bin/python3 tests/gen-trainer-ref.py tests/data

Two small models as trainer/model.c builds them, with PyTorch's own
initial weights: an mlp 64-32-16-10 (torch.nn.Linear layers with ReLU
between them; trainer-mlp.ref) and a cnn on 1x12x12 inputs (conv 5x5
padding 2 to 4 channels, ReLU, max-pool 2, conv 5x5 to 6, ReLU, max-pool
2, dense 16, ReLU, dense 10; trainer-cnn.ref), and the same with batch
norm after each convolution, whose bias it makes useless and which has
none (trainer-cnnbn.ref: also the running
statistics after the Nesterov steps and the logits in eval mode then).
For each, batches of
random inputs and labels, and what PyTorch computes from them: the
logits, the mean cross-entropy, its gradients, and the parameters after 3
steps (one batch each) of SGD with Nesterov momentum and weight decay, of
SGD with momentum and dampening, of AdamW, of LAMB (written below from
the paper, trust ratio per tensor, as trainer/optim.c does it), and of
SGD after clip_grad_norm_ to 0.05.  The files are small
(about 70 and 40 KB) and checked in, so the suite needs no PyTorch.

Format: "BEEREF1\\n", then records: u32 name length, the name, u32 count,
count little-endian float32 values.  Parameters are flat in trainer.h's
layout: per layer W (out, in) row-major, then b.
"""
import copy
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 3


def mlp():
    sizes = [64, 32, 16, 10]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 4, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(6 * 3 * 3, 16), nn.ReLU(), nn.Linear(16, 10))


def cnnbn():
    return nn.Sequential(
        nn.Conv2d(1, 4, 5, padding=2, bias=False), nn.BatchNorm2d(4),
        nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 5, padding=2, bias=False), nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(6 * 3 * 3, 16), nn.ReLU(), nn.Linear(16, 10))


def flat(model, grads=False):
    out = []
    for mod in model:
        if isinstance(mod, (nn.Linear, nn.Conv2d, nn.BatchNorm2d)):
            for p in (mod.weight, mod.bias):
                if p is not None:  # convolutions before a batch norm
                    out.append((p.grad if grads else p).detach().reshape(-1))
    return torch.cat(out)


def buffers(model):
    out = [torch.zeros(0)]
    for mod in model:
        if isinstance(mod, nn.BatchNorm2d):
            out += [mod.running_mean.reshape(-1), mod.running_var.reshape(-1)]
    return torch.cat(out)


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, algorithm 2) with bias correction: Adam's
    moments, u = m_hat / (sqrt(v_hat) + eps) + wd p, and p -= lr r u with
    r = |p| / |u| per tensor (1 when either norm is 0)."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps,
                                      weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for grp in self.param_groups:
            b1, b2 = grp["betas"]
            for p in grp["params"]:
                st = self.state[p]
                if not st:
                    st["t"] = 0
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                st["t"] += 1
                m, v, g = st["m"], st["v"], p.grad
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1 = torch.tensor(1 - b1 ** st["t"], dtype=torch.float32)
                bc2 = torch.tensor(1 - b2 ** st["t"], dtype=torch.float32)
                u = (m / bc1) / ((v / bc2).sqrt() + grp["eps"])
                u = u + grp["weight_decay"] * p
                pn = p.double().norm()
                un = u.double().norm()
                r = (pn / un).float() if pn > 0 and un > 0 else 1.0
                p.sub_(grp["lr"] * r * u)


def after(build, model0, make_opt, xs, ys, clip=0, out=None):
    model = build()
    model.load_state_dict(model0.state_dict())
    opt = make_opt(model.parameters())
    for k in range(STEPS):
        opt.zero_grad()
        F.cross_entropy(model(xs[k]), ys[k]).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    if out is not None:  # the running statistics, and the model in eval
        out["buffers"] = buffers(model)
        model.eval()
        out["eval_logits"] = model(xs[0]).detach().reshape(-1)
    return flat(model)


def write(path, build, B, shape):
    model = build()
    xs = torch.randn(STEPS, B, *shape)
    ys = torch.randint(0, 10, (STEPS, B))
    fresh = copy.deepcopy(model)  # before any forward in train mode
    logits = model(xs[0])
    loss = F.cross_entropy(logits, ys[0])
    loss.backward()
    model.load_state_dict(fresh.state_dict())  # running stats as they were
    extra = {}
    recs = [
        ("params", flat(model)),
        ("x", xs.reshape(-1)),
        ("y", ys.reshape(-1).float()),
        ("logits", logits.detach().reshape(-1)),
        ("loss", loss.detach().reshape(1)),
        ("grads", flat(model, grads=True)),
        ("sgd_nesterov", after(build, model, lambda p: torch.optim.SGD(
            p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4),
            xs, ys, out=extra)),
        ("sgd_dampening", after(build, model, lambda p: torch.optim.SGD(
            p, lr=0.1, momentum=0.8, dampening=0.25), xs, ys)),
        ("adamw", after(build, model, lambda p: torch.optim.AdamW(
            p, lr=3e-3, betas=(0.9, 0.99), eps=1e-7, weight_decay=0.05),
            xs, ys)),
        ("lamb", after(build, model, lambda p: Lamb(
            p, lr=0.02, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01),
            xs, ys)),
        ("sgd_clipped", after(build, model, lambda p: torch.optim.SGD(
            p, lr=0.1, momentum=0.9), xs, ys, clip=0.05)),
    ]
    if extra["buffers"].numel():
        recs += [("sgd_nesterov_buffers", extra["buffers"]),
                 ("sgd_nesterov_eval_logits", extra["eval_logits"])]
    with open(path, "wb") as f:
        f.write(b"BEEREF1\n")
        for name, t in recs:
            v = t.to(torch.float32).contiguous().numpy()
            f.write(struct.pack("<I", len(name)) + name.encode())
            f.write(struct.pack("<I", v.size) + v.astype("<f4").tobytes())
    print(f"{path}: torch {torch.__version__}, "
          f"{sum(t.numel() for _, t in recs)} values")


def main():
    torch.manual_seed(20261125)
    torch.set_num_threads(1)
    write(f"{sys.argv[1]}/trainer-mlp.ref", mlp, 16, (64,))
    write(f"{sys.argv[1]}/trainer-cnn.ref", cnn, 8, (1, 12, 12))
    write(f"{sys.argv[1]}/trainer-cnnbn.ref", cnnbn, 8, (1, 12, 12))


if __name__ == "__main__":
    main()
