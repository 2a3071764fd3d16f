"""One actor per edge server: the records of every kind of run equal those of the
in-process run, value for value, and agree with golden records written before the edge
servers were split into actors of their own.

``tests/data/edge_golden/<case>/`` holds rounds.*, clients.*, optraces.jsonl and
summary.md of each case below, as the single-server-actor code wrote them (a hierarchical
PHSFL and HSFL run with 2 edge servers x 2 clients, PHSFL with half the clients selected
so that an edge server sometimes has nobody to aggregate, and two flat FedAvg runs, one of
them on 2 edge servers). Host-measuring columns (wall times, RSS) are not compared.

The golden records were written on another machine, whose CPU may round floats in the
last bits otherwise (numpy and PyTorch pick their kernels by instruction set): they are
compared as :func:`mecsim.testing.assert_records_close` says (counts, ids, bytes and
op-traces exactly, float columns to a stated relative tolerance, learning figures in round
0); the exact,
bit-for-bit comparisons (a resumed run, a run whose actors were killed) are against the
same case run in-process on the same machine.
Regenerate the golden records only on purpose: ``python tests/integration/test_edge_actors.py``
(with the code whose numbers are right).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from support.helpers import interrupted_then_resumed, run_killing_actors  # noqa: E402
from support.paths import DATA
from support.scenarios import tiny  # noqa: E402

from mecsim.store.session import run_in_folder
from mecsim.testing import assert_records_close, assert_same_records

GOLDEN = DATA / "edge_golden"
FILES = (
    "rounds.csv",
    "clients.csv",
    "rounds.parquet",
    "clients.parquet",
    "optraces.jsonl",
    "summary.md",
)

_SPLIT = dict(
    model={"name": "phsfl_cnn"},
    dataset={
        "name": "mnist-embedded",
        "train_size": 200,
        "test_size": 80,
        "partition": {"method": "dirichlet", "alpha": 0.5},
    },
    backhaul={"bandwidth_bps": 1e9, "latency_s": 0.005},
)
_PARAMS = {"edge_rounds": 2, "finetune_steps": 2, "batches_per_epoch": 2}


def case(name: str, **execution):
    """The scenario of golden case ``name`` (``execution`` overrides its backend)."""
    ex = {"backend": "local", "hosts": 2, **execution}
    if name == "phsfl_2x2":  # 2 global rounds of 2 edge rounds, everyone selected
        return tiny(
            rounds=4,
            topology={"clients": 4, "edge_servers": 2},
            algorithm={"name": "phsfl", "params": _PARAMS},
            execution=ex,
            **_SPLIT,
        )
    if name == "phsfl_2x2_half":  # half of the clients per edge round: 3 global rounds
        return tiny(
            rounds=6,
            seed=5,
            topology={"clients": 4, "edge_servers": 2, "participation": 0.5},
            algorithm={"name": "phsfl", "params": _PARAMS},
            evaluation={"every": 2, "clients": "all"},
            execution=ex,
            **_SPLIT,
        )
    if name == "hsfl_2x2":
        return tiny(
            rounds=4,
            topology={"clients": 4, "edge_servers": 2},
            algorithm={"name": "hsfl", "params": _PARAMS},
            execution=ex,
            **_SPLIT,
        )
    if name == "fedavg_flat":
        return tiny(rounds=3, execution=ex)
    if name == "fedavg_2es":  # a flat algorithm on a hierarchical topology
        return tiny(
            rounds=3,
            topology={"clients": 4, "edge_servers": 2, "participation": 0.75},
            execution=ex,
        )
    raise KeyError(name)


CASES = ("phsfl_2x2", "phsfl_2x2_half", "hsfl_2x2", "fedavg_flat", "fedavg_2es")


def _run(name: str, out: Path, **execution) -> Path:
    sc = case(name, **execution)
    run_in_folder(sc, out)
    return out


_REFERENCES: dict[str, Path] = {}


def reference(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Case ``name`` run in-process on this machine (once per test session)."""
    if name not in _REFERENCES:
        _REFERENCES[name] = _run(name, tmp_path_factory.mktemp("reference") / name)
    return _REFERENCES[name]


