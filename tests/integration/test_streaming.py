"""Streamed aggregation: uploads folded into the aggregate while the clients train give the
same bits as holding them all until the round is timed."""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.scenarios import tiny

from mecsim.agents.algorithms import ClientResult, fedavg
from mecsim.agents.algorithms.fedavg import WeightedSum
from mecsim.agents.models import build_model, get_flat, model_layout
from mecsim.agents.server import CentralServer
from mecsim.run.backends import (
    actors,
    balance,
    local,
    ray_executor,
    shared_model,
    shared_uploads,
)
from mecsim.run.round import run_round
from mecsim.run.setup import prepare, streams_aggregation
from mecsim.scenario import scenario_from_dict
from mecsim.store.session import run_in_folder
from mecsim.testing import SimulatedKill, StopAfter, assert_same_records, resume_run


def test_weighted_sum_hand_numbers_and_parts_give_the_same_bits():
    acc = WeightedSum()
    acc.add(np.array([1.0, 2.0], dtype=np.float32), 1)
    acc.add(np.array([3.0, 4.0], dtype=np.float32), 3)
    # (1*1 + 3*3) / 4 = 2.5, (1*2 + 3*4) / 4 = 3.5
    assert acc.result().tolist() == [2.5, 3.5] and acc.result().dtype == np.float32
    rng = np.random.default_rng(0)
    vectors = [rng.normal(size=1000).astype(np.float32) for _ in range(50)]
    counts = rng.integers(1, 600, size=50)
    whole, parts = WeightedSum(), WeightedSum()
    for v, n in zip(vectors, counts, strict=True):
        whole.add(v, n)
    for lo in range(0, 50, 7):  # the same order, fed in parts of 7
        for v, n in zip(vectors[lo : lo + 7], counts[lo : lo + 7], strict=True):
            parts.add(v, n)
    assert whole.result().tobytes() == parts.result().tobytes()
    # against an independent formula: numpy's weighted mean in float64
    expected = np.average(np.stack(vectors).astype(np.float64), axis=0, weights=counts)
    assert whole.result() == pytest.approx(expected.astype(np.float32), rel=1e-6, abs=1e-7)
    with pytest.raises(ValueError, match="nothing to average"):
        WeightedSum().result()


