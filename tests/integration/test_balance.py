"""Evening out the hosts' work: a round's clients lent to other hosts give the same
records as training every client on its own host."""

from __future__ import annotations

import numpy as np
import pytest
from support.scenarios import tiny

from mecsim.agents.algorithms import ClientTask, algorithm_classes
from mecsim.agents.host import ClientHost
from mecsim.run.backends.balance import balance_hosts
from mecsim.run.round import run_round
from mecsim.run.setup import prepare


def _tasks(ids):
    return [ClientTask(c, None, 0) for c in ids]


def _ids(groups):
    return {h: [t.client_id for t in ts] for h, ts in groups.items()}


def test_balance_hosts_by_hand():
    equal = {c: 2 for c in range(10)}
    # 6 clients on host 0, 2 on host 1: two move (the lowest ids of equals), 4 and 4
    got = balance_hosts({0: _tasks([0, 2, 4, 6, 8, 9]), 1: _tasks([1, 3])}, equal, 2)
    assert _ids(got) == {0: [4, 6, 8, 9], 1: [0, 1, 2, 3]}
    # already even (5 and 4: a move would not shorten the longer): nothing moves
    even = {0: _tasks([0, 2, 4, 6, 8]), 1: _tasks([1, 3, 5, 7])}
    assert _ids(balance_hosts(even, equal, 2)) == _ids(even)
    # unequal work: host 0 has 10 + 1 + 1, host 1 nothing, host 2 has 4; gap 12 -> the
    # client nearest half of it (10? 10 < 12 but |6 - 10| = 4 > |6 - 1| = 5? no: 4 < 5)
    work = {0: 10, 1: 1, 2: 1, 3: 4}
    got = balance_hosts({0: _tasks([0, 1, 2]), 2: _tasks([3])}, work, 3)
    loads = {h: sum(work[t.client_id] for t in ts) for h, ts in got.items()}
    # 10 moved to host 1 (12 - 0 gap), then 1 + 1 on host 0 and 4 on host 2 stay
    assert _ids(got) == {0: [1, 2], 1: [0], 2: [3]} and max(loads.values()) == 10
    # one client much larger than the rest never ping-pongs: it stays where it is
    assert _ids(balance_hosts({0: _tasks([0])}, {0: 5}, 2)) == {0: [0]}
    assert balance_hosts({}, equal, 2) == {}


@pytest.mark.parametrize("seed", range(20))
def test_balance_hosts_never_lengthens_the_longest_and_keeps_every_task(seed):
    rng = np.random.default_rng(seed)
    n_hosts = int(rng.integers(1, 5))
    ids = sorted(rng.choice(200, size=int(rng.integers(0, 40)), replace=False).tolist())
    work = {c: int(rng.integers(1, 30)) for c in range(200)}
    groups: dict[int, list[ClientTask]] = {}
    for c in ids:
        groups.setdefault(int(rng.integers(0, n_hosts)), []).append(ClientTask(c, None, 0))
    got = balance_hosts(groups, work, n_hosts)
    assert sorted(t.client_id for ts in got.values() for t in ts) == ids
    assert all(ts == sorted(ts, key=lambda t: t.client_id) for ts in got.values())

    def longest(gs):
        return max((sum(work[t.client_id] for t in ts) for ts in gs.values()), default=0)

    assert longest(got) <= longest(groups)
    # no single move from the busiest to the least busy host would shorten it further
    loads = [sum(work[t.client_id] for t in got.get(h, [])) for h in range(n_hosts)]
    hi, lo = int(np.argmax(loads)), int(np.argmin(loads))
    assert not any(0 < work[t.client_id] < loads[hi] - loads[lo] for t in got.get(hi, []))


