"""The models of the source papers, selectable by name, and their "layers".

A *layer* is one parameterised module (a module with parameters or floating-point
buffers of its own): a Conv2d, a Linear, a BatchNorm. Algorithms that work layer by
layer (KAPC, BLS, DC-PFL) use :class:`ModelLayout` to address them.

Model state travels as ONE flat float32 numpy vector (parameters and floating-point
buffers such as BatchNorm running statistics, in ``state_dict`` order): aggregation is
vector arithmetic, a layer is a slice, and bytes on the air are ``4 * elements``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

import mecsim.registry as registry

BYTES_PER_ELEMENT = 4  # float32 on the air


# --------------------------------------------------------------------------- models


def mlp_2nn(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """MTFL's MNIST '2NN': FC 200, ReLU, BatchNorm, FC 200, ReLU, FC classes."""
    c, h, w = in_shape
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(c * h * w, 200),
        nn.ReLU(),
        nn.BatchNorm1d(200),
        nn.Linear(200, 200),
        nn.ReLU(),
        nn.Linear(200, num_classes),
    )


def mtfl_cnn(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """MTFL's CIFAR 'CNN': two 3x3 conv blocks (32, 64) with max-pool and BN, FC 512, FC.

    Unpadded ('valid') convolutions as in the authors' code (``models.CIFAR10Model``:
    ``Conv2d(3, 32, 3, 1)``, ``Linear(2304, 512)`` for 32 x 32 input): 1,205,066 floats
    with the BN running statistics, the size the testbed's CIFAR round times were
    measured with.
    """
    c, h, w = in_shape
    flat = 64 * (((h - 2) // 2 - 2) // 2) * (((w - 2) // 2 - 2) // 2)
    return nn.Sequential(
        nn.Conv2d(c, 32, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.BatchNorm2d(32),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.BatchNorm2d(64),
        nn.Flatten(),
        nn.Linear(flat, 512),
        nn.ReLU(),
        nn.Linear(512, num_classes),
    )


def kapc_cnn(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """KAPC's (F)MNIST CNN: two 5x5 conv layers, then FC 512, FC 128, FC classes.

    The paper gives the kernel size and the FC widths; the conv widths (32, 64) and the
    2x2 max-pools follow the common '2CNN' of the personalised-FL literature.
    """
    c, h, w = in_shape
    flat = 64 * ((((h - 4) // 2) - 4) // 2) * ((((w - 4) // 2) - 4) // 2)
    return nn.Sequential(
        nn.Conv2d(c, 32, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, 512),
        nn.ReLU(),
        nn.Linear(512, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


def phsfl_cnn(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """PHSFL's CNN: conv(64)-ReLU-maxpool | conv(128)-ReLU-maxpool-FC(256)-ReLU-FC.

    The split point is after the first max-pool (module index 2): the client part is
    modules 0-2 (conv-ReLU-maxpool), the server part starts at module index 3 (PHSFL's
    ``cut_layer: 3``). Kernel size is not given in the paper: 5x5 without padding is used;
    the first FC's input width is computed from the input shape (the paper's FC(512, 256)
    does not follow from 5x5 kernels on 32x32 CIFAR inputs, which give 3200).
    """
    c, h, w = in_shape
    flat = 128 * ((((h - 4) // 2) - 4) // 2) * ((((w - 4) // 2) - 4) // 2)
    return nn.Sequential(
        nn.Conv2d(c, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, 256),
        nn.ReLU(),
        nn.Linear(256, num_classes),
    )


class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """The CIFAR ResNet18 (3x3 stem, no stem max-pool): 11.17 M parameters, 42.65 MiB."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers: list[nn.Module] = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            for s in (stride, 1):
                layers.append(_BasicBlock(in_planes, planes, s))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.pool(self.layers(out)).flatten(1)
        return self.linear(out)


def resnet18(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    return ResNet18(in_shape[0], num_classes)


MODELS: dict[str, Callable[[tuple[int, int, int], int], nn.Module]] = {
    "mlp_2nn": mlp_2nn,
    "mtfl_cnn": mtfl_cnn,
    "kapc_cnn": kapc_cnn,
    "phsfl_cnn": phsfl_cnn,
    "resnet18": resnet18,
}


def build_model(name: str, in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """A freshly initialised model by name (initialisation draws from torch's global RNG):
    an entry of the ``mecsim.models`` entry-point group (the built-ins of :data:`MODELS`
    are declared there too), a factory ``(in_shape, num_classes) -> nn.Module``."""
    factory = registry.MODELS.get(name)  # UnknownName (a ValueError) / PluginError
    model = factory(tuple(in_shape), int(num_classes))
    if not isinstance(model, nn.Module):
        raise registry.PluginError(
            f"model plugin {name!r} returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class TensorSlot:
    """One floating-point tensor of the state_dict, placed in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int
    layer: int  # index of the parameterised module it belongs to
    is_param: bool  # False for buffers (BatchNorm running mean/var)


@dataclass(frozen=True)
class ModelLayout:
    """Where every tensor and every layer lives in the flat state vector."""

    slots: tuple[TensorSlot, ...]
    layer_names: tuple[str, ...]
    layer_kinds: tuple[str, ...]  # module class names, e.g. "Linear", "BatchNorm1d"
    size: int  # total elements

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def nbytes(self) -> int:
        return self.size * BYTES_PER_ELEMENT

    def layer_slices(self, layer: int) -> list[slice]:
        return [slice(s.offset, s.offset + s.numel) for s in self.slots if s.layer == layer]

    def layer_numel(self) -> np.ndarray:
        """Elements per layer, shape (num_layers,)."""
        counts = np.zeros(self.num_layers, dtype=np.int64)
        for s in self.slots:
            counts[s.layer] += s.numel
        return counts

    def mask(self, layers: np.ndarray | list[int] | list[bool] | None) -> np.ndarray:
        """Boolean element mask of the flat vector covering the given layers (all if None)."""
        out = np.zeros(self.size, dtype=bool)
        if layers is None:
            out[:] = True
            return out
        chosen = np.asarray(layers)
        if chosen.dtype == bool:
            chosen = np.flatnonzero(chosen)
        for layer in chosen:
            for sl in self.layer_slices(int(layer)):
                out[sl] = True
        return out

    def nbytes_of_layers(self, layers: np.ndarray | list[int] | list[bool] | None) -> int:
        """Bytes on the air when sending only these layers."""
        numel = self.layer_numel()
        if layers is None:
            return int(numel.sum()) * BYTES_PER_ELEMENT
        chosen = np.asarray(layers)
        if chosen.dtype == bool:
            chosen = np.flatnonzero(chosen)
        return int(numel[chosen.astype(np.int64)].sum()) * BYTES_PER_ELEMENT


def model_layout(model: nn.Module) -> ModelLayout:
    """Group the model's floating-point state into layers (one per parameterised module)."""
    layer_of_module: dict[str, int] = {}
    layer_names: list[str] = []
    layer_kinds: list[str] = []
    for mod_name, module in model.named_modules():
        own = [t for _, t in module.named_parameters(recurse=False)]
        own += [b for _, b in module.named_buffers(recurse=False) if b.is_floating_point()]
        if own:
            layer_of_module[mod_name] = len(layer_names)
            layer_names.append(mod_name)
            layer_kinds.append(type(module).__name__)
    param_names = {n for n, _ in model.named_parameters()}
    slots: list[TensorSlot] = []
    offset = 0
    for name, tensor in model.state_dict().items():
        if not tensor.is_floating_point():
            continue  # e.g. BatchNorm's num_batches_tracked: kept on the client, never sent
        mod_name = name.rsplit(".", 1)[0] if "." in name else ""
        numel = tensor.numel()
        slots.append(
            TensorSlot(
                name=name,
                shape=tuple(tensor.shape),
                offset=offset,
                numel=numel,
                layer=layer_of_module[mod_name],
                is_param=name in param_names,
            )
        )
        offset += numel
    return ModelLayout(tuple(slots), tuple(layer_names), tuple(layer_kinds), offset)


#: Attribute under which :func:`store_flat` keeps a model's flat storage.
_FLAT_ATTR = "_mecsim_flat_state"


def store_flat(model: nn.Module, layout: ModelLayout) -> bool:
    """Keep the model's floating-point state in one contiguous float32 tensor, laid out
    as ``layout`` (parameters and buffers become views of it), so that :func:`get_flat`
    and :func:`set_flat` are one copy instead of one per tensor (a host loads and reads
    a model for every client it trains). Values are unchanged. Returns False, changing
    nothing, for a model with a floating-point tensor that is not float32.

    The functions check that every tensor is still a view of the storage (nothing has
    re-bound a parameter since) and otherwise fall back to the tensor-by-tensor copy.
    """
    state = model.state_dict(keep_vars=True)
    if any(state[s.name].dtype != torch.float32 for s in layout.slots):
        return False
    flat = torch.empty(layout.size, dtype=torch.float32)
    bound = []
    with torch.no_grad():
        for s in layout.slots:
            mod_name, _, attr = s.name.rpartition(".")
            module = model.get_submodule(mod_name)
            view = flat[s.offset : s.offset + s.numel].view(s.shape)
            view.copy_(state[s.name])
            if s.is_param:
                getattr(module, attr).data = view
            else:
                setattr(module, attr, view)
            bound.append((module, attr, flat.data_ptr() + s.offset * flat.element_size()))
    setattr(model, _FLAT_ATTR, (flat, tuple(bound)))
    return True


def _flat_storage(model: nn.Module, layout: ModelLayout) -> torch.Tensor | None:
    """The model's flat storage, if :func:`store_flat` made one for this layout and every
    tensor is still bound to it."""
    stored = model.__dict__.get(_FLAT_ATTR)
    if stored is None:
        return None
    flat, bound = stored
    if flat.numel() != layout.size or len(bound) != len(layout.slots):
        return None
    for module, attr, ptr in bound:
        if getattr(module, attr).data_ptr() != ptr:
            return None
    return flat


def get_flat(model: nn.Module, layout: ModelLayout, out: np.ndarray | None = None) -> np.ndarray:
    """The model's floating-point state as one float32 vector (a copy): in ``out`` (a
    float32 array of ``layout.size``, returned) when given, else a new array."""
    if out is not None and (out.shape != (layout.size,) or out.dtype != np.float32):
        raise ValueError(
            f"out has shape {out.shape} and dtype {out.dtype}; the model "
            f"needs ({layout.size},) float32"
        )
    flat = _flat_storage(model, layout)
    if flat is not None:
        if out is None:
            return flat.detach().numpy().copy()
        np.copyto(out, flat.detach().numpy())
        return out
    state = model.state_dict()
    if out is None:
        out = np.empty(layout.size, dtype=np.float32)
    for s in layout.slots:
        out[s.offset : s.offset + s.numel] = state[s.name].detach().reshape(-1).numpy()
    return out


def set_flat(model: nn.Module, layout: ModelLayout, flat: np.ndarray) -> None:
    """Load a flat vector (as produced by :func:`get_flat`) into the model in place."""
    if flat.shape != (layout.size,):
        raise ValueError(f"flat state has shape {flat.shape}, model needs ({layout.size},)")
    flat = np.ascontiguousarray(flat, dtype=np.float32)
    with warnings.catch_warnings():
        # arrays arriving from Ray's object store are read-only; this tensor is only read
        warnings.simplefilter("ignore", UserWarning)
        src = torch.from_numpy(flat)
    storage = _flat_storage(model, layout)
    if storage is not None:
        with torch.no_grad():
            storage.copy_(src)
        return
    state = model.state_dict()
    with torch.no_grad():
        for s in layout.slots:
            state[s.name].copy_(src[s.offset : s.offset + s.numel].view(s.shape))
