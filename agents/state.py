"""State of algorithms as plain data: what a checkpoint stores and reads back.

:func:`encode` turns the state an algorithm keeps between rounds (numpy arrays, tensors,
dicts, lists, numbers, random generators and the small dataclasses of ``mecsim.agents``) into a
tree of built-in containers, numbers, strings and tensors, which ``torch.save`` writes
and ``torch.load(..., weights_only=True)`` reads back without running any code from the
file. :func:`decode` rebuilds the original objects; it creates instances only of
dataclasses defined in ``mecsim.*`` (those of older checkpoints' ``agents.*`` too), and random
generators of the bit-generator types numpy ships.

``decode(encode(x))`` equals ``x`` value for value and type for type, and generators
continue their streams exactly where they were (tests check each kind).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from typing_extensions import Buffer

TAG = "__mecsim__"
#: Arrays and tensors of at least this size are stored apart, by content (see BlobSink).
BLOB_MIN_BYTES = 1 << 16
_ALLOWED_MODULES = ("mecsim.",)
#: Checkpoints of mecsim 0.1 (when ``agents`` was a package of its own) name the dataclasses
#: of the algorithms' state ``agents.<module>:<class>``; they are ``mecsim.agents...`` now.
LEGACY_MODULES = {"agents.": "mecsim.agents."}
_BIT_GENERATORS = {
    "PCG64": np.random.PCG64,
    "PCG64DXSM": np.random.PCG64DXSM,
    "Philox": np.random.Philox,
    "SFC64": np.random.SFC64,
    "MT19937": np.random.MT19937,
}
_PLAIN_KEY = (str, int)


class StateError(TypeError):
    """A value that cannot be stored in, or read back from, a checkpoint."""


class BlobSink:
    """Collects large tensors by content, so a checkpoint stores each once.

    ``encode(..., blobs=sink)`` replaces every array or tensor of at least
    :data:`BLOB_MIN_BYTES` by a reference to its SHA-256 digest (of dtype, shape and
    bytes); the tensor itself is kept in :attr:`new` only if its digest is not in
    ``known`` (the blobs a checkpoint folder already has). Most of a large run's state —
    the models of clients that did not take part in a round — is then neither sent to
    the driver nor written again.
    """

    def __init__(self, known: frozenset[str] | set[str] = frozenset()) -> None:
        self.known = known
        self.new: dict[str, torch.Tensor] = {}

    def reference(self, tensor: torch.Tensor, kind: str) -> dict[str, Any]:
        t = tensor.detach().cpu().contiguous()
        h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
        # cast: numpy's stubs give ndarray the buffer protocol only for Python >= 3.12
        h.update(
            memoryview(cast("Buffer", t.view(torch.uint8).reshape(-1).numpy()))
            if t.numel()
            else b""
        )
        key = h.hexdigest()
        if key not in self.known and key not in self.new:
            self.new[key] = t.clone()
        return {TAG: "blob", "key": key, "kind": kind}


def resolve_blobs(tree: Any, load) -> Any:
    """``tree`` with each blob reference replaced by its tensor (``load(key)``), in the
    form :func:`decode` reads."""
    if isinstance(tree, list):
        return [resolve_blobs(v, load) for v in tree]
    if isinstance(tree, tuple):
        return tuple(resolve_blobs(v, load) for v in tree)
    if not isinstance(tree, dict):
        return tree
    if tree.get(TAG) == "blob":
        tensor = load(tree["key"])
        return {TAG: "ndarray", "data": tensor} if tree["kind"] == "ndarray" else tensor
    return {k: resolve_blobs(v, load) for k, v in tree.items()}


def blob_keys(tree: Any) -> set[str]:
    """The blob digests a tree refers to."""
    if isinstance(tree, (list, tuple)):
        return set().union(*(blob_keys(v) for v in tree)) if tree else set()
    if not isinstance(tree, dict):
        return set()
    if tree.get(TAG) == "blob":
        return {tree["key"]}
    return set().union(*(blob_keys(v) for v in tree.values())) if tree else set()


def encode(obj: Any, where: str = "state", blobs: BlobSink | None = None) -> Any:
    """A tree of dict/list/tuple/str/int/float/bool/None/bytes/tensor equal to ``obj``
    (with ``blobs``, large arrays as references to it)."""

    def enc(value: Any, at: str) -> Any:
        return encode(value, at, blobs)

    if obj is None or isinstance(obj, (bool, str, bytes)):
        return obj
    if isinstance(obj, np.generic):  # numpy scalars keep their dtype
        if obj.dtype.kind not in "biuf":
            raise StateError(f"{where}: numpy scalar of dtype {obj.dtype} cannot be stored")
        return {TAG: "npscalar", "dtype": obj.dtype.str, "value": obj.item()}
    if isinstance(obj, (int, float)):
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf" or obj.dtype.byteorder == ">":
            raise StateError(f"{where}: array of dtype {obj.dtype} cannot be stored")
        if blobs is not None and obj.nbytes >= BLOB_MIN_BYTES:
            return blobs.reference(torch.from_numpy(np.ascontiguousarray(obj)), "ndarray")
        return {TAG: "ndarray", "data": torch.from_numpy(np.ascontiguousarray(obj).copy())}
    if isinstance(obj, torch.Tensor):
        if blobs is not None and obj.numel() * obj.element_size() >= BLOB_MIN_BYTES:
            return blobs.reference(obj, "tensor")
        return obj.detach().cpu().clone()
    if isinstance(obj, np.random.Generator):
        bg = obj.bit_generator
        name = type(bg).__name__
        if name not in _BIT_GENERATORS:
            raise StateError(f"{where}: bit generator {name} cannot be stored")
        return {TAG: "np_generator", "bit_generator": name, "state": bg.state}
    if isinstance(obj, torch.Generator):
        return {TAG: "torch_generator", "state": obj.get_state()}
    if isinstance(obj, dict):
        if all(isinstance(k, _PLAIN_KEY) and k != TAG for k in obj):
            return {k: enc(v, f"{where}[{k!r}]") for k, v in obj.items()}
        return {
            TAG: "dict",
            "items": [(enc(k, f"{where} key"), enc(v, f"{where}[{k!r}]")) for k, v in obj.items()],
        }
    if isinstance(obj, list):
        return [enc(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(enc(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, (set, frozenset)):
        return {
            TAG: type(obj).__name__,
            "items": [enc(v, f"{where} item") for v in sorted(obj, key=repr)],
        }
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        if not cls.__module__.startswith(_ALLOWED_MODULES):
            raise StateError(
                f"{where}: dataclass {cls.__module__}.{cls.__qualname__} is not one of mecsim's"
            )
        # every attribute, also those a __post_init__ adds beside the declared fields
        names = (
            list(vars(obj))
            if hasattr(obj, "__dict__")
            else [f.name for f in dataclasses.fields(obj)]
        )
        fields = {name: enc(getattr(obj, name), f"{where}.{name}") for name in names}
        return {TAG: "dataclass", "type": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    raise StateError(
        f"{where}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be "
        "stored in a checkpoint"
    )


def _dataclass_type(name: str) -> type:
    module_name, _, qualname = name.partition(":")
    module_name = _current_module(module_name)
    if not module_name.startswith(_ALLOWED_MODULES):
        raise StateError(f"checkpoint names a type outside mecsim: {name!r}")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise StateError(f"checkpoint names {name!r}, which is not a dataclass of mecsim")
    return obj


def _current_module(name: str) -> str:
    """Where a module a checkpoint names is now (see :data:`LEGACY_MODULES`)."""
    for old, new in LEGACY_MODULES.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def decode(obj: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    if not isinstance(obj, dict):
        return obj
    kind = obj.get(TAG)
    if kind is None:
        return {k: decode(v) for k, v in obj.items()}
    if kind == "ndarray":
        return obj["data"].numpy().copy()
    if kind == "npscalar":
        dtype = np.dtype(obj["dtype"])
        if dtype.kind not in "biuf":
            raise StateError(f"checkpoint holds a scalar of dtype {dtype}")
        return dtype.type(obj["value"])
    if kind == "np_generator":
        try:
            bg = _BIT_GENERATORS[obj["bit_generator"]]()
        except KeyError:
            raise StateError(f"unknown bit generator {obj['bit_generator']!r}") from None
        bg.state = obj["state"]
        return np.random.Generator(bg)
    if kind == "torch_generator":
        gen = torch.Generator()
        gen.set_state(obj["state"])
        return gen
    if kind == "dict":
        return {decode(k): decode(v) for k, v in obj["items"]}
    if kind in ("set", "frozenset"):
        items = [decode(v) for v in obj["items"]]
        return set(items) if kind == "set" else frozenset(items)
    if kind == "dataclass":
        cls: Any = _dataclass_type(obj["type"])
        inst = cls.__new__(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        if not names <= set(obj["fields"]):
            raise StateError(
                f"checkpoint's {obj['type']} lacks fields "
                f"{sorted(names - set(obj['fields']))} of the code's"
            )
        for name, value in obj["fields"].items():
            object.__setattr__(inst, name, decode(value))  # frozen dataclasses too
        return inst
    raise StateError(f"checkpoint holds an unknown kind of value {kind!r}")
