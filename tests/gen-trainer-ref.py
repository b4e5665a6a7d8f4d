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
statistics after the Nesterov steps and the logits in eval mode then),
and a gpt of 2 layers, 2 heads, 16 channels, a vocabulary of 37 and a
context of 8 on 3 sequences of 6 tokens (trainer-gpt.ref; its weights
random rather than GPT-2's small initial ones, so that every path
carries a gradient worth comparing), and two resnets: a CIFAR-style one of
depth 8 and width 2 on 3x8x8 (trainer-resnet8.ref) and ResNet-18's shape
at width 2 on 3x48x48 (trainer-resnet18.ref: its last stage 2x2, so
that no batch norm averages just 2 values, whose gradient is 0 and the
computed one noise; and width 2, so that no 1x1 shortcut convolution has
a single input channel, whose weights a batch norm makes irrelevant),
with their batch norms
running statistics and logits in eval mode.
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


class Gpt(nn.Module):
    """The gpt of trainer/gpt.c, its parameters in the same order: token
    and position embeddings, per-layer tensors stacked, the final layer
    norm; pre-norm blocks, GELU (tanh), the head tied to the embedding."""

    V, CTX, L, NH, C = 37, 8, 2, 2, 16

    def __init__(self):
        super().__init__()
        V, CTX, L, C = self.V, self.CTX, self.L, self.C
        r = lambda *s: nn.Parameter(torch.randn(*s) * 0.2)
        one = lambda *s: nn.Parameter(1 + torch.randn(*s) * 0.1)
        self.wte, self.wpe = r(V, C), r(CTX, C)
        self.ln1w, self.ln1b = one(L, C), r(L, C)
        self.qkvw, self.qkvb = r(L, 3 * C, C), r(L, 3 * C)
        self.projw, self.projb = r(L, C, C), r(L, C)
        self.ln2w, self.ln2b = one(L, C), r(L, C)
        self.fcw, self.fcb = r(L, 4 * C, C), r(L, 4 * C)
        self.fcpw, self.fcpb = r(L, C, 4 * C), r(L, C)
        self.lnfw, self.lnfb = one(C), r(C)

    def forward(self, idx):
        B, T = idx.shape
        C, NH, hs = self.C, self.NH, self.C // self.NH
        x = self.wte[idx] + self.wpe[:T]
        mask = torch.ones(T, T, device=idx.device).tril().bool()
        for l in range(self.L):
            h = F.layer_norm(x, (C,), self.ln1w[l], self.ln1b[l], 1e-5)
            q, k, v = (h @ self.qkvw[l].T + self.qkvb[l]).split(C, dim=2)
            q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / hs ** 0.5
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ self.projw[l].T + self.projb[l]
            h = F.layer_norm(x, (C,), self.ln2w[l], self.ln2b[l], 1e-5)
            h = F.gelu(h @ self.fcw[l].T + self.fcb[l], approximate="tanh")
            x = x + h @ self.fcpw[l].T + self.fcpb[l]
        x = F.layer_norm(x, (C,), self.lnfw, self.lnfb, 1e-5)
        return (x @ self.wte.T).reshape(B * T, self.V)


class Block(nn.Module):
    """A basic block as trainer/resnet.c builds it, modules in its order."""

    def __init__(self, c, oc, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c, oc, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(oc)
        self.conv2 = nn.Conv2d(oc, oc, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(oc)
        self.short = None
        if stride != 1 or c != oc:
            self.short = nn.Sequential(nn.Conv2d(c, oc, 1, stride, bias=False),
                                       nn.BatchNorm2d(oc))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.short(x) if self.short else x))


class ResNet(nn.Module):
    """trainer/resnet.c's resnet: depth 18 (ImageNet's) or 6n + 2."""

    def __init__(self, depth, width, in_c, classes):
        super().__init__()
        layers = []
        if depth == 18:
            layers += [nn.Conv2d(in_c, width, 7, 2, 3, bias=False),
                       nn.BatchNorm2d(width), nn.ReLU(),
                       nn.MaxPool2d(3, 2, 1)]
            c = width
            for s in range(4):
                for b in range(2):
                    layers.append(Block(c, width << s, 2 if s and not b else 1))
                    c = width << s
        else:
            layers += [nn.Conv2d(in_c, width, 3, 1, 1, bias=False),
                       nn.BatchNorm2d(width), nn.ReLU()]
            c = width
            for s in range(3):
                for b in range((depth - 2) // 6):
                    layers.append(Block(c, width << s, 2 if s and not b else 1))
                    c = width << s
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def resnet8():
    return ResNet(8, 2, 3, 10)


def resnet18():
    return ResNet(18, 2, 3, 10)


def flat(model, grads=False):
    if isinstance(model, (Gpt, ResNet)):
        return torch.cat([(p.grad if grads else p).detach().reshape(-1)
                          for p in model.parameters()])
    out = []
    for mod in model:
        if isinstance(mod, (nn.Linear, nn.Conv2d, nn.BatchNorm2d)):
            for p in (mod.weight, mod.bias):
                if p is not None:  # convolutions before a batch norm
                    out.append((p.grad if grads else p).detach().reshape(-1))
    return torch.cat(out)


def buffers(model):
    out = [torch.zeros(0)]
    for mod in model.modules():
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
        F.cross_entropy(model(xs[k]), ys[k].reshape(-1)).backward()
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
    if build is Gpt:  # tokens, and the next tokens as targets
        xs = torch.randint(0, Gpt.V, (STEPS, B, *shape))
        ys = torch.randint(0, Gpt.V, (STEPS, B, *shape))
    else:
        xs = torch.randn(STEPS, B, *shape)
        ys = torch.randint(0, 10, (STEPS, B))
    fresh = copy.deepcopy(model)  # before any forward in train mode
    logits = model(xs[0])
    loss = F.cross_entropy(logits, ys[0].reshape(-1))
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
    write(f"{sys.argv[1]}/trainer-gpt.ref", Gpt, 3, (6,))
    write(f"{sys.argv[1]}/trainer-resnet8.ref", resnet8, 4, (3, 8, 8))
    write(f"{sys.argv[1]}/trainer-resnet18.ref", resnet18, 2, (3, 48, 48))


if __name__ == "__main__":
    main()
