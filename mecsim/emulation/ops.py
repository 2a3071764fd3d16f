"""Op-traces: what a client did in one round, in the order it did it.

A client's round is executed for real (training in PyTorch), and returns an op-trace:
the ordered operations it performed, each carrying the quantities that decide how long
it takes on the emulated network and device (bytes, FLOPs, mini-batches). The SimPy
engine (:mod:`mecsim.emulation.engine`) then plays the op-traces of all clients of a round through
the links, shared media and device CPUs ("execute, then time").

Ops are small frozen records, serialisable to plain dicts for the run records
(``optraces.jsonl``) and for replay.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class Download:
    """Server -> client transfer over the client's downlink."""

    nbytes: int
    what: str = "model"


@dataclass(frozen=True, slots=True)
class Upload:
    """Client -> server transfer over the client's uplink."""

    nbytes: int
    what: str = "model"


@dataclass(frozen=True, slots=True)
class Compute:
    """Work on the client's own device CPU: ``batches`` optimiser steps, ``flops`` FLOPs."""

    flops: float
    batches: int
    what: str = "train"


@dataclass(frozen=True, slots=True)
class ServerCompute:
    """Work done for this client on its edge server's CPU (shared among its clients)."""

    flops: float
    batches: int = 0
    what: str = "server"


@dataclass(frozen=True, slots=True)
class Backhaul:
    """Edge server <-> central server transfer over the wired backhaul, once per edge server.

    Every client of an edge server that takes part in the round carries the same Backhaul
    op (the k-th Backhaul op of each of them is one transfer): the edge server sends or
    receives its model once, so the transfer starts when the last of its clients reaches
    the op (the edge model needs all their updates, PHSFL Eqs. 14-16) and releases all of
    them when done, ``latency_s + 8 * nbytes / bandwidth_bps`` later. ``direction`` is
    ``"up"`` (edge -> central) or ``"down"`` (central -> edge). Not counted in
    :func:`trace_bytes` (which counts the wireless bytes).
    """

    nbytes: int
    direction: str = "up"
    what: str = "edge_model"

    def __post_init__(self) -> None:
        if self.direction not in ("up", "down"):
            raise ValueError(f"Backhaul.direction must be 'up' or 'down', got {self.direction!r}")
        if self.nbytes < 0:
            raise ValueError(f"Backhaul.nbytes must be >= 0, got {self.nbytes}")


@dataclass(frozen=True, slots=True)
class Barrier:
    """Wait for the server's decision, which needs every client's report first.

    The k-th Barrier op of every client of the round that carries one is one decision: it
    releases them all when the last of them reaches it (no time of its own; the waiting
    is idle time, in none of the per-kind totals). DC-PFL's trial round waits here after
    its loss reports, before the decision comes down and the chosen model goes up.
    """

    what: str = "decision"


@dataclass(frozen=True, slots=True)
class Handoff:
    """A client's state moved from its old edge server to its new one after a handover,
    over the wired backhaul through the central server: ``nbytes`` up the old edge
    server's backhaul (``from_edge_server``), then down the new (serving) one's, each hop
    ``latency_s + 8 * nbytes / bandwidth_bps`` of that edge server's backhaul, one after
    the other. Per client (no barrier, no sharing: the backhaul is not a shared medium in
    the engine). The client's next op waits for it (the new edge server serves the
    client once its state is there). Not counted in :func:`trace_bytes` (wireless
    bytes); see :func:`handoff_bytes`. Only the SimPy model times it (the fast paths
    leave such rounds to it).
    """

    nbytes: int
    from_edge_server: int
    what: str = "client_state"

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            raise ValueError(f"Handoff.nbytes must be >= 0, got {self.nbytes}")
        if self.from_edge_server < 0:
            raise ValueError(f"Handoff.from_edge_server must be >= 0, got {self.from_edge_server}")


Op = Download | Upload | Compute | ServerCompute | Backhaul | Barrier | Handoff
OpTrace = tuple[Op, ...]

_OP_TYPES: dict[str, type[Op]] = {
    "download": Download,
    "upload": Upload,
    "compute": Compute,
    "server_compute": ServerCompute,
    "backhaul": Backhaul,
    "barrier": Barrier,
    "handoff": Handoff,
}
_OP_NAMES = {cls: name for name, cls in _OP_TYPES.items()}
# each op type's field names, in order: an op's fields are numbers and strings, so
# reading them is what dataclasses.asdict does, without its deep copy (a run records a
# few ops per client-round)
_OP_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in _OP_TYPES.values()}


def op_to_dict(op: Op) -> dict[str, Any]:
    """A plain dict with an ``op`` key naming the type (for JSON records)."""
    cls = type(op)
    return {"op": _OP_NAMES[cls], **{name: getattr(op, name) for name in _OP_FIELDS[cls]}}


def op_from_dict(d: dict[str, Any]) -> Op:
    values = dict(d)
    kind = values.pop("op")
    return _OP_TYPES[kind](**values)


def trace_bytes(trace: OpTrace) -> tuple[int, int]:
    """(bytes uploaded, bytes downloaded) by one op-trace."""
    up = sum(op.nbytes for op in trace if isinstance(op, Upload))
    down = sum(op.nbytes for op in trace if isinstance(op, Download))
    return up, down


def handoff_bytes(trace: OpTrace) -> int:
    """Bytes of client state moved over the backhaul by one op-trace (Handoff ops)."""
    return sum(op.nbytes for op in trace if isinstance(op, Handoff))


def trace_flops(trace: OpTrace) -> tuple[float, float]:
    """(client FLOPs, edge-server FLOPs) of one op-trace."""
    client = sum(op.flops for op in trace if isinstance(op, Compute))
    server = sum(op.flops for op in trace if isinstance(op, ServerCompute))
    return client, server
