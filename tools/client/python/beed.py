"""beed: a PyTorch model trained in a beed swarm.

The bee's daemon runs with ``--model external --trainer-socket PATH``;
this module, over ``libbeed-client.so`` (tools/client, through ctypes:
nothing to compile), gives its tensors to beed in shared memory and takes
turns with it (docs/PROTOCOL.md, section 13)::

    import torch, beed
    model = MyNet()
    opt = beed.Optimizer(model.named_parameters(), torch.optim.AdamW,
                         lr=1e-3, run_id="lab", target_batch_size=32768,
                         batch_size_per_step=64, model=model)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss)   # the swarm's step when the target is in
        opt.zero_grad()       # leaves the shared gradients to beed

The parameters, their gradients, the optimizer's state and the model's
float32 buffers become views of the shared memory: beed averages the
gradients in place, and the optimizer steps with the swarm's mean, the
same step on every bee.  See tools/client/README.md for the rules.
"""

import ctypes
import ctypes.util
import math
import os

import torch

__all__ = ["Optimizer", "DiLoCo", "BeedError"]

_GRADIENTS, _DILOCO = 0, 1
_PARAM, _STATE, _BUFFER = 0, 1, 2
_WELCOME, _GO, _STEP, _LOADED = 81, 83, 84, 86


class BeedError(RuntimeError):
    """beed refused, went away, or did not answer in time."""


class _Answer(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("epoch", ctypes.c_uint64),
                ("loaded", ctypes.c_int), ("apply", ctypes.c_int),
                ("mode", ctypes.c_int), ("target", ctypes.c_uint64),
                ("samples", ctypes.c_uint64), ("peers", ctypes.c_uint64),
                ("inner_steps", ctypes.c_uint64),
                ("outer_lr", ctypes.c_double),
                ("outer_momentum", ctypes.c_double),
                ("delayed", ctypes.c_int),
                ("compression", ctypes.c_char * 16)]


_LIB = None


def _lib():
    """libbeed-client.so: $BEED_CLIENT_LIB, else where the system finds it."""
    global _LIB
    if _LIB is not None:
        return _LIB
    path = os.environ.get("BEED_CLIENT_LIB") or ctypes.util.find_library(
        "beed-client")
    if not path:
        for d in ("/usr/local/lib", "/usr/local/lib/x86_64-linux-gnu",
                  "/usr/lib/x86_64-linux-gnu"):
            if os.path.exists(os.path.join(d, "libbeed-client.so")):
                path = os.path.join(d, "libbeed-client.so")
                break
    if not path:
        raise BeedError("libbeed-client.so not found: install beed (meson "
                        "install) or set BEED_CLIENT_LIB to its path")
    lib = ctypes.CDLL(path)
    p, u64, i, c = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p
    ans = ctypes.POINTER(_Answer)
    lib.beed_client_new.argtypes = [ctypes.c_size_t, ctypes.POINTER(c),
                                    ctypes.POINTER(i),
                                    ctypes.POINTER(ctypes.c_uint),
                                    ctypes.POINTER(u64),
                                    ctypes.POINTER(p), c, ctypes.c_size_t]
    lib.beed_client_new.restype = i
    for f in (lib.beed_client_data, lib.beed_client_grad):
        f.argtypes, f.restype = [p, ctypes.c_size_t], p
    lib.beed_client_hello.argtypes = [p, c, c, i, u64, ctypes.c_uint, ans]
    lib.beed_client_hello.restype = i
    lib.beed_client_batch.argtypes = [p, u64, ctypes.c_double, ans]
    lib.beed_client_batch.restype = i
    lib.beed_client_stepped.argtypes = [p, u64, ans]
    lib.beed_client_stepped.restype = i
    lib.beed_client_eval.argtypes = [p, u64, ctypes.c_double, ctypes.c_double]
    lib.beed_client_eval.restype = i
    lib.beed_client_error.argtypes, lib.beed_client_error.restype = [p], c
    lib.beed_client_close.argtypes, lib.beed_client_close.restype = [p], None
    _LIB = lib
    return lib


def _view(addr, shape):
    """A float32 tensor of shape over the shared memory at addr."""
    n = math.prod(shape) if len(shape) else 1
    arr = (ctypes.c_float * n).from_address(addr)
    return torch.frombuffer(arr, dtype=torch.float32).view(shape)


def _check(t, what):
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise BeedError(f"{what} is {t.dtype} on {t.device}: beed shares "
                        "float32 tensors in the host's memory")