@pytest.mark.parametrize(
    "block,threads,path",
    [(3, 1, "numpy"), (3, 3, "numpy"), (64, 2, "numpy"), (65_536, 2, "numpy")]
    + [(65_536, 1, "torch"), (65_536, 2, "torch")],
)
def test_add_many_gives_the_bits_of_adding_one_by_one_and_leaves_out_non_finite(
    block, threads, path, monkeypatch
):
    """add_many (numpy: block by block, each vector read once, blocks shared among
    threads; torch: vector by vector, on threads) equals add() of the same vectors in the
    same order, bit for bit; a vector with NaN or inf is left out, its position returned,
    and the sum is that of the others (to the bit, too)."""

    monkeypatch.setattr(fedavg, "FOLD_BLOCK_ELEMENTS", block)
    monkeypatch.setattr(fedavg, "FOLD_THREADS", threads)
    if path == "numpy":
        monkeypatch.setattr(fedavg, "_exact_products", lambda *_: False)
    else:
        real = fedavg._add_whole
        calls: list[int] = []
        monkeypatch.setattr(fedavg, "_add_whole", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(3)
    vectors = [
        (rng.normal(size=1000) * 10.0 ** rng.integers(-3, 4)).astype(np.float32) for _ in range(12)
    ]
    counts = [int(n) for n in rng.integers(1, 2**20, size=12)]
    one, many = WeightedSum(), WeightedSum()
    for v, n in zip(vectors[:5], counts[:5], strict=True):
        one.add(v, n)
    assert many.add_many(vectors[:5], counts[:5]) == []
    bad = [v.copy() for v in vectors[5:]]
    bad[1][999] = np.nan
    bad[4][0] = -np.inf
    bad[5][500] = np.inf
    assert many.add_many(bad, counts[5:]) == [1, 4, 5]
    for i, (v, n) in enumerate(zip(bad, counts[5:], strict=True)):
        if i not in (1, 4, 5):
            one.add(v, n)
    assert many.count == one.count == 9 and many.total == one.total
    assert many.sum.tobytes() == one.sum.tobytes()
    assert many.result().tobytes() == one.result().tobytes()
    assert many.add_many([], []) == []
    with pytest.raises(ValueError, match="different sizes"):
        many.add_many([np.zeros(3, dtype=np.float32)], [1])
    if path == "torch":
        assert len(calls) == 3  # two parts, the second one again without the bad three


def _numpy_fold(vectors: list[np.ndarray], weights: list[float], parts: int) -> np.ndarray:
    """The float64 sum by the numpy path (the blocks), fed in ``parts`` calls."""
    total = np.zeros(vectors[0].size, dtype=np.float64)
    step = max(1, -(-len(vectors) // parts))
    for lo in range(0, len(vectors), step):
        fedavg_blocks(total, vectors[lo : lo + step], weights[lo : lo + step])
    return total


def fedavg_blocks(total: np.ndarray, vectors: list[np.ndarray], weights: list[float]) -> None:
    with pytest.MonkeyPatch.context() as mp:  # the block path whatever the weights
        mp.setattr(fedavg, "_exact_products", lambda *_: False)
        WeightedSum._add_blocks(total, vectors, weights)


_F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.lists(
        st.tuples(
            st.lists(_F32, min_size=7, max_size=7),
            st.integers(0, fedavg.EXACT_WEIGHT_LIMIT - 1),
        ),
        min_size=1,
        max_size=9,
    ),
    parts=st.integers(1, 3),
)
def test_the_torch_fold_gives_the_bits_of_the_numpy_fold(data, parts) -> None:
    """Integer weights and float32 vectors (any finite values: huge, tiny, subnormal,
    signed zeros) take the torch path; its float64 sum has the bits of the numpy block
    path's, fed in the same parts, because every product n_k * w_k is exact."""
    vectors = [np.array(v, dtype=np.float32) for v, _ in data]
    weights = [n for _, n in data]
    assert fedavg._exact_products(vectors, weights)
    fast = WeightedSum()
    step = max(1, -(-len(vectors) // parts))
    for lo in range(0, len(vectors), step):
        assert fast.add_many(vectors[lo : lo + step], weights[lo : lo + step]) == []
    slow = _numpy_fold(vectors, weights, parts)
    assert fast.sum is not None and fast.sum.tobytes() == slow.tobytes()


def test_weights_or_vectors_whose_products_may_round_take_the_numpy_path() -> None:
    """The torch path only where a fused multiply-add cannot change a bit; its torch
    thread count is put back."""
    v32, v64 = np.ones(3, dtype=np.float32), np.ones(3, dtype=np.float64)
    assert fedavg._exact_products([v32, v32], [3, np.int64(2**29 - 1)])
    assert fedavg._exact_products([v32], [7.0])
    assert not fedavg._exact_products([v32], [0.5])  # not an integer
    assert not fedavg._exact_products([v32], [2**29])  # 24 + 30 bits: may round
    assert not fedavg._exact_products([v32], [float("nan")])
    assert not fedavg._exact_products([v64], [3])  # a float64 upload: 53 + 2 bits
    threads = torch.get_num_threads()
    rng = np.random.default_rng(5)
    vectors = [rng.normal(size=100).astype(np.float32) for _ in range(4)]
    weights = [0.3, 1.7, 2.5, 0.1]
    acc, one = WeightedSum(), WeightedSum()
    acc.add_many(vectors, weights)
    for v, w in zip(vectors, weights, strict=True):
        one.add(v, w)
    assert acc.sum is not None and one.sum is not None
    assert acc.sum.tobytes() == one.sum.tobytes()
    acc.add_many(vectors, [1, 2, 3, 4])
    assert torch.get_num_threads() == threads


def _server() -> tuple[CentralServer, int]:
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    layout = model_layout(model)
    samples = {c: 10 + c for c in range(9)}
    return CentralServer(
        "fedavg", layout, get_flat(model, layout), samples, 1.0, {}, seed=0
    ), layout.size


def _results(size: int) -> list[ClientResult]:
    rng = np.random.default_rng(1)
    out = []
    for c in range(9):
        w = rng.normal(size=size).astype(np.float32)
        if c == 4:
            w[17] = np.nan  # a diverged client: rejected either way
        out.append(
            ClientResult(
                client_id=c,
                weights=w,
                upload_nbytes=w.nbytes,
                num_samples=10 + c,
                train_loss=0.0,
                trace=[],
                flops=0.0,
                steps=1,
                peak_memory_bytes=0,
            )
        )
    return out


def test_the_server_s_streamed_aggregate_equals_the_held_one_bit_for_bit():
    held, size = _server()
    report = held.aggregate(0, [r for r in _results(size) if r.client_id != 7])
    streamed, _ = _server()
    results = _results(size)
    keep = frozenset(range(9)) - {7}  # client 7 dropped out: trained, not aggregated
    streamed.stream_begin(0)
    for lo in (0, 4, 8):
        assert streamed.stream_fold(0, keep, results[lo : lo + 4]) == len(
            keep.intersection(range(lo, lo + 4)) - {4}
        )
    assert all(r.weights is None for r in results)  # each upload let go once folded
    got = streamed.stream_end(0)
    assert got.rejected == report.rejected == (4,)
    assert got.flops == report.flops == 2.0 * size * 7 + size  # 7 folded, one division
    assert streamed.algorithm.weights.tobytes() == held.algorithm.weights.tobytes()
    # parts out of client-id order, or a fold without a begun stream, are refused
    streamed.stream_begin(1)
    streamed.stream_fold(1, keep, _results(size)[5:6])
    with pytest.raises(RuntimeError, match="out of client-id order"):
        streamed.stream_fold(1, keep, _results(size)[2:3])
    with pytest.raises(RuntimeError, match="no streamed aggregation"):
        streamed.stream_end(2)


def test_which_scenarios_stream():
    assert streams_aggregation(tiny())
    assert streams_aggregation(tiny(algorithm={"name": "fedprox"}))
    assert not streams_aggregation(tiny(execution={"stream_aggregation": "off"}))
    assert not streams_aggregation(tiny(deadline_s=5.0))
    assert not streams_aggregation(tiny(faults={"wait_for_fraction": 0.5}))
    assert not streams_aggregation(
        tiny(faults={"link_outages": [{"start_s": 1.0, "duration_s": 2.0}]})
    )
    assert streams_aggregation(tiny(faults={"crash_prob": 0.3, "dropout_prob": 0.3}))
    assert not streams_aggregation(tiny(algorithm={"name": "kapc"}))
    # k-means clustering subclasses FedAvg's server but aggregates per cluster itself
    assert streams_aggregation(tiny(algorithm={"name": "perfedavg"}))
    assert not streams_aggregation(tiny(algorithm={"name": "kmeans_cluster"}))


def _run(scenario, rounds: int):
    rs = prepare(scenario, "s", None)
    try:
        rows, elapsed = [], 0.0
        for rnd in range(rounds):
            row, clients, _ = run_round(rs, rnd, elapsed)
            elapsed = row["elapsed_s"]
            rows.append((row, clients))
        weights = (
            rs.executor.server.algorithm.weights.copy()
            if isinstance(rs.executor, local.LocalExecutor)
            and not isinstance(rs.executor, ray_executor.RayExecutor)
            else None
        )
        return rs.streams, rows, weights
    finally:
        rs.executor.close()


_HOST = {"host_wall_s", "host_train_wall_s", "host_aggregate_s", "server_rss_mb", "host_train_s"}


def _emulated(rows):
    return [
        (
            {k: v for k, v in r.items() if k not in _HOST},
            [{k: v for k, v in c.items() if k not in _HOST} for c in cs],
        )
        for r, cs in rows
    ]


def _tasks(n: int):
    from mecsim.agents.algorithms import ClientTask

    return [ClientTask(c, None, 0) for c in reversed(range(n))]


def _many_clients(**over):
    # 12 clients in parts of 5 (5 + 5 + 2), crashes and drop-outs among them
    return tiny(topology={"clients": 12}, faults={"crash_prob": 0.2, "dropout_prob": 0.2}, **over)


def test_a_streamed_run_gives_the_held_run_s_records_and_model(monkeypatch):
    monkeypatch.setattr(balance, "STREAM_PART_CLIENTS", 5)
    assert [len(p) for p in balance.stream_parts(_tasks(12))] == [5, 5, 2]
    streamed, s_rows, s_weights = _run(_many_clients(), 3)
    held, h_rows, h_weights = _run(_many_clients(execution={"stream_aggregation": "off"}), 3)
    assert streamed and not held
    statuses = {c["status"] for _, cs in s_rows for c in cs}
    assert {"completed", "crashed", "dropped_out"} <= statuses  # the faults did happen
    assert _emulated(s_rows) == _emulated(h_rows)
    assert s_weights.tobytes() == h_weights.tobytes()


def test_a_streamed_round_the_timing_contradicts_stops_the_run():
    # a deadline drops the slow clients: forced to stream anyway, the run must refuse to
    # finish an aggregate that holds them
    base = tiny(
        rounds=1,
        devices={"clients": [{"profile": "rpi2b", "count": 2}, {"profile": "rpi5"}]},
        channel={"model": "fixed_rate", "uplink": {"rate_bps": 1e8}, "downlink": {"rate_bps": 1e8}},
    )
    _, ((free, _),), _ = _run(base, 1)
    data = base.model_dump(mode="json")
    data["deadline_s"] = free["round_time_s"] - free["server_time_s"] - 1e-6
    rs = prepare(scenario_from_dict(data), "s", None)
    try:
        assert not rs.streams
        rs.streams = True
        with pytest.raises(RuntimeError, match="stream_aggregation: off"):
            run_round(rs, 0, 0.0)
    finally:
        rs.executor.close()


def _shared_maps(executor) -> dict[str, Any]:
    """The shared files (uploads, the model's board) the actor processes have mapped
    ("host": any host, "server", and "each host": one set per host), from
    /proc/<pid>/maps (the server removes an upload file's name once it has mapped it)."""

    pids = executor.actor_pids()
    out: dict[str, Any] = {"host": set(), "server": set(), "each host": []}
    for role, key in (("host", "hosts"), ("server", "server")):
        for pid in pids[key]:
            with open(f"/proc/{pid}/maps") as fh:
                mine = {
                    line.split()[5]
                    for line in fh
                    if shared_uploads.PREFIX in line and len(line.split()) > 5
                }
            out[role] |= mine
            if role == "host":
                out["each host"].append(mine)
    return out


def _shared_files(prefix: str | None) -> list[str]:

    return [] if prefix is None else [p.name for p in shared_uploads.SHM_DIR.glob(f"{prefix}*")]


@functools.cache
def _held_in_process_rows():
    """The records the Ray runs below must give: the held run on two in-process hosts
    (records do not depend on the backend; computed once, not once per case)."""
    held, rows, _ = _run(
        _many_clients(execution={"backend": "local", "hosts": 2, "stream_aggregation": "off"}), 3
    )
    assert not held
    return _emulated(rows)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize(
    "hold_uploads_bytes,shared",
    [(actors.HOLD_UPLOADS_BYTES, True), (actors.HOLD_UPLOADS_BYTES, False), (0, True)],
)
def test_a_streamed_ray_run_gives_the_held_run_s_records(monkeypatch, hold_uploads_bytes, shared):
    """Under Ray, streamed and held, with a host call's uploads written into the host's
    shared-memory file (the default on one node), handed over together through the
    object store, or each put in the object store as its client finishes (a call too
    large to hold: forced here with a limit of 0 bytes). Parts of 5 clients: a round's
    third part writes the slot of its first again. The shared files are there while the
    run goes (mapped by the host that writes and the server that reads them), and
    gone when it ends or its actors restart."""
    monkeypatch.setattr(balance, "STREAM_PART_CLIENTS", 5)
    monkeypatch.setattr(actors, "HOLD_UPLOADS_BYTES", hold_uploads_bytes)
    monkeypatch.setattr(ray_executor, "SHARED_UPLOADS", shared)
    ray_exec = {"backend": "ray", "hosts": 2}
    seen: list[dict[str, set[str]]] = []
    prefixes: list[str | None] = []
    real_run_round = run_round

    def watched(rs, rnd, elapsed):
        out = real_run_round(rs, rnd, elapsed)
        prefixes.append(rs.executor._uploads_prefix)
        seen.append(
            {**_shared_maps(rs.executor), "named": set(_shared_files(rs.executor._uploads_prefix))}
        )
        if rnd == 0:  # actors restarted (as after a death): new files, the old ones gone
            old = rs.executor._uploads_prefix
            st = rs.executor.state()
            rs.executor.restart()
            rs.executor.load_state(st)
            assert _shared_files(old) == []
        return out

    monkeypatch.setattr(sys.modules[__name__], "run_round", watched)
    streamed, s_rows, _ = _run(_many_clients(execution=ray_exec), 3)
    monkeypatch.setattr(sys.modules[__name__], "run_round", real_run_round)
    assert streamed
    assert _emulated(s_rows) == _held_in_process_rows()

    for maps, prefix in zip(seen, prefixes, strict=True):
        # the global model's board: made by the server, mapped by both hosts, named
        # until the executor removes it (on a restart, or when the run ends)
        board = {p for p in maps["server"] if p.endswith(f"-{shared_model.NAME}")}
        if shared:
            assert len(board) == 1 and all(board <= each for each in maps["each host"])
            assert len(maps["each host"]) == 2
            assert maps["named"] == {f"{prefix}{shared_model.NAME}"}
        else:
            assert board == set()
        if shared and hold_uploads_bytes:
            # both hosts' upload files, each mapped by its host and the server, which
            # has removed their names once it had them mapped
            assert len(maps["host"] - board) == 2 and maps["server"] == maps["host"]
        else:
            assert maps["host"] == maps["server"] == board
    if shared:
        assert len(set(prefixes)) == 2  # one per start of the actors
    assert all(_shared_files(p) == [] for p in prefixes)  # no file left when it ended


@pytest.mark.parametrize(
    "algorithm,in_place",
    [
        ({"name": "fedavg"}, True),
        ({"name": "fedprox", "params": {"mu": 0.01, "eval_model": "local"}}, False),
    ],
)
def test_a_host_actor_s_held_uploads_are_the_in_process_host_s(monkeypatch, algorithm, in_place):
    """The host actor's class, run in this process: its held uploads (one UploadRows)
    are, bit for bit, what the in-process host hands over; FedAvg writes them straight
    into the buffer's rows (get_flat's ``out``), FedProx, which keeps its weights as its
    local model, is given no row and its kept weights are not the buffer's."""
    import gc

    from mecsim.agents.algorithms import fedavg
    from mecsim.agents.host import ClientHost

    prepared = prepare(
        tiny(topology={"clients": 6}, algorithm=algorithm), "t", None, backend="local", hosts=1
    )
    _, setup, pools, host_clients = prepared.executor._args
    _, tasks = prepared.executor.plan(0)
    plain = ClientHost(setup, pools, host_clients[0])
    try:
        actor = actors.ClientHostActor(setup, pools, host_clients[0])
    finally:
        gc.unfreeze()  # the actor's set-up froze this process's heap
    outs = []
    real_get_flat = fedavg.get_flat
    monkeypatch.setattr(
        fedavg,
        "get_flat",
        lambda m, layout, out=None: (outs.append(out), real_get_flat(m, layout, out=out))[1],
    )
    _, expected = plain.fit_split(0, tasks)
    outs.clear()
    _, held = actor.fit_split(0, tasks)
    assert isinstance(held, actors.UploadRows) and len(tasks) == 6
    got = dict(held.items())
    assert sorted(got) == sorted(expected)
    for cid, w in expected.items():
        assert np.array_equal(got[cid], w) and got[cid].tobytes() == w.tobytes()
    rows = actor._upload_rows
    if in_place:
        assert len(outs) == 6 and all(o is not None and o.base is rows for o in outs)
    else:
        assert outs == [None] * 6
        kept = [actor.state[t.client_id]["weights"] for t in tasks]
        assert all(k.base is not rows and not np.shares_memory(k, rows) for k in kept)
        assert all(np.array_equal(k, got[t.client_id]) for k, t in zip(kept, tasks, strict=True))


@pytest.mark.parametrize(
    "algorithm",
    [{"name": "fedavg"}, {"name": "fedprox", "params": {"mu": 0.01, "eval_model": "local"}}],
)
def test_a_host_actor_s_shared_uploads_are_the_in_process_host_s(tmp_path, algorithm):
    """With a shared slot, the host actor's uploads stay in its shared file (FedAvg
    writes them there, FedProx's are copied in) and only their place is returned: read
    back through a fresh read-only mapping they are, bit for bit, what the in-process
    host hands over; the next call's other slot leaves them as they were."""
    import gc

    from mecsim.agents.host import ClientHost

    prepared = prepare(
        tiny(topology={"clients": 6}, algorithm=algorithm), "t", None, backend="local", hosts=1
    )
    _, setup, pools, host_clients = prepared.executor._args
    _, tasks = prepared.executor.plan(0)
    plain = ClientHost(setup, pools, host_clients[0])
    path = tmp_path / "uploads-0"
    try:
        actor = actors.ClientHostActor(setup, pools, host_clients[0], uploads_path=str(path))
    finally:
        gc.unfreeze()  # the actor's set-up froze this process's heap
    _, expected = plain.fit_split(0, tasks)
    _, first = actor.fit_split(0, tasks, shared_slot=1)
    assert isinstance(first, shared_uploads.SharedUploadRows) and first.path == str(path)
    assert first.offset == actor._arena.slot_bytes  # slot 1
    got = dict(first.items())
    assert sorted(got) == sorted(expected)
    for cid, w in expected.items():
        assert got[cid].tobytes() == w.tobytes() and not got[cid].flags.writeable
    _, later = plain.fit_split(1, tasks)
    _, second = actor.fit_split(1, tasks, shared_slot=0)
    assert second.offset == 0
    assert {c: w.tobytes() for c, w in second.items()} == {c: w.tobytes() for c, w in later.items()}
    assert {c: w.tobytes() for c, w in first.items()} == {
        c: w.tobytes() for c, w in expected.items()
    }  # slot 1 untouched
    # without a slot, the object-store path (one array)
    _, plain_rows = actor.fit_split(2, tasks)
    assert isinstance(plain_rows, actors.UploadRows)


def test_the_global_model_on_the_shared_board_is_the_server_s_model(tmp_path, caplog):
    """The central server's plan with a board: every task names round r's slot (r % 2)
    of the shared file and, read back through a fresh read-only mapping, it is the
    model the in-process server hands out, bit for bit; the next round's model goes to
    the other slot and leaves it as it was. Tasks with a model each (a personalised
    algorithm) are not put on the board; a board that cannot be made is given up with a
    warning (the object store is used), and one for models of another size with a line
    at INFO level (that is expected of an algorithm uploading part of the model)."""
    import gc

    prepared = prepare(tiny(topology={"clients": 6}), "t", None, backend="local", hosts=1)
    server_kwargs = prepared.executor._args[0]
    plain = CentralServer(**server_kwargs)
    try:
        actor = actors.CentralServerActor(**server_kwargs)
    finally:
        gc.unfreeze()  # the actor's set-up froze this process's heap
    board = tmp_path / "model"
    assert actor.open_board(str(board), len(plain.algorithm.weights))
    got_selected, tasks = actor.plan_by_reference(0, on_board=True)
    selected, expected, _ = plain.plan(0)
    assert got_selected == selected and len(tasks) == len(expected) > 0
    where = {t.weights for t in tasks}
    assert len(where) == 1 and next(iter(where)).offset == 0  # slot 0
    resolved = actors._resolve_weights(tasks)
    for t, e in zip(resolved, expected, strict=True):
        assert t.client_id == e.client_id and t.weights.tobytes() == e.weights.tobytes()
        assert not t.weights.flags.writeable
    first = resolved[0].weights.copy()
    # a new global model (as after an aggregation) goes to slot 1
    actor.algorithm.weights = plain.algorithm.weights = first * 0.5
    _, tasks1 = actor.plan_by_reference(1, on_board=True)
    assert tasks1[0].weights.offset == actor._board.slot_bytes
    assert (
        actors._resolve_weights(tasks1)[0].weights.tobytes()
        == plain.plan(1)[1][0].weights.tobytes()
        == (first * 0.5).tobytes()
    )
    assert resolved[0].weights.tobytes() == first.tobytes()  # slot 0 untouched
    # a model per task: not on the board
    own = [replace(t, weights=first.copy()) for t in plain.plan(2)[1]]
    assert actor._on_board(2, own) is None and not actor._board_failed
    # a model of another size (an algorithm that uploads part of the model): said once at
    # INFO level as expected, not warned, and the board given up
    other_size = [replace(t, weights=first[:-1].copy()) for t in plain.plan(2)[1]]
    other_size = [replace(t, weights=other_size[0].weights) for t in other_size]
    with caplog.at_level("INFO"):
        assert actor._on_board(2, other_size) is None
    assert "object store" in caplog.text and actor._board_failed
    assert all(r.levelname == "INFO" for r in caplog.records), caplog.records
    caplog.clear()
    # a board that cannot be made: a warning, and the plans keep to the object store
    other = actors.CentralServerActor.__new__(actors.CentralServerActor)
    with caplog.at_level("WARNING"):
        assert not other.open_board(str(tmp_path / "missing" / "model"), 10)
    assert "object store" in caplog.text and other._board is None


def test_a_host_without_a_usable_shared_file_uses_the_object_store(tmp_path, caplog):
    import gc

    prepared = prepare(tiny(topology={"clients": 3}), "t", None, backend="local", hosts=1)
    _, setup, pools, host_clients = prepared.executor._args
    _, tasks = prepared.executor.plan(0)
    try:
        actor = actors.ClientHostActor(
            setup, pools, host_clients[0], uploads_path=str(tmp_path / "missing" / "f")
        )
    finally:
        gc.unfreeze()
    with caplog.at_level("WARNING"):
        _, rows = actor.fit_split(0, tasks, shared_slot=0)
    assert isinstance(rows, actors.UploadRows) and len(rows.client_ids) == 3
    assert "object store" in caplog.text and actor.uploads_path is None


def test_shared_upload_files_slots_and_clean_up(tmp_path, monkeypatch):
    """Slots are disjoint and bounded; a driver's files go when it closes them, and a
    dead driver's are removed by the next one, a live one's kept."""
    import subprocess

    monkeypatch.setattr(shared_uploads, "SHM_DIR", tmp_path)
    arena = shared_uploads.UploadArena(tmp_path / "a", slot_bytes=1000)
    assert arena.slot_bytes % 4096 == 0 and arena.slot_bytes >= 1000
    a, b = arena.rows(0, 2, 100), arena.rows(1, 2, 100)
    a[...] = 1.0
    b[...] = 2.0
    assert a.sum() == 200.0 and b.sum() == 400.0
    with pytest.raises(ValueError, match="do not fit"):
        arena.rows(0, 20, 100)
    with pytest.raises(ValueError, match="slot 2"):
        arena.rows(2, 1, 1)
    with pytest.raises(FileExistsError):  # never two writers on one file
        shared_uploads.UploadArena(tmp_path / "a", slot_bytes=1000)
    view = shared_uploads.SharedUploadRows(str(tmp_path / "a"), arena.offset(1), [7, 3], 100)
    assert [(c, float(r.sum())) for c, r in view.items()] == [(7, 200.0), (3, 200.0)]

    proc = subprocess.Popen(["sleep", "0"])  # its pid: a driver that has exited
    proc.wait()
    here = shared_uploads._machine()
    mine = shared_uploads.executor_prefix("t0")
    dead = f"{shared_uploads.PREFIX}{here}-{proc.pid}-t1-0"
    elsewhere = f"{shared_uploads.PREFIX}othermachine-{proc.pid}-t2-0"
    for name in (f"{mine}0", dead, elsewhere):
        (tmp_path / name).write_bytes(b"x")
    with monkeypatch.context() as m:  # files of another user are never touched
        other_uid = os.getuid() + 1
        m.setattr(shared_uploads.os, "getuid", lambda: other_uid)
        shared_uploads.remove_stale()
        shared_uploads.remove(mine)
    assert {f"{mine}0", dead, elsewhere} <= {p.name for p in tmp_path.iterdir()}
    shared_uploads.remove_stale()
    names = {p.name for p in tmp_path.iterdir()}
    assert f"{mine}0" in names and elsewhere in names and dead not in names
    shared_uploads.remove(mine)
    assert f"{mine}0" not in {p.name for p in tmp_path.iterdir()}


def test_a_host_whose_shared_file_gets_no_memory_falls_back_to_the_object_store(
    tmp_path, monkeypatch, caplog
):
    """A full /dev/shm (a container's 64 MB): reserving the rows' memory fails with
    ENOSPC, and the host hands its uploads over through the object store instead of
    writing to pages nothing backs (SIGBUS)."""
    import errno
    import gc

    prepared = prepare(tiny(topology={"clients": 3}), "t", None, backend="local", hosts=1)
    _, setup, pools, host_clients = prepared.executor._args
    _, tasks = prepared.executor.plan(0)
    try:
        actor = actors.ClientHostActor(
            setup, pools, host_clients[0], uploads_path=str(tmp_path / "u")
        )
    finally:
        gc.unfreeze()

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with caplog.at_level("WARNING"):
        _, rows = actor.fit_split(0, tasks, shared_slot=0)
    assert isinstance(rows, actors.UploadRows) and len(rows.client_ids) == 3
    assert "No space left" in caplog.text and actor.uploads_path is None


@pytest.mark.ray
@pytest.mark.slow
def test_rounds_planned_ahead_under_ray_give_the_in_process_records_and_resume_the_same(
    tmp_path, monkeypatch
):
    """The server plans the next round while the driver times the one that ends, only
    when nothing else reaches the server in between: not after a round that evaluates
    (every 3rd here) or is followed by a checkpoint (every 4th). The records are the
    in-process run's (which plans nothing ahead) bit for bit, half the clients drawn
    each round, for a run killed after round 4 and resumed from its checkpoint, and for
    a run whose rounds are aggregated after the timing (not streamed); and a server call
    other than that plan refuses to run after it."""

    def scenario(backend: str, stream: str = "auto"):
        return tiny(
            rounds=6,
            topology={"clients": 12, "participation": 0.5},
            faults={"crash_prob": 0.2, "dropout_prob": 0.2},
            evaluation={"every": 3},
            checkpoint={"every": 4, "keep": 2},
            execution={"backend": backend, "hosts": 2, "stream_aggregation": stream},
        )

    ahead: list[int] = []
    chains: list[bool] = []
    real_plan_ahead = ray_executor.RayExecutor.plan_ahead

    def plan_ahead(self, rnd, chain=False):
        ahead.append(rnd)
        chains.append(chain)
        real_plan_ahead(self, rnd, chain)

    monkeypatch.setattr(ray_executor.RayExecutor, "plan_ahead", plan_ahead)
    local = tmp_path / "local"
    run_in_folder(scenario("local"), local)
    cut = tmp_path / "cut" / "r"
    with pytest.raises(SimulatedKill):  # at the end of round 4, before its checkpoint
        run_in_folder(scenario("ray"), cut, observers=[StopAfter(4)])
    assert resume_run(cut) == 4  # from the checkpoint after round 3
    # round 0 -> 1, 1 -> 2; round 2 evaluates, a checkpoint follows round 3; 4 -> 5
    # (before the kill), and 4 -> 5 again in the resumed run
    assert ahead == [1, 2, 5, 5]
    assert not any(chains)  # faults may be drawn: the hosts wait for the driver
    assert_same_records(local, cut)
    # held rounds (aggregated after the timing) are planned ahead after the aggregate;
    # and once the run's rounds are done, on its executor before it closes (not on a
    # fourth executor of its own, whose start is most of this test's time): a round
    # planned ahead, and no other server call runs after it
    refused: list[str] = []
    real_close = ray_executor.RayExecutor.close

    def close_after_a_plan_ahead(self):
        if not refused:
            self.plan_ahead(6)
            for what, call in (
                ("a checkpoint after round 6 was planned", self.state),
                ("an evaluation after round 6 was planned", lambda: self.evaluate(6, [0])),
                ("round 7 planned, but round 6", lambda: self.plan(7)),
            ):
                with pytest.raises(RuntimeError, match=what):
                    call()
                refused.append(what)
        real_close(self)

    monkeypatch.setattr(ray_executor.RayExecutor, "close", close_after_a_plan_ahead)
    held = tmp_path / "held"
    run_in_folder(scenario("ray", stream="off"), held)
    assert len(refused) == 3
    assert ahead == [1, 2, 5, 5, 1, 2, 5, 6]
    assert_same_records(local, held)


@pytest.mark.ray
@pytest.mark.slow
def test_chained_rounds_under_ray_give_the_in_process_records_and_resume_the_same(
    tmp_path, monkeypatch
):
    """With no fault to draw, a round's hosts start on the server's plan while the round
    before is still being timed and recorded (RayExecutor.plan_ahead with chain): 9 of 12
    clients drawn each round, in parts of 5 (the first part chained, the second
    submitted by the driver), two hosts that lend each other clients; a round after one
    that evaluates (every 3rd) or is followed by a checkpoint (every 4th) is not chained.
    The records are the in-process run's bit for bit, also for a run killed after round
    4 (its round 5 already started on the hosts) and resumed from its checkpoint."""
    monkeypatch.setattr(balance, "STREAM_PART_CLIENTS", 5)

    def scenario(backend: str):
        return tiny(
            rounds=7,
            topology={"clients": 12, "participation": 0.75},
            evaluation={"every": 3},
            checkpoint={"every": 4, "keep": 2},
            execution={"backend": backend, "hosts": 2},
        )

    chained: list[int] = []
    taken: list[int] = []
    real_submit = ray_executor.RayExecutor._submit_chained
    real_fit = ray_executor.RayExecutor._fit_streamed

    def submit(self, rnd, plan):
        chained.append(rnd)
        return real_submit(self, rnd, plan)

    def fit_streamed(self, rnd, tasks, lost, fold):
        before = self.chained_rounds
        out = real_fit(self, rnd, tasks, lost, fold)
        if self.chained_rounds > before:
            taken.append(rnd)
        return out

    monkeypatch.setattr(ray_executor.RayExecutor, "_submit_chained", submit)
    monkeypatch.setattr(ray_executor.RayExecutor, "_fit_streamed", fit_streamed)
    local = tmp_path / "local"
    run_in_folder(scenario("local"), local)
    whole = tmp_path / "whole"
    run_in_folder(scenario("ray"), whole)
    # rounds 2 and 5 evaluate, a checkpoint follows round 3, round 6 is the last
    assert chained == taken == [1, 2, 5]
    assert_same_records(local, whole)
    cut = tmp_path / "cut" / "r"
    with pytest.raises(SimulatedKill):  # at the end of round 4, round 5 on the hosts
        run_in_folder(scenario("ray"), cut, observers=[StopAfter(4)])
    assert chained == [1, 2, 5, 1, 2, 5] and taken == [1, 2, 5, 1, 2]
    assert resume_run(cut) == 4  # from the checkpoint after round 3
    assert chained[6:] == taken[5:] == [5]
    assert_same_records(local, cut)
