"""Checkpoints of a run, one file per checkpointed round, written atomically.

``<run dir>/checkpoints/round-000006.pt`` holds what the run needs to continue after its
6th round exactly as if it had not stopped: the edge server's state (the algorithm's
attributes and the selection generator), every client's private state (personal models,
optimiser moments, private layers: whatever the algorithm keeps in ``ctx.state``), the
hosts' measured step costs, the emulated clock and the rounds done. Everything else a
run holds is rebuilt from the scenario and its seed (data split, model initialisation,
channel draws, per-round training generators), and the metrics counters and summary
from the records.

A file is written to a temporary name in the same folder, flushed, fsync'ed and renamed
into place (then the folder is fsync'ed), so a checkpoint is either whole or absent;
the ``keep`` newest are kept. It is a ``torch.save`` of plain containers and tensors
(:mod:`agents.state`) and is read back with ``torch.load(weights_only=True)``: loading
never runs code from the file.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mecsim.interrupts import atomic_section

FORMAT_VERSION = 1
_NAME = re.compile(r"^round-(\d{6,})\.pt$")


class CheckpointError(Exception):
    """No usable checkpoint (or one that does not belong to the run)."""


@dataclass(frozen=True)
class Checkpoint:
    rounds_done: int
    elapsed_s: float
    server: Any  # encoded EdgeServer state
    clients: dict[int, Any]  # encoded ctx.state of every client
    costs: Any  # encoded measured step costs
    path: Path | None = None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with atomic_section():
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def scenario_digest(resolved_yaml: str) -> str:
    return hashlib.sha256(resolved_yaml.encode()).hexdigest()


class CheckpointStore:
    """The checkpoints of one run folder."""

    def __init__(self, run_dir: Path, run_id: str, digest: str, keep: int = 2) -> None:
        self.dir = Path(run_dir) / "checkpoints"
        self.run_id, self.digest, self.keep = run_id, digest, max(1, keep)
        self.last_bytes = 0  # size and time of the last save (the run records them)
        self.last_seconds = 0.0

    def path(self, rounds_done: int) -> Path:
        return self.dir / f"round-{rounds_done:06d}.pt"

    def save(self, ckpt: Checkpoint) -> Path:
        start = time.perf_counter()
        self.dir.mkdir(exist_ok=True)
        payload = {"format": FORMAT_VERSION, "run_id": self.run_id, "scenario": self.digest,
                   "rounds_done": ckpt.rounds_done, "elapsed_s": ckpt.elapsed_s,
                   "server": ckpt.server, "clients": ckpt.clients, "costs": ckpt.costs}
        path = self.path(ckpt.rounds_done)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with atomic_section():
            with tmp.open("wb") as f:
                torch.save(payload, f)
                f.flush()
                os.fsync(f.fileno())
            self.last_bytes = tmp.stat().st_size
            os.replace(tmp, path)
            fsync_dir(self.dir)
            for old in self.all()[:-self.keep]:
                old.unlink(missing_ok=True)
        self.last_seconds = time.perf_counter() - start
        return path

    def all(self) -> list[Path]:
        """Checkpoint files, oldest first."""
        if not self.dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.dir.iterdir()
                 if (m := _NAME.match(p.name))]
        return [p for _, p in sorted(found)]

    def load(self, path: Path) -> Checkpoint:
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a truncated or foreign file: any unpickling error
            raise CheckpointError(f"{path}: unreadable checkpoint ({type(exc).__name__})") \
                from None
        if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"{path}: not a mecsim checkpoint of format "
                                  f"{FORMAT_VERSION}")
        if payload.get("run_id") != self.run_id or payload.get("scenario") != self.digest:
            raise CheckpointError(f"{path}: belongs to another run or scenario")
        m = _NAME.match(path.name)
        if not m or int(m.group(1)) != payload.get("rounds_done"):
            raise CheckpointError(f"{path}: its name and contents disagree")
        return Checkpoint(int(payload["rounds_done"]), float(payload["elapsed_s"]),
                          payload["server"], dict(payload["clients"]), payload["costs"], path)

    def latest(self, warn=None) -> Checkpoint | None:
        """The newest readable checkpoint (an unreadable one is reported through
        ``warn(message)`` and skipped); None when there is none."""
        for path in reversed(self.all()):
            try:
                return self.load(path)
            except CheckpointError as exc:
                if warn is not None:
                    warn(f"{exc}; trying an older one")
        return None

    def discard_after(self, rounds_done: int) -> None:
        """Remove checkpoints newer than ``rounds_done`` (not written by this history)."""
        for p in self.all():
            m = _NAME.match(p.name)
            if m and int(m.group(1)) > rounds_done:
                p.unlink(missing_ok=True)
