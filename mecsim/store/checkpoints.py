"""Checkpoints of a run, one file per checkpointed round, written atomically.

``<run dir>/checkpoints/round-000006.pt`` holds what the run needs to continue after its
6th round exactly as if it had not stopped: the central server's state (the algorithm's
attributes and the selection generator), each edge server's of a hierarchical algorithm
(e.g. PHSFL's edge models), every client's private state (personal models,
optimiser moments, private layers: whatever the algorithm keeps in ``ctx.state``), the
hosts' measured step costs, the emulated clock and the rounds done. Everything else a
run holds is rebuilt from the scenario and its seed (data split, model initialisation,
channel draws, per-round training generators), and the metrics counters and summary
from the records.

A file is written to a temporary name in the same folder, flushed, fsync'ed and renamed
into place (then the folder is fsync'ed), so a checkpoint is either whole or absent;
the ``keep`` newest are kept. It is a ``torch.save`` of plain containers and tensors
(:mod:`mecsim.agents.state`) and is read back with ``torch.load(weights_only=True)``: loading
never runs code from the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mecsim.agents.state import blob_keys, resolve_blobs
from mecsim.run.interrupts import atomic_section
from mecsim.run.loop import Checkpoint
from mecsim.scenario import Scenario
from mecsim.scenario.aggregation import AggregationConfig
from mecsim.scenario.availability import AvailabilityConfig
from mecsim.scenario.mobility import MobilityConfig
from mecsim.scenario.schema import PhyConfig
from mecsim.store.files import fsync_dir

FORMAT_VERSION = 1
_NAME = re.compile(r"^round-(\d{6,})\.pt$")


class CheckpointError(Exception):
    """No usable checkpoint (or one that does not belong to the run)."""


#: Scenario sections that do not change a run's results: a run may be resumed with other
#: metrics, execution (hosts, backend, Ray address), outputs or checkpoint settings.
_NOT_RESULTS = ("description", "metrics", "execution", "outputs", "checkpoint")
#: Sections added after runs were recorded: left out of the digest while at their
#: defaults, so that a run recorded before a section existed keeps its digest.
_NEW_AT_DEFAULT: dict[str, Any] = {
    "energy": {"idle_policy": "sleep"},
    "geometry": None,
    "aggregation": AggregationConfig().model_dump(mode="json"),  # sync: rounds
    "availability": AvailabilityConfig().model_dump(mode="json"),  # always online
    "compressor": {"name": None, "params": {}},
}
#: ``geometry.mobility`` at its default (static clients): left out of the digest, so a
#: geometry run recorded before clients could move keeps its digest.
_STATIC_MOBILITY: dict[str, Any] = MobilityConfig().model_dump(mode="json")
#: Fields of a scenario's own device profiles (``devices.profiles``) added after runs were
#: recorded: left out of the digest while unset, for the same reason.
_NEW_PROFILE_FIELDS = {
    "radio_pa_efficiency": None,
    "radio_circuit_power_w": None,
    "radio_tx_power_dbm": None,
    "sleep_power_w": None,
    "sleep_power_source": "",
    "aggregate_flops_per_s": None,
    "aggregate_flops_source": "",
}


#: Channel fields that restate others (``uplink.access`` names what ``shared`` and the
#: band already decide) and were added after checkpoints were written: left out of the
#: digest, so those checkpoints still belong to their runs.
_RESTATED = (("uplink", "access"),)
#: Channel fields added after runs were recorded: left out of the digest while at their
#: defaults (``path_loss``: the exponent model every earlier run used).
_NEW_CHANNEL_AT_DEFAULT: dict[str, Any] = {
    "path_loss": {
        "model": "exponent",
        "carrier_ghz": None,
        "bs_height_m": None,
        "ut_height_m": 1.5,
        "los": "random",
        "shadowing": True,
    }
}


#: The PHY's fields, added after runs were recorded, at the defaults every earlier run
#: used (``B · log2(1 + SINR)``, no noise figure)
_NEW_CHANNEL_AT_DEFAULT["phy"] = PhyConfig().model_dump(mode="json")
_NEW_CHANNEL_AT_DEFAULT["noise_figure_db"] = 0.0
#: A link's (uplink, downlink, backhaul) transport fields, added after runs were recorded:
#: left out while at the values an earlier run had (``transport: ideal``, which a run
#: folder without the field loads as) and the defaults of the TCP-only ones
_NEW_LINK_AT_DEFAULT: dict[str, Any] = {
    "transport": "ideal",
    "header_bytes": 52,
    "initial_window_segments": 10,
    "connection": "persistent",
    "congestion_control": "cubic",
    "min_rto_s": 0.2,
}


#: A link's ``queue`` at its default: left out (added after runs with TCP links were
#: recorded; their checkpoints stay theirs)
_QUEUE_DEFAULT = "fq_codel"

#: Fields of ``channel.interference`` added after runs were recorded: left out of the
#: digest while at their defaults (the distribution draws every earlier run used).
_NEW_INTERFERENCE_AT_DEFAULT: dict[str, Any] = {"model": "distribution", "reuse": 1}


def scenario_digest(scenario: Scenario) -> str:
    """SHA-256 of what decides a run's results: the scenario without :data:`_NOT_RESULTS`
    (a checkpoint belongs to the run whose digest it carries)."""
    data = scenario.model_dump(mode="json")
    for key in _NOT_RESULTS:
        data.pop(key, None)
    channel = data.get("channel", {})
    for section, key in _RESTATED:
        channel.get(section, {}).pop(key, None)
    path_loss = channel.get("path_loss")
    if isinstance(path_loss, dict) and path_loss.get("spatial_consistency", 0) is None:
        path_loss.pop("spatial_consistency")  # added after 38.901 runs were recorded
    for key, channel_default in _NEW_CHANNEL_AT_DEFAULT.items():
        if channel.get(key) == channel_default:
            channel.pop(key)
    for link in (channel.get("uplink"), channel.get("downlink"), data.get("backhaul")):
        if isinstance(link, dict) and link.get("queue") == _QUEUE_DEFAULT:
            link.pop("queue")  # added after TCP runs were recorded
        if isinstance(link, dict) and link.get("transport") == "ideal":
            if link.get("mss_bytes") is None:  # what null means under ideal, and was written
                link["mss_bytes"] = 1460
            for key, default in _NEW_LINK_AT_DEFAULT.items():
                if link.get(key) == default:
                    link.pop(key)
    inter = channel.get("interference")
    if isinstance(inter, dict):
        for key, default in _NEW_INTERFERENCE_AT_DEFAULT.items():
            if inter.get(key) == default:
                inter.pop(key)
    for key, default in _NEW_AT_DEFAULT.items():
        if data.get(key) == default:
            data.pop(key)
    aggregation = data.get("aggregation")
    if isinstance(aggregation, dict) and aggregation.get("server", 0) is None:
        aggregation.pop("server")  # added after asynchronous runs were recorded
    geometry = data.get("geometry")
    if isinstance(geometry, dict) and geometry.get("mobility") == _STATIC_MOBILITY:
        geometry.pop("mobility")  # added after geometry runs were recorded
    for profile in (data.get("devices", {}).get("profiles") or {}).values():
        for key, unset in _NEW_PROFILE_FIELDS.items():
            if key in profile and profile[key] == unset:
                del profile[key]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _torch_save_atomic(obj: Any, path: Path) -> int:
    """torch.save to a temporary name, fsync, rename; returns the bytes written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    size = tmp.stat().st_size
    os.replace(tmp, path)
    return size


