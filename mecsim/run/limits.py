"""What a run may cost before it is accepted: rounds, clients, training steps, hosts.

A scenario's cost is known before anything starts: ``rounds`` rounds, each training the
selected clients (``participation`` x ``clients``) for ``epochs`` local epochs of
ceil(samples per client / ``batch_size``) steps. :func:`estimate` works it out from the
scenario alone (no data is read) and :func:`check` compares it with a :class:`Limits`,
one problem per limit passed, naming the scenario field and the limit's flag.

Two sets of defaults:

- :data:`SERVICE` — what ``mecsim serve`` accepts unless its operator says otherwise
  (``--max-rounds``, ``--max-clients``, ``--max-steps``, ``--max-hosts-per-core``,
  ``--max-sweep-points``): sized for a shared lab machine, where one submission must not
  hold the only worker for days;
- :data:`LOCAL` — what ``mecsim run`` accepts: generous (a typo such as ``epochs:
  1000000000`` is caught, a paper-length run is not), lifted with ``--no-limits``.

The samples per client are estimated as the partition draws them: ``samples_per_client``
when the partition sets it, else the train pool (``dataset.train_size``, or the data
set's own train size) divided evenly among the clients.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from mecsim.scenario import Scenario

#: Train pool sizes of the data sets when ``dataset.train_size`` is not given.
TRAIN_POOL = {
    "mnist-embedded": 8_000,
    "mnist-embedded-3x32": 8_000,
    "mnist": 60_000,
    "fashion-mnist": 60_000,
    "cifar10": 50_000,
    "cifar100": 50_000,
}

#: SQLite's integers (the service's store) are signed 64-bit: no limit may exceed this.
MAX_INTEGER = 2**63 - 1


@dataclass(frozen=True)
class Limits:
    """Upper bounds on one run (None: no bound)."""

    max_rounds: int | None
    max_clients: int | None
    #: training steps (mini-batches) of the whole run, over every client
    max_steps: int | None
    #: ``execution.hosts`` at most this many times the machine's cores
    max_hosts_per_core: float | None
    #: points of one what-if sweep (the product of its grid's value counts)
    max_sweep_points: int | None
    #: samples the clients hold in all (clients x samples per client): with the IID
    #: partition's ``samples_per_client`` each client draws its own (8 bytes of index each)
    max_client_samples: int | None = None

    def lifted(self) -> Limits:
        return replace(
            self,
            max_rounds=None,
            max_clients=None,
            max_steps=None,
            max_hosts_per_core=None,
            max_sweep_points=None,
            max_client_samples=None,
        )


SERVICE = Limits(
    max_rounds=10_000,
    max_clients=100_000,
    max_steps=20_000_000,
    max_hosts_per_core=4.0,
    max_sweep_points=1_000,
    max_client_samples=50_000_000,
)
LOCAL = Limits(
    max_rounds=1_000_000,
    max_clients=1_000_000,
    max_steps=10_000_000_000,
    max_hosts_per_core=16.0,
    max_sweep_points=1_000_000,
    max_client_samples=1_000_000_000,
)


@dataclass(frozen=True)
class Cost:
    """A run's size, from its scenario alone."""

    rounds: int
    clients: int
    clients_per_round: int
    samples_per_client: int
    steps_per_client_round: int
    steps: int  # rounds x clients per round x steps per client-round
    hosts: int


def samples_per_client(sc: Scenario) -> int:
    part = sc.dataset.partition
    fixed = getattr(part, "samples_per_client", None)
    if fixed is not None:
        return int(fixed)
    pool = sc.dataset.train_size or TRAIN_POOL.get(sc.dataset.name, 60_000)
    return max(1, math.ceil(pool / sc.topology.clients))


def _param(sc: Scenario, name: str) -> int:
    value = sc.algorithm.params.get(name)
    return int(value) if isinstance(value, (int, float)) and value > 0 else 0