@pytest.mark.parametrize("name", CASES)
def test_records_agree_with_the_golden_ones(name: str, tmp_path: Path) -> None:
    assert_records_close(GOLDEN / name, _run(name, tmp_path / name))


@pytest.mark.slow
def test_a_second_run_of_a_case_equals_the_first_bit_for_bit(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """What the exact comparisons below rest on: the same case run twice in-process on one
    machine gives the same records (host columns aside)."""
    assert_same_records(
        reference("phsfl_2x2_half", tmp_path_factory), _run("phsfl_2x2_half", tmp_path / "again")
    )


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", [1, 3])
def test_a_run_stopped_mid_global_round_resumes_with_its_edge_models(
    stop_at: int, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Stopped after an odd round (inside a global round of 2 edge rounds, where the next
    round starts from each edge server's own model, not from the global one) and resumed
    from its checkpoint: the records equal those of the uninterrupted run. The checkpoint
    holds one state per edge server."""

    out = interrupted_then_resumed(case("phsfl_2x2_half"), tmp_path, stop_at)
    assert_same_records(reference("phsfl_2x2_half", tmp_path_factory), out)
    last = sorted((out / "checkpoints").glob("round-*.pt"))[-1]
    assert sorted(torch.load(last, weights_only=True)["edges"]) == [0, 1]


def test_only_a_hierarchical_algorithm_has_edge_servers_of_its_own() -> None:
    """The in-process executor drives the same split: PHSFL gets one EdgeServer per edge
    server that serves clients; FedAvg on two edge servers none (its edge servers keep
    no state: its central server does everything, as before)."""
    from mecsim.run.setup import prepare

    phsfl = prepare(case("phsfl_2x2"), "p", None).executor
    assert sorted(phsfl.edges) == [0, 1]
    assert [sorted(e.algorithm.client_samples) for e in phsfl.edges.values()] == [[0, 1], [2, 3]]
    assert prepare(case("fedavg_2es"), "f", None).executor.edges == {}


@pytest.mark.ray
@pytest.mark.slow
def test_each_edge_server_is_an_actor_and_a_killed_one_is_recreated_with_the_records_unchanged(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A hierarchical run under Ray has a central-server actor and one actor per edge
    server, each its own process with no CPU reserved (the hosts hold one each): looked
    at after round 0 of the run below (one start of the actors, not two). One
    edge-server actor is then kill -9'ed after round 1 (its edge model mid-global-round)
    and the central one after round 4: the run recovers from its checkpoints and its
    records equal those of the in-process run."""
    import psutil
    import ray

    seen: dict = {}

    def look(executor) -> None:
        pids = seen["pids"] = executor.actor_pids()
        seen["names"] = {
            p: " ".join(psutil.Process(p).cmdline()) for p in pids["edges"] + pids["server"]
        }
        seen["cpus_used"] = ray.cluster_resources()["CPU"] - ray.available_resources().get("CPU", 0)

    out = run_killing_actors(
        case("phsfl_2x2_half"),
        tmp_path,
        [(1, "EdgeServerActor"), (4, "CentralServerActor")],
        first_round=look,
    )
    edges, central, hosts = (seen["pids"][k] for k in ("edges", "server", "hosts"))
    assert len(edges) == 2 and len(set(edges + central + hosts)) == 2 + 1 + 2
    assert all("ray::EdgeServerActor" in seen["names"][p] for p in edges)
    assert "ray::CentralServerActor" in seen["names"][central[0]]
    assert seen["cpus_used"] == 2  # the two hosts'
    assert_same_records(reference("phsfl_2x2_half", tmp_path_factory), out, ignore=("faults",))


def regenerate() -> None:
    import tempfile

    for name in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            out = _run(name, Path(tmp) / name)
            dest = GOLDEN / name
            dest.mkdir(parents=True, exist_ok=True)
            for f in FILES:
                shutil.copyfile(out / f, dest / f)
        print(f"wrote {GOLDEN / name}")


if __name__ == "__main__":
    regenerate()