class _Trainer:
    """What Optimizer and DiLoCo share: the tensors in the shared memory,
    the session with beed, and the answers."""

    _MODE = _GRADIENTS

    def __init__(self, params, optimizer, *, run_id, batch_size_per_step,
                 target_batch_size=None, model=None, scheduler=None,
                 delay_averaging=None, compression=None, socket=None,
                 timeout=600.0, **kwargs):
        self._lib = _lib()
        self._client = None
        self.grad_copies = 0  # gradients added back (_grads_home)
        self.batch_size_per_step = int(batch_size_per_step)
        named, groups = self._params(params)
        self.opt = (optimizer(groups, **kwargs) if not isinstance(
            optimizer, torch.optim.Optimizer) else optimizer)
        self.scheduler = scheduler(self.opt) if scheduler else None
        self._init_state(named)
        tensors = [(n, _PARAM, p) for n, p in named]
        self._state = []  # (param, key) in the memory's order
        for i, (_, p) in enumerate(named):
            for key in sorted(self.opt.state[p]):
                v = self.opt.state[p][key]
                if not torch.is_tensor(v):
                    raise BeedError(f"the optimizer's state '{key}' is a "
                                    f"{type(v).__name__}: beed shares tensors")
                _check(v, f"the optimizer's state '{key}'")
                tensors.append((f"state.{i}.{key}", _STATE, v))
                self._state.append((p, key))
        self._buffers = []
        if model is not None:
            for n, b in model.named_buffers():
                if b.dtype == torch.float32 and b.device.type == "cpu":
                    tensors.append((n, _BUFFER, b))
                    self._buffers.append(b)
        self._open(tensors)
        self._hello(run_id, self._MODE, socket, timeout, target_batch_size)
        if (delay_averaging is not None
                and bool(delay_averaging) != bool(self._welcome.delayed)):
            self.close()
            have = "runs" if self._welcome.delayed else "does not run"
            raise BeedError(f"delay_averaging={bool(delay_averaging)}, but "
                            f"beed {have} with --delay-averaging")
        # Each epoch's step comes during the next epoch's batches, whose
        # gradients beed keeps aside through it.
        self.delay_averaging = bool(self._welcome.delayed)
        self.compression = self._welcome.compression.decode()
        if compression is not None and compression != self.compression:
            self.close()
            raise BeedError(f"compression={compression!r}, but beed's "
                            f"rounds use {self.compression!r} "
                            "(--compression)")


    # ---- set-up -----------------------------------------------------------

    def _params(self, params):
        """(name, param) pairs, and the groups for the torch optimizer."""
        params = list(params)
        if params and isinstance(params[0], dict):
            groups, flat = params, [p for g in params for p in g["params"]]
            named = [(f"param.{i}", p) for i, p in enumerate(flat)]
        elif params and isinstance(params[0], tuple):
            named = [(n, p) for n, p in params if p.requires_grad]
            groups = [p for _, p in named]
        else:
            named = [(f"param.{i}", p) for i, p in enumerate(params)]
            groups = [p for _, p in named]
        if not named:
            raise BeedError("no parameters to train")
        for n, p in named:
            _check(p, f"parameter {n}")
        return named, groups

    def _init_state(self, named):
        """The optimizer's state made now, by a step of rate 0 with zero
        gradients (no parameter moves), its counts set back to 0, so that
        it can live in the shared memory from the start."""
        saved = [(g, g["lr"]) for g in self.opt.param_groups]
        with torch.no_grad():
            for _, p in named:
                p.grad = torch.zeros_like(p)
            for g in self.opt.param_groups:
                g["lr"] = 0.0
            before = [p.detach().clone() for _, p in named]
            self.opt.step()
            for g, lr in saved:
                g["lr"] = lr
            for (n, p), b in zip(named, before):
                if not torch.equal(p, b):
                    raise BeedError(f"the optimizer moved {n} at rate 0: "
                                    "beed cannot lay out its state")
                p.grad = None
            for st in self.opt.state.values():
                for k, v in st.items():
                    if k == "step" and torch.is_tensor(v):
                        v.zero_()
                    elif k == "step":
                        st[k] = torch.zeros(())
        self._named = named

    def _open(self, tensors):
        n = len(tensors)
        names = (ctypes.c_char_p * n)(*[t[0].encode() for t in tensors])
        roles = (ctypes.c_int * n)(*[t[1] for t in tensors])
        ndims = (ctypes.c_uint * n)(*[t[2].dim() for t in tensors])
        flat = [d for t in tensors for d in t[2].shape]
        dims = (ctypes.c_uint64 * max(len(flat), 1))(*flat)
        handle, err = ctypes.c_void_p(), ctypes.create_string_buffer(512)
        rc = self._lib.beed_client_new(n, names, roles, ndims, dims,
                                       ctypes.byref(handle), err, len(err))
        if rc:
            raise BeedError(err.value.decode(errors="replace"))
        self._client = handle
        lib = self._lib
        with torch.no_grad():
            self._grads = []
            for i, (_, role, t) in enumerate(tensors):
                v = _view(lib.beed_client_data(handle, i), tuple(t.shape))
                v.copy_(t)
                if role == _PARAM:
                    t.data = v
                    g = _view(lib.beed_client_grad(handle, i), tuple(t.shape))
                    t.grad = g
                    self._grads.append(g)
                elif role == _STATE:
                    p, key = self._state[i - len(self._named)]
                    self.opt.state[p][key] = v
                else:
                    t.data = v

    def _error(self):
        return self._lib.beed_client_error(self._client).decode(
            errors="replace")

    def _hello(self, run_id, mode, socket, timeout, target):
        socket = (socket or os.environ.get("BEED_TRAINER_SOCKET")
                  or f"/run/beed/{run_id}.trainer")
        a = _Answer()
        rc = self._lib.beed_client_hello(
            self._client, socket.encode(), run_id.encode(), mode,
            self.batch_size_per_step, int(timeout * 1000), ctypes.byref(a))
        if rc:
            err = self._error()
            self.close()
            raise BeedError(err)
        if mode == _GRADIENTS and target is not None and a.target != target:
            self.close()
            raise BeedError(f"target_batch_size={target}, but beed's run "
                            f"'{run_id}' gathers {a.target} samples an epoch "
                            "(--target-batch-size)")
        self.target_batch_size = a.target
        self.loaded = bool(a.loaded)
        self._welcome = a
        self._answered(a)

    # ---- training ---------------------------------------------------------

    def _answered(self, a):
        self.epoch = a.epoch  # the swarm's epoch this trainer is at
        if a.type in (_WELCOME, _GO):
            self.peers = a.peers
        if a.type == _GO:
            self.swarm_samples = a.samples
        if a.type == _LOADED:
            self.loaded = True

    def _grads_home(self):
        """The gradients back in the shared memory where something (a
        model.zero_grad(set_to_none=True)) put others in their place."""
        with torch.no_grad():
            for (_, p), g in zip(self._named, self._grads):
                if p.grad is None:
                    p.grad = g
                elif p.grad.data_ptr() != g.data_ptr():
                    g.add_(p.grad)
                    p.grad = g
                    self.grad_copies += 1

    @staticmethod
    def _closure(closure, loss):
        if closure is None:
            return loss
        with torch.enable_grad():
            return closure()

    def _batch(self, batch_size, loss):
        """The batch to beed; its STEPs taken; the answer kept."""
        value = float(loss) if loss is not None else float("nan")
        a = _Answer()
        n = int(batch_size or self.batch_size_per_step)
        if self._lib.beed_client_batch(self._client, n, value,
                                       ctypes.byref(a)):
            raise BeedError(self._error())
        while a.type == _STEP:
            if a.apply:
                self.opt.step()
                if self.scheduler is not None:
                    self.scheduler.step()
            if self._lib.beed_client_stepped(self._client, a.epoch,
                                             ctypes.byref(a)):
                raise BeedError(self._error())
        self._answered(a)
        return loss

    def load_state_from_peers(self):
        """beed loads the swarm's state into the shared memory by itself
        whenever this bee is behind (when it starts, and later): whether
        it has done so (the parameters are then the swarm's)."""
        return self.loaded

    def report_test(self, loss, accuracy):
        """A test result (accuracy 0..1), for beed's log."""
        if self._lib.beed_client_eval(self._client, self.epoch, float(loss),
                                      float(accuracy)):
            raise BeedError(self._error())

    def state_dict(self):
        return {"epoch": self.epoch, "optimizer": self.opt.state_dict()}

    def load_state_dict(self, sd):
        """The optimizer's state from sd, into the shared memory."""
        views = {(id(p), k): self.opt.state[p][k] for p, k in self._state}
        self.opt.load_state_dict(sd["optimizer"])
        with torch.no_grad():
            for p, k in self._state:
                v = views[(id(p), k)]
                v.copy_(self.opt.state[p][k])
                self.opt.state[p][k] = v

    @property
    def param_groups(self):
        return self.opt.param_groups

    def close(self):
        """Says goodbye to beed; the model keeps its tensors (copies)."""
        if self._client is None:
            return
        with torch.no_grad():
            for _, p in getattr(self, "_named", []):
                p.data = p.data.clone()
                p.grad = None if p.grad is None else p.grad.clone()
            for p, k in getattr(self, "_state", []):
                self.opt.state[p][k] = self.opt.state[p][k].clone()
            for b in getattr(self, "_buffers", []):
                b.data = b.data.clone()
        self._lib.beed_client_close(self._client)
        self._client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Optimizer(_Trainer):
    """An optimizer whose steps are the swarm's (gradient averaging).

    params: tensors, (name, tensor) pairs (``model.named_parameters()``)
    or parameter groups, as torch optimizers take them.
    optimizer: a torch optimizer class (made here with params and
    ``**kwargs``), or a function of the params that makes one.
    run_id, target_batch_size, batch_size_per_step: as hivemind's; the
    run and its target are beed's (--run-id, --target-batch-size), and
    a target given here must be that one.
    model: its float32 buffers (batch norm's statistics) go with the
    state that peers download.
    scheduler: a function of the optimizer that makes a learning-rate
    scheduler, stepped once per epoch of the swarm.
    delay_averaging: beed's --delay-averaging (the round of an epoch
    runs while the next one's batches are computed, and its step comes
    during them); given here, it must be beed's.
    compression: the rounds' codec by name ("none", "fp16", "bf16",
    "u8", "b8"), beed's --compression; given here, it must be beed's.
    socket: beed's --trainer-socket (default $BEED_TRAINER_SOCKET, else
    /run/beed/RUN.trainer); timeout: seconds any wait for beed may take.
    """

    def step(self, closure=None, batch_size=None, loss=None):
        """One local step: the batch's gradients (added in by backward) go
        to the swarm's count; when the target is in, the round averages
        them and the optimizer steps with the mean.  loss (or the
        closure's): the batch's mean, for beed's lines."""
        loss = self._closure(closure, loss)
        self._grads_home()
        return self._batch(batch_size, loss)

    def zero_grad(self, set_to_none=False):
        """Nothing: the gradients add up in the shared memory until the
        swarm's step, and beed clears them then."""