def estimate(sc: Scenario, cores: int | None = None) -> Cost:
    """The run's rounds, clients, training steps and hosts (Python integers: exact).

    A client-round's steps are ``epochs`` x its batches (PHSFL's ``batches_per_epoch``
    when set, else ceil(samples / ``batch_size``)), plus the steps algorithms take besides
    (PHSFL's ``finetune_steps``, KAPC's ``relation_steps``)."""
    per_round = sc.clients_per_round()
    samples = samples_per_client(sc)
    batches = _param(sc, "batches_per_epoch") or math.ceil(samples / sc.training.batch_size)
    steps_per = (
        sc.training.epochs * batches + _param(sc, "finetune_steps") + _param(sc, "relation_steps")
    )
    cores = cores or os.cpu_count() or 1
    hosts = sc.execution.hosts or cores
    return Cost(
        rounds=sc.rounds,
        clients=sc.topology.clients,
        clients_per_round=per_round,
        samples_per_client=samples,
        steps_per_client_round=steps_per,
        steps=sc.rounds * per_round * steps_per,
        hosts=hosts,
    )


def check(
    sc: Scenario, limits: Limits, *, flag_prefix: str = "--", cores: int | None = None
) -> list[tuple[str, str]]:
    """``(field, message)`` for every limit the scenario passes; empty when it fits."""
    cost = estimate(sc, cores)
    cores = cores or os.cpu_count() or 1
    out: list[tuple[str, str]] = []

    def cap(limit: int | None) -> int:
        return min(limit if limit is not None else MAX_INTEGER, MAX_INTEGER)

    batches = _param(sc, "batches_per_epoch") or math.ceil(
        cost.samples_per_client / sc.training.batch_size
    )
    for field, value, limit, what, name in (
        ("rounds", cost.rounds, limits.max_rounds, "rounds", "max-rounds"),
        ("topology.clients", cost.clients, limits.max_clients, "clients", "max-clients"),
    ):
        if value > cap(limit):
            out.append(
                (
                    field,
                    f"{value:,} {what} is above the limit of {cap(limit):,} ({flag_prefix}{name})",
                )
            )
    test_each = getattr(sc.dataset.partition, "test_samples_per_client", None) or 0
    held = cost.clients * (cost.samples_per_client + test_each)
    if held > cap(limits.max_client_samples):
        out.append(
            (
                "dataset.partition.samples_per_client",
                f"the clients would hold {held:,} samples ({cost.clients:,} clients x "
                f"{cost.samples_per_client + test_each:,}, train and test), above the limit "
                f"of {cap(limits.max_client_samples):,} ({flag_prefix}max-client-samples)",
            )
        )
    if cost.steps > cap(limits.max_steps):
        out.append(
            (
                "training.epochs",
                f"the run would train {cost.steps:,} steps ({cost.rounds:,} rounds x "
                f"{cost.clients_per_round:,} clients x {sc.training.epochs:,} epochs x "
                f"{batches:,} batches), above the limit of {cap(limits.max_steps):,} "
                f"({flag_prefix}max-steps)",
            )
        )
    if (
        limits.max_hosts_per_core is not None
        and sc.execution.hosts is not None
        and sc.execution.hosts > limits.max_hosts_per_core * cores
    ):
        most = int(limits.max_hosts_per_core * cores)
        out.append(
            (
                "execution.hosts",
                f"{sc.execution.hosts:,} host processes on {cores} cores is above the limit "
                f"of {most:,} ({limits.max_hosts_per_core:g} per core, "
                f"{flag_prefix}max-hosts-per-core)",
            )
        )
    return out


def check_sweep_points(
    points: int, limits: Limits, bound_by: str = "--max-sweep-points"
) -> str | None:
    """The problem with a sweep of ``points`` grid points, or None (``bound_by`` names
    what sets the limit in the message)."""
    if limits.max_sweep_points is not None and points > limits.max_sweep_points:
        return (
            f"the grid has {points:,} points, above the limit of "
            f"{limits.max_sweep_points:,} ({bound_by})"
        )
    return None
