"""Pre-flight: everything that would stop a run, found before anything starts.

:func:`check` runs after the schema (:mod:`mecsim.scenario`) and before Ray starts or a
folder is created; ``mecsim validate`` and ``mecsim run`` both call it, and so can
anything else that starts runs. It looks at what the schema cannot see alone:

- **outputs**: the run folder is ``outputs.dir/<run id>``, must not exist yet, and
  ``outputs.dir`` must be (or be creatable as) a writable directory;
- **metrics**: the host resolves, is a loopback address unless ``metrics.public`` is set
  (then a warning), and the port can be listened on (not in use, not privileged for this
  user);
- **Ray**: an ``execution.ray_address`` names a host that resolves and a port that
  answers;
- **data**: ``dataset.root`` is a directory, the files load (CIFAR batches through the
  restricted unpickler), and the partition gives every client data;
- **model and memory**: the model takes the dataset's input; the memory of one training
  step at ``training.batch_size`` (``mecsim.agents.training.step_cost_on_meta``: the accounting
  of a real step, run on PyTorch's meta device: exact, for any batch, without allocating
  it) fits every client device's RAM and this machine's RAM;
- **algorithm**: each algorithm's own cross-field checks
  (``ServerAlgorithm.check_scenario``: MTFL's optimiser, PHSFL's cut layer, DC-PFL's full
  participation, ...) and its server built on the real model layout;
- **channel**: a trace path is a readable regular file whose rows parse, and the channel
  gives every client finite rates.

Every problem is one line ``FILE: FIELD: message``; :func:`check` raises
:class:`~mecsim.scenario.ScenarioError` with all of them, so a caller exits with code 2
having started and written nothing.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import shutil
import socket
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from torch import nn

from mecsim.agents.algorithms import TrainConfig, algorithm_classes
from mecsim.agents.compressors import compressor
from mecsim.agents.models import ModelLayout, build_model, get_flat, model_layout
from mecsim.agents.training import step_cost_on_meta
from mecsim.data import DataPools, dataset_shape, dataset_spec, load_dataset, partition
from mecsim.emulation.availability import Availability, AvailabilityError
from mecsim.emulation.mobility import TraceError
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.run import limits as run_limits
from mecsim.run.async_run import refusals as async_refusals
from mecsim.run.limits import Limits
from mecsim.run.setup import moving_rate_refusal
from mecsim.run.torch_rng import untouched
from mecsim.scenario import Scenario, ScenarioError, TraceChannelConfig

MiB = 1024 * 1024
GiB = 1024 * MiB
EMBEDDED = ("mnist-embedded", "mnist-embedded-3x32")
RAY_CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Problem:
    field: str  # dotted scenario path, e.g. "training.batch_size"
    message: str


@dataclass
class Findings:
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    def problem(self, where: str, message: str) -> None:
        p = Problem(where, " ".join(str(message).split()))  # always one line
        if p not in self.problems:
            self.problems.append(p)

    def warn(self, where: str, message: str) -> None:
        self.warnings.append(Problem(where, " ".join(str(message).split())))


def check(
    scenario: Scenario,
    source: str,
    *,
    run_dir: str | Path | None = None,
    backend: str | None = None,
    hosts: int | None = None,
    ray_address: str | None = None,
    resume: bool = False,
    limits: Limits | None = None,
) -> list[str]:
    """Raise ScenarioError listing every problem (``source: field: message``), or return
    the warnings as lines. ``run_dir`` (the run's folder) is checked when given: directly
    inside ``outputs.dir`` and new — or, with ``resume=True``, existing (a run being
    continued). ``backend``, ``hosts`` and ``ray_address`` override the scenario's as in
    :func:`mecsim.run.setup.prepare`. With ``limits``, a scenario above them (rounds,
    clients, training steps, hosts: :mod:`mecsim.run.limits`) is refused before anything
    else is checked: its data are not even loaded."""
    found = Findings()
    if limits is not None:
        for where, message in run_limits.check(scenario, limits):
            found.problem(where, message)
    if not found.problems:
        found = find_problems(
            scenario,
            run_dir=run_dir,
            backend=backend,
            hosts=hosts,
            ray_address=ray_address,
            resume=resume,
        )
    if found.problems:
        raise ScenarioError("\n".join(f"{source}: {p.field}: {p.message}" for p in found.problems))
    return [f"{source}: warning: {w.field}: {w.message}" for w in found.warnings]


def find_problems(
    scenario: Scenario,
    *,
    run_dir: str | Path | None = None,
    backend: str | None = None,
    hosts: int | None = None,
    ray_address: str | None = None,
    resume: bool = False,
) -> Findings:
    # numeric warnings (overflow in a channel draw...) would be stray lines on stderr;
    # what they warn of is checked and reported as a problem instead
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return _find_problems(scenario, run_dir, backend, hosts, ray_address, resume)


def _find_problems(
    scenario: Scenario,
    run_dir: str | Path | None,
    backend: str | None,
    hosts: int | None,
    ray_address: str | None,
    resume: bool,
) -> Findings:
    found = Findings()
    backend = backend or scenario.execution.backend
    address = ray_address or scenario.execution.ray_address
    check_outputs(scenario, None if run_dir is None else Path(run_dir), found, resume)
    if scenario.metrics.enabled:
        check_metrics(scenario.metrics.host, scenario.metrics.port, scenario.metrics.public, found)
    if backend == "ray" and address:
        check_ray_address(address, found)
    refusal = moving_rate_refusal(scenario)
    if refusal is not None:
        found.problem("geometry.mobility.rate", refusal)
    for where, message in async_refusals(scenario):
        found.problem(where, message)
    pools = check_dataset(scenario, found)
    built = check_model_and_memory(scenario, pools, backend, hosts, address, found)
    if built is not None:
        check_algorithm(scenario, *built, found)
        if not resume:
            check_disk(scenario, built[1], found)
    check_channel(scenario, found)
    check_availability(scenario, found)
    return found


def check_availability(scenario: Scenario, found: Findings) -> None:
    """An availability trace whose clients or times do not fit the scenario is refused
    before anything starts, naming the file and the line."""
    if not scenario.availability.limited():
        return
    try:
        server_cls, _ = algorithm_classes(scenario.algorithm.name)
    except (KeyError, ValueError):
        server_cls = None  # an unknown algorithm is refused by check_algorithm
    if server_cls is not None and server_cls.drives_rounds:
        found.problem(
            "availability",
            f"algorithm {scenario.algorithm.name!r} selects its clients in its own code "
            "(it drives its rounds): clients that go offline are not modelled for it",
        )
    if scenario.availability.model != "trace":
        return
    try:
        Availability.of(scenario.availability, scenario.topology.clients, scenario.seed)
    except AvailabilityError as exc:
        found.problem("availability.trace", str(exc))


# ----------------------------------------------------------------------------- outputs


def check_outputs(
    scenario: Scenario, run_dir: Path | None, found: Findings, resume: bool = False
) -> None:
    """``outputs.dir`` can hold run folders; the run folder (``run_dir``, or the
    scenario's own ``outputs.run_id`` under it) is directly inside it and new (or, when
    resuming, an existing folder)."""
    base = Path(scenario.outputs.dir).expanduser()
    if run_dir is None and scenario.outputs.run_id is not None:
        run_dir = base / scenario.outputs.run_id
    if run_dir is not None:
        run_dir = run_dir.expanduser()
        if os.path.abspath(run_dir.parent) != os.path.abspath(base) or run_dir.name in (
            "",
            ".",
            "..",
        ):
            found.problem(
                "outputs.run_id",
                f"the run folder {run_dir} would not be directly inside outputs.dir {base}",
            )
            return
    existing = base
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        found.problem(
            "outputs.dir", f"{existing} is not a directory, so {base} cannot hold run folders"
        )
    elif not os.access(existing, os.W_OK | os.X_OK):
        what = "create run folders in" if existing == base else f"create {base} under"
        found.problem("outputs.dir", f"no permission to {what} {existing}")
    elif problem := _cannot_make_folders(existing):
        # os.access says yes to root everywhere: /proc, /sys, a read-only mount
        what = "run folders" if existing == base else f"{base}"
        found.problem("outputs.dir", f"cannot make {what} in {existing} ({problem})")
    elif run_dir is not None and resume:
        if not run_dir.is_dir():
            found.problem("outputs.run_id", f"there is no run folder {run_dir} to resume")
    elif run_dir is not None and os.path.lexists(run_dir):
        found.problem(
            "outputs.run_id",
            f"the run folder {run_dir} already exists; choose another run id (--run-id)",
        )


def _cannot_make_folders(folder: Path) -> str | None:
    """Why no folder can be made in ``folder`` (an empty one is made and removed to
    find out), or None."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mecsim-check-", dir=folder))
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def checkpoint_bytes(scenario: Scenario, layout: ModelLayout) -> int:
    """An upper bound of what a run's checkpoints keep on disk: ``checkpoint.keep`` copies
    of the server's state (counted as two models: the global model and the algorithm's
    own, e.g. optimiser moments) and of every client's, one model each when the
    algorithm's clients keep state (a personal model), none when they keep nothing
    (FedAvg). Unchanged arrays are shared between checkpoints, so a run usually needs
    less (KAPC on ResNet18, 100 clients: 6.5 GB measured against the 9.1 GB bound)."""
    if scenario.checkpoint.every == 0:
        return 0
    _, client_cls = algorithm_classes(scenario.algorithm.name)
    stateful = 0 if client_cls.movable() else scenario.topology.clients
    comp = scenario.compressor
    if comp.name is not None and compressor(comp.name, comp.params).keeps_residual:
        stateful += scenario.topology.clients  # error feedback: a residual per client
    return scenario.checkpoint.keep * (2 + stateful) * layout.nbytes