class DiLoCo(_Trainer):
    """DiLoCo: the inner optimizer steps every batch on this trainer's
    own, and every inner_steps steps the swarm averages the change since
    the last round and beed takes the outer step (Nesterov SGD) on the
    parameters in the shared memory.

    model_or_params: a module (its named parameters and buffers) or
    parameters as Optimizer takes them; inner_optimizer: a torch
    optimizer class (with **kwargs) or a function of the params.
    inner_steps, outer_lr, outer_momentum: beed's (--inner-steps,
    --outer-lr, --outer-momentum); given here, they must be those.
    The rest as Optimizer's.
    """

    _MODE = _DILOCO

    def __init__(self, model_or_params, inner_optimizer, *, run_id,
                 batch_size_per_step, inner_steps=None, outer_lr=None,
                 outer_momentum=None, **kwargs):
        if isinstance(model_or_params, torch.nn.Module):
            kwargs.setdefault("model", model_or_params)
            model_or_params = model_or_params.named_parameters()
        super().__init__(model_or_params, inner_optimizer, run_id=run_id,
                         batch_size_per_step=batch_size_per_step, **kwargs)
        w = self._welcome
        for name, want, have, flag in (
                ("inner_steps", inner_steps, w.inner_steps, "--inner-steps"),
                ("outer_lr", outer_lr, w.outer_lr, "--outer-lr"),
                ("outer_momentum", outer_momentum, w.outer_momentum,
                 "--outer-momentum")):
            if want is not None and not math.isclose(want, have,
                                                     rel_tol=1e-9):
                self.close()
                raise BeedError(f"{name}={want}, but beed's run has {have} "
                                f"({flag})")
        self.inner_steps = w.inner_steps
        self.outer_lr = w.outer_lr
        self.outer_momentum = w.outer_momentum

    def step(self, closure=None, batch_size=None, loss=None):
        """One inner step with the batch's gradients; then the batch goes
        to beed, which takes the outer step when the round is due."""
        loss = self._closure(closure, loss)
        self._grads_home()
        self.opt.step()
        with torch.no_grad():
            for g in self._grads:
                g.zero_()
        return self._batch(batch_size, loss)

    def zero_grad(self, set_to_none=False):
        """The gradients in the shared memory, zeroed in place."""
        with torch.no_grad():
            for g in self._grads:
                g.zero_()