def _records(scenario, rounds, monkeypatch, movable: bool | None = None):
    lent: list[dict] = []
    real_fit = ClientHost.fit

    def fit(self, rnd, tasks, lost=frozenset(), guests=None):
        lent.append(dict(guests or {}))
        return real_fit(self, rnd, tasks, lost, guests)

    monkeypatch.setattr(ClientHost, "fit", fit)
    rs = prepare(scenario, "b", None, backend="local", hosts=3)
    if movable is not None:
        rs.executor.clients.movable = movable
    try:
        rows, elapsed = [], 0.0
        for rnd in range(rounds):
            row, clients, _ = run_round(rs, rnd, elapsed)
            elapsed = row["elapsed_s"]
            rows.append(
                (
                    {
                        k: v
                        for k, v in row.items()
                        if not k.startswith("host_") and k != "server_rss_mb"
                    },
                    [{k: v for k, v in c.items() if not k.startswith("host_")} for c in clients],
                )
            )
        weights = rs.executor.server.algorithm.weights.copy()
    finally:
        rs.executor.close()
        monkeypatch.setattr(ClientHost, "fit", real_fit)
    return rows, weights, [g for g in lent if g]


@pytest.mark.parametrize("stream", ["auto", "off"])
def test_clients_lent_to_other_hosts_give_the_same_records_and_model(monkeypatch, stream):
    """FedAvg, 12 clients of unequal sizes on 3 hosts, half of them a round: lent clients
    (there are some) change no record and not one bit of the model."""
    sc = tiny(
        topology={"clients": 12, "participation": 0.5},
        dataset={"partition": {"method": "dirichlet", "alpha": 0.5}},
        execution={"stream_aggregation": stream},
    )
    lent_rows, lent_w, lent = _records(sc, 4, monkeypatch)
    home_rows, home_w, none = _records(sc, 4, monkeypatch, movable=False)
    assert lent and not none
    assert lent_rows == home_rows
    assert lent_w.tobytes() == home_w.tobytes()


def test_only_clients_that_keep_no_state_are_lent(monkeypatch):
    assert algorithm_classes("fedavg")[1].movable()
    for name in ("fedprox", "kmeans_cluster", "mtfl", "kapc", "dcpfl", "local", "perfedavg"):
        assert not algorithm_classes(name)[1].movable(), name
    sc = tiny(
        topology={"clients": 12, "participation": 0.5},
        algorithm={"name": "fedprox", "params": {"mu": 0.01}},
    )
    _, _, lent = _records(sc, 2, monkeypatch)
    assert lent == []


def test_a_guest_that_leaves_state_behind_stops_the_run(monkeypatch):
    prepared = prepare(tiny(topology={"clients": 4}), "t", None, backend="local", hosts=2)
    _, setup, pools, host_clients = prepared.executor._args
    host = ClientHost(setup, pools, host_clients[0])
    real_fit = type(host.algorithm).fit

    def keeps(self, ctx, task):
        ctx.state["weights"] = np.zeros(3)
        return real_fit(self, ctx, task)

    monkeypatch.setattr(type(host.algorithm), "fit", keeps)
    guest = next(iter(host_clients[1]))
    _, tasks = prepared.executor.plan(0)
    task = next(t for t in tasks if t.client_id == guest)
    with pytest.raises(RuntimeError, match=f"client {guest} .* left state behind"):
        host.fit(0, [task], guests={guest: host_clients[1][guest]})
    assert guest not in host.state  # nothing of it kept


@pytest.mark.ray
@pytest.mark.slow
def test_lent_clients_under_ray_give_the_records_of_the_in_process_run():
    """The same lending under Ray (guests' data sent with the call, uploads through the
    shared files) as in-process: the same records."""
    from mecsim.run.loop import run

    sc = tiny(
        topology={"clients": 12, "participation": 0.5},
        dataset={"partition": {"method": "dirichlet", "alpha": 0.5}},
    )
    local = run(sc, "x", None, [], backend="local", hosts=2)
    ray_rows = run(sc, "x", None, [], backend="ray", hosts=2)

    def strip(rows):
        return [
            {k: v for k, v in r.items() if not k.startswith("host_") and k != "server_rss_mb"}
            for r in rows
        ]

    assert strip(local) == strip(ray_rows)