def check_disk(scenario: Scenario, layout: ModelLayout, found: Findings) -> None:
    """A warning when the disk under ``outputs.dir`` has less room than the run's
    checkpoints may need (:func:`checkpoint_bytes`): the run starts, and would stop at the
    checkpoint that does not fit (its finished rounds kept)."""
    need = checkpoint_bytes(scenario, layout)
    base = Path(scenario.outputs.dir).expanduser()
    existing = base
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        usage = shutil.disk_usage(existing)
    except OSError:
        return  # check_outputs says what is wrong with the folder
    free = usage.free
    if usage.total and need > free:  # (a pseudo file system has no size: nothing to say)
        found.warn(
            "checkpoint",
            f"the run's checkpoints may take up to {need / GiB:,.2f} GiB "
            f"({scenario.checkpoint.keep} kept x the server's and each client's "
            f"state, {layout.nbytes / MiB:,.1f} MiB a model), but {existing} has "
            f"{free / GiB:,.2f} GiB free: keep fewer (checkpoint.keep), checkpoint "
            "less often (checkpoint.every) or write elsewhere (outputs.dir)",
        )


# ----------------------------------------------------------------------------- network


def _resolve(host: str, port: int | None) -> list[tuple[Any, ...]]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def check_metrics(host: str, port: int, public: bool, found: Findings) -> None:
    """The metrics endpoint: host resolves and is loopback (or allowed public), port free."""
    try:
        infos = _resolve(host, port or None)
    except (OSError, UnicodeError) as exc:
        found.problem(
            "metrics.host", f"cannot resolve {host!r} ({getattr(exc, 'strerror', None) or exc})"
        )
        return
    addresses = sorted({info[4][0] for info in infos})
    if not all(_is_loopback(a) for a in addresses):
        if not public:
            found.problem(
                "metrics.host",
                f"{host} is not a loopback address, so /metrics "
                "would be reachable from other machines; set metrics.public: true "
                "(mecsim run --metrics-public) to allow it",
            )
        else:
            found.warn(
                "metrics.host",
                f"/metrics will be served on {host} "
                f"({', '.join(addresses)}), reachable from other machines",
            )
    if port == 0:
        return  # any free port: chosen when the endpoint starts
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server does
        try:
            s.bind(sockaddr)
        except PermissionError:
            found.problem(
                "metrics.port",
                f"port {port} is privileged (below 1024) and this "
                "user may not listen on it; choose a port from 1024 up, or 0 for "
                "any free port",
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                found.problem(
                    "metrics.port",
                    f"port {port} on {host} is in use; choose "
                    "another (--metrics-port), or 0 for any free port",
                )
            elif exc.errno == errno.EADDRNOTAVAIL:
                found.problem("metrics.host", f"{host} is not an address of this machine")
            else:
                found.problem("metrics.port", f"cannot listen on {host}:{port} ({exc.strerror})")


def check_ray_address(address: str, found: Findings) -> None:
    """``auto`` or ``[ray://]HOST:PORT`` whose host resolves and whose port answers."""
    if address in ("auto", "local"):
        return
    host, sep, port_text = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        found.problem(
            "execution.ray_address", f"{address!r} is not 'auto', HOST:PORT or ray://HOST:PORT"
        )
        return
    try:
        infos = _resolve(host, int(port_text))
    except (OSError, UnicodeError) as exc:
        found.problem(
            "execution.ray_address",
            f"cannot resolve {host!r} ({getattr(exc, 'strerror', None) or exc})",
        )
        return
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(RAY_CONNECT_TIMEOUT_S)
        try:
            s.connect(sockaddr)
        except OSError as exc:
            found.problem(
                "execution.ray_address",
                f"nothing answers at {host}:{port_text} "
                f"({exc.strerror or 'timed out'}); is the Ray head running?",
            )


# ----------------------------------------------------------------------------- data


def check_dataset(scenario: Scenario, found: Findings) -> DataPools | None:
    """Load the data and partition it as the run will; the pools, or None."""

    ds = scenario.dataset
    try:
        needs_root = dataset_spec(ds.name).needs_root
    except ValueError as exc:  # a plugin that fails to load or is not a DatasetSpec
        found.problem("dataset.name", str(exc))
        return None
    if needs_root or (ds.root is not None and ds.name not in EMBEDDED):
        if ds.root is None:
            found.problem(
                "dataset.root",
                f"dataset {ds.name} is read from files: set "
                "dataset.root to the directory holding them (nothing is "
                "downloaded)",
            )
            return None
        root = Path(ds.root).expanduser()
        if not root.exists():
            found.problem("dataset.root", f"{root}: no such directory")
            return None
        if not root.is_dir():
            found.problem("dataset.root", f"{root} is not a directory")
            return None
    # the run's own draws (mecsim.run.setup.prepare): the same split, partition and sizes
    rng = np.random.default_rng(np.random.SeedSequence([scenario.seed, 1]))
    try:
        pools = load_dataset(ds.name, ds.root, ds.train_size, ds.test_size, rng)
    except FileNotFoundError as exc:
        found.problem("dataset.root", str(exc))
        return None
    except (ValueError, OSError) as exc:
        found.problem("dataset", str(exc))
        return None
    n = scenario.topology.clients
    if len(pools.train) < n:
        found.problem(
            "topology.clients",
            f"{n} clients, but the train pool has only "
            f"{len(pools.train)} samples (dataset.train_size): every client needs "
            "at least one",
        )
        return pools
    params = ds.partition.model_dump(exclude={"method"})
    draws = params.get("samples_per_client") if ds.partition.method == "iid" else None
    if draws is not None:
        # each client draws its own samples (clients x samples_per_client indices in
        # all): what could go wrong is checked without drawing, so the pre-flight's
        # memory stays linear in the data set (the run's size is bounded by the limits)
        test_draws = params.get("test_samples_per_client") or 1
        for pool, k, what in (
            (pools.train, draws, "samples_per_client"),
            (pools.test, test_draws, "test_samples_per_client"),
        ):
            if k > len(pool):
                found.problem(
                    f"dataset.partition.{what}",
                    f"{k} exceeds the pool's {len(pool)} samples",
                )
        return pools
    try:
        partition(pools, n, ds.partition.method, rng, **params)
    except ValueError as exc:
        found.problem("dataset.partition", str(exc))
    return pools


# ----------------------------------------------------------------------------- model


def check_model_and_memory(
    scenario: Scenario,
    pools: DataPools | None,
    backend: str,
    hosts: int | None,
    address: str | None,
    found: Findings,
) -> tuple[nn.Module, ModelLayout, np.ndarray, TrainConfig] | None:
    """Build the model for the data; check the batch and the step memory. Returns
    (model, layout, init_weights, train config) or None."""
    name, t = scenario.model.name, scenario.training
    in_shape: tuple[int, int, int]
    if pools is not None:
        c, h, w = (int(s) for s in pools.train.images.shape[1:])  # N x C x H x W
        in_shape = (c, h, w)
        num_classes = pools.train.num_classes
    else:
        in_shape, num_classes = dataset_shape(scenario.dataset.name)
    train = TrainConfig(t.epochs, t.batch_size, t.optimizer, t.lr, t.momentum, t.weight_decay)
    with untouched():  # leave the global torch RNG (a run's initial model) alone
        try:
            model = build_model(name, in_shape, num_classes)
            has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
            batch = max(t.batch_size, 2) if has_bn else t.batch_size

            def step_bytes_at(b: int) -> int:
                return step_cost_on_meta(
                    name, in_shape, num_classes, t.optimizer, b, t.lr, t.momentum, t.weight_decay
                ).memory_bytes

            step_bytes = step_bytes_at(batch)
        except Exception as exc:  # a model's own code (a plugin's too): one line, no trace
            shape = "x".join(str(s) for s in in_shape)
            found.problem(
                "model",
                f"{name} cannot train on {scenario.dataset.name}'s "
                f"{shape} images: {str(exc).splitlines()[0] if str(exc) else exc}",
            )
            return None
    layout = model_layout(model)
    if has_bn and t.batch_size < 2:
        found.problem(
            "training.batch_size",
            f"{name} has BatchNorm layers, which cannot "
            "train on a batch of 1: use a batch_size of 2 or more",
        )
    need = f"a training step of {name} at batch {t.batch_size} needs {step_bytes / MiB:,.1f} MiB"
    profiles = device_profiles(scenario)

    def largest_batch(ram: int) -> str:
        """A hint: the largest batch whose step fits ``ram`` (the cost is affine in the
        batch: constant weights and optimiser state, per-sample batch and activations)."""
        with untouched():
            b2, b3 = step_bytes_at(2), step_bytes_at(3)
        fixed, per_sample = b2 - 2 * (b3 - b2), max(b3 - b2, 1)
        fits = (ram - fixed) // per_sample
        return f"batches up to about {fits:,} fit" if fits >= 2 else "no batch fits"

    for profile in sorted(set(scenario.client_profiles())):
        ram = profiles[profile].ram_bytes
        if step_bytes > ram:
            found.problem(
                "training.batch_size",
                f"{need}, more than the {ram / MiB:,.0f} MiB "
                f"of RAM of device profile {profile!r} ({largest_batch(ram)})",
            )
    if not (backend == "ray" and address):  # the hosts train on this machine
        n = scenario.topology.clients
        workers = (
            1
            if backend == "local"
            else max(1, min(hosts or scenario.execution.hosts or os.cpu_count() or 1, n))
        )
        total = psutil.virtual_memory().total
        if step_bytes * workers > total:
            who = "one process" if workers == 1 else f"each of {workers} host processes"
            found.problem(
                "training.batch_size",
                f"{need} in {who}, more than this machine's {total / MiB:,.0f} MiB of RAM",
            )
    with untouched():
        init = get_flat(model, layout)
    return model, layout, init, train


def check_algorithm(
    scenario: Scenario, model, layout, init_weights, train, found: Findings
) -> None:
    """The algorithm's own cross-field checks, then its server and client sides built on
    the real layout (two stand-in clients: what a constructor checks does not depend on
    how many there are)."""

    server_cls, client_cls = algorithm_classes(scenario.algorithm.name)
    params = server_cls.Params(**scenario.algorithm.params)
    own = server_cls.check_scenario(
        params,
        train=train,
        model=model,
        layout=layout,
        clients=scenario.topology.clients,
        participation=scenario.topology.participation,
    )
    for where, message in own:
        found.problem(where, message)
    if own:
        return
    if not server_cls.checkpointable and scenario.checkpoint.every > 0:
        found.problem(
            "checkpoint.every",
            f"algorithm {scenario.algorithm.name!r}: {server_cls.checkpoint_refusal}; "
            "set checkpoint: {every: 0} (a run that stops is then started again, not resumed)",
        )
    try:
        with untouched():
            server_cls(
                layout,
                init_weights,
                {0: 1, 1: 1},
                scenario.topology.participation,
                dict(scenario.algorithm.params),
            )
            client_cls(dict(scenario.algorithm.params))
    except ValueError as exc:
        found.problem("algorithm", str(exc))


# ----------------------------------------------------------------------------- channel


def check_channel(scenario: Scenario, found: Findings) -> None:

    cfg = scenario.channel
    where = "channel"
    if isinstance(cfg, TraceChannelConfig):
        where = "channel.path"
        path = Path(cfg.path).expanduser()
        if not path.exists():
            found.problem(where, f"{path}: no such file")
            return
        if path.is_dir():
            found.problem(where, f"{path} is a directory, not a trace CSV file")
            return
        if not path.is_file():
            found.problem(where, f"{path} is not a regular file")
            return
        if not os.access(path, os.R_OK):
            found.problem(where, f"{path} is not readable")
            return
    try:
        net = NetworkModel(scenario, device_profiles(scenario))
        n = scenario.topology.clients
        # one draw of a round's channel for every client (vectorised; the run's own
        # draws come from other streams of the seed, from the same distributions)
        ch = net.channel.draw_round(
            net.radio, np.arange(n), np.random.default_rng(scenario.seed), time_s=0.0
        )
    except TraceError as exc:  # a mobility trace, read with the network
        found.problem("geometry.mobility.trace", str(exc))
        return
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        found.problem(where, str(exc))
        return
    for direction in ("uplink", "downlink"):
        rates = np.asarray(getattr(ch, f"{direction}_rate_bps"), dtype=float)
        bad = np.flatnonzero(~np.isfinite(rates))
        if bad.size:
            found.problem(
                where,
                f"the {direction} rate of client {int(bad[0])} is not a finite "
                f"number ({rates[bad[0]]}): check the channel's parameters",
            )