class CheckpointStore:
    """The checkpoints of one run folder.

    Large arrays (models, moments: see :class:`mecsim.agents.state.BlobSink`) live in
    ``checkpoints/blobs/<sha256>.pt``, each written once and shared by every checkpoint
    that holds it, so a round's checkpoint writes only what changed in it (the models of
    the clients that trained, the server's new aggregate). A blob is written before the
    checkpoint that refers to it, and removed only when no kept checkpoint refers to it.
    """

    def __init__(self, run_dir: Path, run_id: str, digest: str, keep: int = 2) -> None:
        self.dir = Path(run_dir) / "checkpoints"
        self.blob_dir = self.dir / "blobs"
        self.run_id, self.digest, self.keep = run_id, digest, max(1, keep)
        self.last_bytes = 0  # bytes written by the last save and its time (recorded)
        self.last_seconds = 0.0
        self._blobs: set[str] | None = None
        self._refs: dict[Path, set[str]] = {}  # checkpoint -> blobs it refers to

    def path(self, rounds_done: int) -> Path:
        return self.dir / f"round-{rounds_done:06d}.pt"

    def blob_keys(self) -> set[str]:
        """Digests of the blobs on disk."""
        if self._blobs is None:
            self._blobs = (
                {p.name[:-3] for p in self.blob_dir.glob("*.pt")}
                if self.blob_dir.is_dir()
                else set()
            )
        return set(self._blobs)

    def save(self, ckpt: Checkpoint) -> Path:
        start = time.perf_counter()
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        known = self.blob_keys()
        refs = blob_keys([ckpt.server, ckpt.clients, ckpt.edges, ckpt.clocked])
        payload = {
            "format": FORMAT_VERSION,
            "run_id": self.run_id,
            "scenario": self.digest,
            "rounds_done": ckpt.rounds_done,
            "elapsed_s": ckpt.elapsed_s,
            "server": ckpt.server,
            "clients": ckpt.clients,
            "costs": ckpt.costs,
            "edges": ckpt.edges,
            "clocked": ckpt.clocked,  # an asynchronous run's (mecsim.run.async_run)
            "blobs": sorted(refs),
        }
        path = self.path(ckpt.rounds_done)
        written = 0
        with atomic_section():
            for key, tensor in ckpt.blobs.items():
                if key in refs and key not in known:
                    written += _torch_save_atomic(tensor, self.blob_dir / f"{key}.pt")
                    known.add(key)
            if refs - known:
                raise CheckpointError(
                    f"checkpoint after round {ckpt.rounds_done} refers to "
                    f"{len(refs - known)} blob(s) nobody sent"
                )
            fsync_dir(self.blob_dir)
            written += _torch_save_atomic(payload, path)
            fsync_dir(self.dir)
            self._blobs = known
            self._refs[path] = refs
            self.prune(self.keep)
        self.last_bytes = written
        self.last_seconds = time.perf_counter() - start
        return path

    def prune(self, keep: int) -> None:
        """Keep only the ``keep`` newest checkpoints and the blobs they refer to."""
        for old in self.all()[: -max(1, keep)]:
            old.unlink(missing_ok=True)
            self._refs.pop(old, None)
        self._prune_blobs()

    def _prune_blobs(self) -> None:
        """Remove blobs no kept checkpoint refers to."""
        used: set[str] = set()
        for p in self.all():
            if p not in self._refs:
                try:
                    payload = torch.load(p, map_location="cpu", weights_only=True)
                    self._refs[p] = set(payload.get("blobs", []))
                except Exception:  # noqa: BLE001 - an unreadable checkpoint refers to nothing
                    self._refs[p] = set()
            used |= self._refs[p]
        for key in self.blob_keys() - used:
            (self.blob_dir / f"{key}.pt").unlink(missing_ok=True)
            assert self._blobs is not None
            self._blobs.discard(key)

    def all(self) -> list[Path]:
        """Checkpoint files, oldest first."""
        if not self.dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.dir.iterdir() if (m := _NAME.match(p.name))]
        return [p for _, p in sorted(found)]

    def load(self, path: Path) -> Checkpoint:
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a truncated or foreign file: any unpickling error
            raise CheckpointError(f"{path}: unreadable checkpoint ({type(exc).__name__})") from None
        if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"{path}: not a mecsim checkpoint of format {FORMAT_VERSION}")
        if payload.get("run_id") != self.run_id or payload.get("scenario") != self.digest:
            raise CheckpointError(f"{path}: belongs to another run or scenario")
        m = _NAME.match(path.name)
        if not m or int(m.group(1)) != payload.get("rounds_done"):
            raise CheckpointError(f"{path}: its name and contents disagree")

        def load_blob(key: str) -> torch.Tensor:
            blob = self.blob_dir / f"{key}.pt"
            try:
                tensor = torch.load(blob, map_location="cpu", weights_only=True)
            except Exception as exc:  # missing, truncated or foreign
                raise CheckpointError(
                    f"{path}: its blob {blob.name} is unreadable ({type(exc).__name__})"
                ) from None
            if not isinstance(tensor, torch.Tensor):
                raise CheckpointError(f"{path}: its blob {blob.name} is not a tensor")
            return tensor

        server, clients, edges, clocked = resolve_blobs(
            [
                payload["server"],
                payload["clients"],
                payload.get("edges", {}),
                payload.get("clocked"),
            ],
            load_blob,
        )
        return Checkpoint(
            int(payload["rounds_done"]),
            float(payload["elapsed_s"]),
            server,
            dict(clients),
            payload["costs"],
            path,
            edges=dict(edges),
            clocked=clocked,
        )

    def latest(self, warn: Callable[[str], None] | None = None) -> Checkpoint | None:
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
