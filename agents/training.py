"""Local training and evaluation on a client's own data, with FLOPs and memory measured.

FLOPs come from :class:`torch.utils.flop_counter.FlopCounterMode` (matmuls and
convolutions, forward and backward), plus the optimiser's element-wise update of every
parameter it steps, which the counter does not see (:func:`optimizer_step_flops`: 2 per
parameter for plain SGD, 4 with momentum, 13 for Adam, +2 with weight decay). A step's
FLOPs depend only on tensor shapes, so the first real step of each batch size is run
under the counter and its count is reused for later steps of that size
(:class:`StepCosts`): counting every step would slow training several-fold for the same
number.

The memory a training step needs is measured on that same first step: parameters,
gradients, optimiser state, the input batch and every tensor autograd saves for the
backward pass (via ``torch.autograd.graph.saved_tensors_hooks``). It is compared with
a device's RAM by the run loop.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from mecsim.agents.models import build_model

LossTerm = Callable[[nn.Module], torch.Tensor]


@dataclass(frozen=True)
class StepCost:
    flops: float  # forward + backward FLOPs of one step, and the optimiser's update
    memory_bytes: int  # params + grads + optimiser state + batch + saved activations
    optimizer_flops: float = 0.0  # the optimiser's element-wise update (part of flops)


#: Element-wise FLOPs per stepped parameter, counted from the update equations of
#: PyTorch's documented algorithms (torch.optim.SGD, torch.optim.Adam) as its single-tensor
#: implementation performs them, one FLOP per add, multiply, divide or square root:
#: SGD ``p -= lr * g`` (2); momentum ``b = mu * b + g`` (+2); weight decay
#: ``g += wd * p`` (+2); dampening (+1) and Nesterov ``g += mu * b`` (+2) where set.
#: Adam: ``m.lerp_(g, 1 - b1)`` (3), ``v.mul_(b2).addcmul_(g, g, 1 - b2)`` (4),
#: ``denom = v.sqrt() / sqrt(bc2) + eps`` (3), ``p.addcdiv_(m, denom, -lr / bc1)`` (3):
#: 13, the count MTFL's FedAdam server step uses too; +2 with weight decay, +1 with AMSGrad.
SGD_FLOPS_PER_PARAM = 2
MOMENTUM_FLOPS_PER_PARAM = 2
WEIGHT_DECAY_FLOPS_PER_PARAM = 2
ADAM_FLOPS_PER_PARAM = 13


def _flops_per_param(optimizer: torch.optim.Optimizer, group: dict) -> int:
    wd = WEIGHT_DECAY_FLOPS_PER_PARAM if group.get("weight_decay", 0.0) else 0
    if isinstance(optimizer, torch.optim.Adam):
        return ADAM_FLOPS_PER_PARAM + wd + (1 if group.get("amsgrad") else 0)
    if isinstance(optimizer, torch.optim.SGD):
        n = SGD_FLOPS_PER_PARAM + wd
        if group.get("momentum", 0.0):
            n += MOMENTUM_FLOPS_PER_PARAM + (1 if group.get("dampening", 0.0) else 0)
            n += 2 if group.get("nesterov") else 0
        return n
    raise ValueError(
        f"no per-parameter FLOP count for optimiser {type(optimizer).__name__}; "
        "known: SGD, Adam (mecsim.agents.training.optimizer_step_flops)"
    )


def optimizer_step_flops(optimizer: torch.optim.Optimizer) -> float:
    """FLOPs of one ``optimizer.step()`` over the parameters that have a gradient (the
    ones it updates): their element count times the per-parameter count above."""
    total = 0
    for group in optimizer.param_groups:
        per = _flops_per_param(optimizer, group)
        total += per * sum(p.numel() for p in group["params"] if p.grad is not None)
    return float(total)


class StepCosts:
    """A host's cache of measured step costs: one :class:`StepCost` per (batch size,
    key). The first step of each pair is measured and later ones reuse its cost.

    The key must tell apart every pair of steps whose cost differs at one batch size.
    :func:`train_epochs` (and so ``local_sgd``) keys on its ``cost_key`` *and* the
    step's :func:`work_signature` (the model's parameters with their shapes and which
    require grad, the input's shape and dtype, the optimiser's per-parameter update, an
    extra loss term or not), so freezing layers, another model or another optimiser
    never reuses a cost measured for different work. A custom loop that calls
    :meth:`get` / :meth:`put` itself passes a key naming everything that decides its
    step's cost (``work_signature(...)`` in it is the safe start).
    """

    def __init__(self) -> None:
        self._by_batch: dict[tuple[int, Hashable], StepCost] = {}

    def get(self, batch_size: int, key: Hashable = "") -> StepCost | None:
        return self._by_batch.get((batch_size, key))

    def put(self, batch_size: int, cost: StepCost, key: Hashable = "") -> None:
        self._by_batch[(batch_size, key)] = cost


def work_signature(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    x: torch.Tensor,
    extra_loss: LossTerm | None = None,
) -> tuple:
    """What decides the cost of a training step of ``model`` on batches of ``x`` beside
    the batch size: the model's class and its parameters' shapes and ``requires_grad``
    (a frozen layer computes no weight gradient, and the layers before it none for
    their input), its buffers' shapes, the input's per-sample shape and dtype, and the
    optimiser's class and, per parameter group, its per-parameter update FLOPs and how
    many elements it may step; whether an extra loss term is added. Two steps with equal
    signatures and batch sizes do the same arithmetic on tensors of the same shapes.
    Made of strings, numbers and tuples only: the cache is checkpointed with its keys."""
    opt: tuple = ()
    if optimizer is not None:
        opt = (_qualified(type(optimizer)),) + tuple(
            (
                _flops_per_param_or_none(optimizer, group),
                sum(p.numel() for p in group["params"] if p.requires_grad),
            )
            for group in optimizer.param_groups
        )
    cached = _MODEL_PARTS.get(model)
    if cached is None:  # a model's class, parameters and buffers, read once per object
        found: list[torch.Tensor] = list(model.parameters())
        cached = (
            found,
            (
                _qualified(type(model)),
                tuple((tuple(p.shape), str(p.dtype)) for p in found),
                tuple(tuple(b.shape) for b in model.buffers()),
            ),
        )
        _MODEL_PARTS[model] = cached
    params, static = cached
    return (
        *static,
        tuple(p.requires_grad for p in params),
        tuple(x.shape[1:]),
        str(x.dtype),
        opt,
        extra_loss is not None,
    )


#: Each model object's parameters and the static part of its work signature (class,
#: parameter shapes and dtypes, buffer shapes): walking ``model.parameters()`` and
#: ``buffers()`` costs tens of microseconds a call, as much as a small client's step.
#: A model whose modules are replaced after its first step is not seen as changed (no
#: mecsim model or algorithm does that; build a new model object instead).
_MODEL_PARTS: weakref.WeakKeyDictionary[nn.Module, tuple[list[torch.Tensor], tuple]] = (
    weakref.WeakKeyDictionary()
)


def _qualified(cls: type) -> str:
    """A class's module and name: the signature holds only what a checkpoint stores
    (the host's cache is checkpointed with its keys)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _flops_per_param_or_none(optimizer: torch.optim.Optimizer, group: dict) -> int | None:
    try:
        return _flops_per_param(optimizer, group)
    except ValueError:  # an optimiser with no count: measured_step raises on it
        return None


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    total = 0
    for state in optimizer.state.values():
        total += _tensor_bytes(v for v in state.values() if torch.is_tensor(v))
    return total


@dataclass(frozen=True)
class TrainStats:
    steps: int
    samples: int
    flops: float  # includes optimizer_flops
    mean_loss: float
    peak_memory_bytes: int
    optimizer_flops: float = 0.0


def make_optimizer(
    name: str, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimiser {name!r}; known: sgd, adam")


#: Each model's stateless SGD optimiser, kept from client to client (see model_optimizer).
#: With it, its parameter group's settings as built (anything changed since: built anew).
_STATELESS_SGD: weakref.WeakKeyDictionary[nn.Module, tuple[torch.optim.Optimizer, dict]] = (
    weakref.WeakKeyDictionary()
)


def model_optimizer(
    model: nn.Module, name: str, lr: float, momentum: float = 0.0, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """The optimiser for one client's training of ``model`` (all its parameters).

    SGD without momentum or weight decay keeps no state between steps (its ``state``
    stays empty), so the one made for the previous client is handed out again when it
    still holds the same parameters and learning rate: building ``torch.optim.SGD`` costs
    ~0.1 ms, as much as a one-step client's training. Anything else is built anew, as a
    fresh optimiser per client is what the algorithms mean.
    """
    if name != "sgd" or momentum or weight_decay:
        return make_optimizer(name, model.parameters(), lr, momentum, weight_decay)
    params = list(model.parameters())
    opt: torch.optim.Optimizer | None
    built: dict | None
    opt, built = _STATELESS_SGD.get(model, (None, None))
    if (
        opt is not None
        and not opt.state
        and len(opt.param_groups) == 1
        and not opt._optimizer_step_pre_hooks
        and not opt._optimizer_step_post_hooks
    ):
        group = opt.param_groups[0]
        if (
            group["lr"] == lr
            and _settings(group) == built
            and len(group["params"]) == len(params)
            and all(a is b for a, b in zip(group["params"], params, strict=True))
        ):
            return opt
    opt = make_optimizer(name, params, lr, momentum, weight_decay)
    _STATELESS_SGD[model] = (opt, _settings(opt.param_groups[0]))
    return opt


def _settings(group: dict) -> dict:
    """A parameter group's settings (all but its parameters)."""
    return {k: v for k, v in group.items() if k != "params"}


def set_mode(model: nn.Module, training: bool) -> None:
    """``model.train(training)``, called only when a module is in the other mode: a
    host's model stays in training mode from client to client, and ``train()`` sets an
    attribute on every submodule through ``nn.Module.__setattr__`` (~80 us a call on the
    2NN, as much as a small client's whole optimiser step)."""
    if any(m.training is not training for m in model.modules()):
        model.train(training)


def train_epochs(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    costs: StepCosts,
    extra_loss: LossTerm | None = None,
    cost_key: str = "",
) -> TrainStats:
    """``epochs`` passes of mini-batch training over (x, y), shuffled by ``generator``.

    ``extra_loss(model)`` is added to the cross-entropy of every step (a proximal or
    coaching term). The last batch of an epoch may be smaller; its cost is measured for
    its own size.

    ``cost_key`` names the kind of step for the cost cache ``costs`` (see
    :class:`StepCosts`): the first step of each (batch size, ``cost_key``,
    :func:`work_signature`) is measured, later ones reuse its cost. The signature
    already tells apart frozen layers, other models, inputs and optimisers; give steps a
    ``cost_key`` of their own when their cost differs for a reason it cannot see (an
    ``extra_loss`` whose arithmetic changes between calls, e.g. a term over a number of
    models that varies).
    """
    set_mode(model, training=True)
    key = (cost_key, work_signature(model, optimizer, x, extra_loss))
    plain_lr: Any = _UNSET
    n = int(y.shape[0])
    steps = 0
    flops = opt_flops = 0.0
    loss_sum = 0.0
    peak = 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            if idx.numel() < 2 and any(
                isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
            ):
                continue  # BatchNorm cannot train on a single sample
            # index_select: the same gather as x[idx], without advanced indexing's
            # general machinery (~5 us instead of ~15 us for a 2NN batch of 32)
            xb, yb = torch.index_select(x, 0, idx), torch.index_select(y, 0, idx)
            bsz = int(idx.numel())
            cost = costs.get(bsz, key)
            if cost is None:
                loss, cost = measured_step(model, optimizer, xb, yb, extra_loss)
                costs.put(bsz, cost, key)
            else:
                if plain_lr is _UNSET:  # the optimiser's kind, checked once per call
                    plain_lr = _plain_sgd_lr(optimizer)
                loss = optimizer_step(model, optimizer, xb, yb, extra_loss, plain_lr=plain_lr)
            loss_sum += loss
            steps += 1
            flops += cost.flops
            opt_flops += cost.optimizer_flops
            peak = max(peak, cost.memory_bytes)
    return TrainStats(steps, n * epochs, flops, loss_sum / max(steps, 1), peak, opt_flops)


def batch_loss(
    model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, extra_loss: LossTerm | None
) -> torch.Tensor:
    """Cross-entropy of one batch, plus the algorithm's extra term (if any)."""
    loss = nn.functional.cross_entropy(model(xb), yb)
    if extra_loss is not None:
        loss = loss + extra_loss(model)
    return loss


def _plain_sgd_lr(optimizer: torch.optim.Optimizer) -> float | None:
    """The learning rate of an optimiser whose step is exactly ``p -= lr * grad`` for
    every parameter with a gradient (``torch.optim.SGD`` with one parameter group, no
    momentum, no weight decay, not maximising, its default single-tensor implementation,
    a float learning rate, and no step hooks registered), else None."""
    if type(optimizer) is not torch.optim.SGD or len(optimizer.param_groups) != 1:
        return None
    group = optimizer.param_groups[0]
    if (
        group["momentum"]
        or group["weight_decay"]
        or group["maximize"]
        or group["foreach"]
        or group["fused"]
        or group["differentiable"]
        or not isinstance(group["lr"], float)
        or optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
    ):
        return None
    from torch.optim import optimizer as optim_module

    if optim_module._global_optimizer_pre_hooks or optim_module._global_optimizer_post_hooks:
        return None
    return group["lr"]


#: :func:`optimizer_step`'s ``plain_lr`` when the caller has not looked it up.
_UNSET: Any = object()


def optimizer_step(model, optimizer, xb, yb, extra_loss, *, plain_lr: Any = _UNSET) -> float:
    """One unmeasured training step on a batch; returns the batch loss.

    Plain SGD (see :func:`_plain_sgd_lr`) is stepped here with the update its
    single-tensor implementation performs, ``param.add_(grad, alpha=-lr)``, bit for bit
    the same, without ``Optimizer.step``'s per-call bookkeeping (profiler ranges, hook
    and state checks), which costs about a tenth of a small model's step. ``plain_lr``
    is :func:`_plain_sgd_lr` of ``optimizer`` when the caller already has it (a loop of
    steps of one optimiser checks it once).
    """
    lr = _plain_sgd_lr(optimizer) if plain_lr is _UNSET else plain_lr
    params = optimizer.param_groups[0]["params"] if lr is not None else None
    if params is None:
        optimizer.zero_grad(set_to_none=True)
    else:
        for p in params:
            p.grad = None
    loss = batch_loss(model, xb, yb, extra_loss)
    loss.backward()
    if params is None:
        optimizer.step()
    else:
        assert lr is not None  # params is None without a plain SGD learning rate
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)
    return float(loss.detach())


def measured_step(model, optimizer, xb, yb, extra_loss=None) -> tuple[float, StepCost]:
    """One training step of ``model`` on the batch (``xb``, ``yb``) under the FLOP
    counter and the memory accounting: cross-entropy (plus ``extra_loss(model)``),
    backward, ``optimizer.step()``. Returns (the batch loss, its :class:`StepCost`). A
    step of any other shape: :class:`counted_step`."""
    loss, cost = _accounted_step(model, optimizer, xb, yb, extra_loss)
    return float(loss.detach()), cost


class counted_step:  # noqa: N801 - a context manager, named for the ``with`` line
    """Count the cost of a custom training step: FLOPs, optimiser work and memory.

    ::

        with counted_step(opt_w, opt_v, inputs=(xb,), models=(w, v)) as step:
            loss_w = cross_entropy(w(xb), yb); loss_w.backward(); opt_w.step()
            ...                                  # any steps of any models in the block
        step.cost  # StepCost(flops, memory_bytes, optimizer_flops)

    Inside the block, the matmuls and convolutions of every forward and backward pass
    are counted (``FlopCounterMode``, as :func:`measured_step` counts a step of
    ``local_sgd``), and each ``step()`` of the ``optimizers`` given adds its element-wise
    update (:func:`optimizer_step_flops`, read when it steps: only parameters with a
    gradient). ``memory_bytes`` adds, as :func:`measured_step` does, the parameters of
    the optimisers and of ``models`` (each tensor once), their gradients, the models'
    buffers, the optimisers' state after the block, the ``inputs`` and every tensor
    autograd saved for a backward pass in the block. Counting slows a step several-fold:
    count the first step of each kind and batch size and cache it in ``ctx.costs``
    (:class:`StepCosts`), as ``local_sgd`` does.
    """

    def __init__(
        self,
        *optimizers: torch.optim.Optimizer,
        inputs: tuple[torch.Tensor, ...] | list[torch.Tensor] = (),
        models: tuple[nn.Module, ...] | list[nn.Module] = (),
    ) -> None:
        for opt in optimizers:
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(
                    f"counted_step takes optimisers as positional arguments, got "
                    f"{type(opt).__name__} (models go in models=...)"
                )
            for group in opt.param_groups:
                _flops_per_param(opt, group)  # an optimiser with no count: refused now
        self.optimizers = optimizers
        self.inputs = tuple(inputs)
        self.models = tuple(models)
        self.cost: StepCost | None = None
        self._saved: list[int] = []
        self._optimizer_flops = 0.0
        self._counter: FlopCounterMode | None = None
        self._hooks: list[Any] = []
        self._saved_hooks: Any = None

    def __repr__(self) -> str:
        return (
            f"counted_step({len(self.optimizers)} optimisers, {len(self.inputs)} inputs, "
            f"{len(self.models)} models, cost={self.cost})"
        )

    def _on_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self._optimizer_flops += optimizer_step_flops(optimizer)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._saved.append(t.numel() * t.element_size())
        return t

    def __enter__(self) -> counted_step:
        self._hooks = [opt.register_step_pre_hook(self._on_step) for opt in self.optimizers]
        self._counter = FlopCounterMode(display=False)
        self._counter.__enter__()
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._saved_hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._counter is not None and self._saved_hooks is not None
        self._saved_hooks.__exit__(*exc)
        self._counter.__exit__(*exc)
        for hook in self._hooks:
            hook.remove()
        params: dict[int, torch.Tensor] = {}
        for opt in self.optimizers:
            for group in opt.param_groups:
                params.update((id(p), p) for p in group["params"])
        buffers: dict[int, torch.Tensor] = {}
        for model in self.models:
            params.update((id(p), p) for p in model.parameters())
            buffers.update((id(b), b) for b in model.buffers())
        memory = (
            _tensor_bytes(params.values())
            + _tensor_bytes(p for p in params.values() if p.requires_grad)
            + _tensor_bytes(buffers.values())
            + sum(_optimizer_state_bytes(opt) for opt in self.optimizers)
            + _tensor_bytes(self.inputs)
            + sum(self._saved)
        )
        flops = float(self._counter.get_total_flops()) + self._optimizer_flops
        self.cost = StepCost(flops, int(memory), self._optimizer_flops)


def step_cost_on_meta(
    model_name: str,
    in_shape: tuple[int, ...],
    num_classes: int,
    optimizer: str,
    batch_size: int,
    lr: float = 0.01,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
) -> StepCost:
    """The cost of one training step at ``batch_size``, computed on PyTorch's ``meta``
    device: tensors there have shapes and dtypes but no storage and no arithmetic, so the
    FLOP count and the memory accounting of :func:`measured_step` come out the same (a
    test checks it) for any batch size, without allocating it. Raises what the model
    raises for an input it cannot take."""
    with torch.device("meta"):
        model = build_model(model_name, cast("tuple[int, int, int]", tuple(in_shape)), num_classes)
        x = torch.zeros((batch_size, *in_shape))
        y = torch.zeros(batch_size, dtype=torch.int64)
    opt = make_optimizer(optimizer, model.parameters(), lr, momentum, weight_decay)
    return _accounted_step(model, opt, x, y, None)[1]


def _accounted_step(model, optimizer, xb, yb, extra_loss) -> tuple[torch.Tensor, StepCost]:
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    counter = FlopCounterMode(display=False)
    optimizer.zero_grad(set_to_none=True)
    with counter:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = batch_loss(model, xb, yb, extra_loss)
        loss.backward()
    opt_flops = optimizer_step_flops(optimizer)  # after backward: the stepped parameters
    optimizer.step()
    params = list(model.parameters())
    memory = (
        _tensor_bytes(params)  # weights
        + _tensor_bytes(p for p in params if p.requires_grad)  # gradients
        + _tensor_bytes(model.buffers())
        + _optimizer_state_bytes(optimizer)
        + xb.numel() * xb.element_size()
        + sum(saved)
    )
    return loss, StepCost(float(counter.get_total_flops()) + opt_flops, int(memory), opt_flops)


@torch.no_grad()
def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 2048
) -> tuple[float, float]:
    """(accuracy in [0, 1], mean cross-entropy) of ``model`` on (x, y)."""
    n = int(y.shape[0])
    if n == 0:
        return float("nan"), float("nan")
    set_mode(model, training=False)
    correct = 0
    loss_sum = 0.0
    for start in range(0, n, chunk):
        logits = model(x[start : start + chunk])
        target = y[start : start + chunk]
        loss_sum += float(nn.functional.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(1) == target).sum())
    return correct / n, loss_sum / n
