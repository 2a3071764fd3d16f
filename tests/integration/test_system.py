"""End to end: real training on the embedded MNIST data, timed, recorded, exported."""

from __future__ import annotations

import json
import math
import urllib.request

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.paths import ROOT
from support.scenarios import tiny

from mecsim.emulation.ops import op_from_dict
from mecsim.interfaces.cli import main
from mecsim.interfaces.metrics import MetricsExporter
from mecsim.run.loop import run
from mecsim.run.observers import RunObserver
from mecsim.run.rows import CLIENT_COLUMNS, ROUND_COLUMNS, is_host_column
from mecsim.scenario import load_scenario, scenario_from_dict
from mecsim.store.session import run_in_folder


def _emulated(rows):
    return [{k: v for k, v in r.items() if not is_host_column(k)} for r in rows]


def test_records_are_complete_and_consistent(tmp_path):
    sc = tiny(rounds=3)
    out = tmp_path / "run"
    rows = run_in_folder(sc, out).rows
    rounds = pd.read_csv(out / "rounds.csv")
    clients = pd.read_csv(out / "clients.csv")
    assert list(rounds.columns) == ROUND_COLUMNS and list(clients.columns) == CLIENT_COLUMNS
    assert len(rounds) == 3 and rounds["round"].tolist() == [0, 1, 2]
    assert pd.read_parquet(out / "rounds.parquet").equals(rounds)
    assert (out / "summary.md").read_text().count("| fedavg |") == 2
    meta = json.loads((out / "run.json").read_text())
    model_bytes = meta["model_bytes"]
    # FedAvg: every selected client downloads and uploads the whole model
    assert (rounds["bytes_up"] == 4 * model_bytes).all()
    assert (rounds["bytes_down"] == 4 * model_bytes).all()
    # the critical-path split adds up to the round time
    parts = rounds[["dl_time_s", "client_time_s", "ul_time_s", "server_time_s", "idle_time_s"]]
    assert parts.sum(axis=1).to_numpy() == pytest.approx(rounds["round_time_s"].to_numpy())
    assert rounds["elapsed_s"].iloc[-1] == pytest.approx(rounds["round_time_s"].sum())
    # per client-round: time = its own ops; accuracy measured on its own test data
    sel = clients[clients["selected"]]
    assert len(sel) == 12
    own = sel[["download_s", "compute_s", "upload_s"]].sum(axis=1)
    assert own.to_numpy() == pytest.approx((sel["finish_s"] - sel["start_s"]).to_numpy())
    slowest = sel.groupby("round")["finish_s"].max().to_numpy()
    assert slowest == pytest.approx((rounds["round_time_s"] - rounds["server_time_s"]).to_numpy())
    assert rounds["mean_accuracy"].tolist() == pytest.approx(
        clients.groupby("round")["accuracy"].mean().tolist()
    )
    assert 0.2 < rows[-1]["mean_accuracy"] <= 1.0  # it learned something in 3 rounds
    # channel draws are recorded per client-round, within the scenario's ranges
    assert sel["distance_m"].between(100, 500).all()
    assert sel["bandwidth_hz"].between(10e6, 30e6).all()
    # the op-traces replay to the recorded bytes
    traces = [json.loads(line) for line in (out / "optraces.jsonl").read_text().splitlines()]
    assert len(traces) == 3
    ops = [op_from_dict(d) for d in traces[0]["clients"]["0"]]
    assert ops[0].nbytes == model_bytes == ops[-1].nbytes


def test_same_scenario_and_seed_give_identical_records():
    first = run(tiny(rounds=2), "a")
    second = run(tiny(rounds=2), "a")
    assert _emulated(first) == _emulated(second)
    other_seed = run(tiny(rounds=2, seed=4), "a")
    assert _emulated(other_seed) != _emulated(first)


@pytest.mark.slow
@pytest.mark.ray
def test_ray_backend_gives_the_same_records_as_in_process():
    local = run(tiny(rounds=2), "x")
    ray_rows = run(tiny(rounds=2, execution={"backend": "ray", "hosts": 2}), "x")
    assert _emulated(ray_rows) == _emulated(local)


def test_deadline_drops_late_clients_from_aggregation():
    # half the clients on a Pi 2B; the deadline falls between the fast and slow finishers
    base = tiny(
        rounds=1,
        devices={"clients": [{"profile": "rpi2b", "count": 2}, {"profile": "rpi5"}]},
        channel={"model": "fixed_rate", "uplink": {"rate_bps": 1e8}, "downlink": {"rate_bps": 1e8}},
    )
    (free,) = run(base, "d")
    assert free["dropped"] == 0
    data = base.model_dump(mode="json")
    data["deadline_s"] = free["round_time_s"] - free["server_time_s"] - 1e-6
    (late,) = run(scenario_from_dict(data), "d")
    assert late["dropped"] >= 1 and late["completed"] == 4 - late["dropped"]
    assert late["round_time_s"] == pytest.approx(data["deadline_s"] + late["server_time_s"])
    assert late["server_gflops"] < free["server_gflops"]  # fewer updates averaged


def test_model_too_large_for_the_device_is_reported_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "small-ram.yaml"
    data = tiny().model_dump(mode="json")
    data["devices"] = {
        "clients": [{"profile": "tiny"}],
        "profiles": {
            "tiny": {
                "flops_per_s": 1e9,
                "step_overhead_s": 0.01,
                "ram_bytes": 1_000_000,
                "flops_source": "test",
                "step_overhead_source": "test",
            }
        },
    }
    path.write_text(json.dumps(data))
    code = main(["run", str(path), "--out", str(tmp_path / "runs"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(
        f"{path}: training.batch_size: a training step of mlp_2nn at batch 16 needs"
    )
    assert "more than the 1 MiB of RAM of device profile 'tiny'" in err
    assert not (tmp_path / "runs").exists()


class _Scrape(RunObserver):
    """Scrapes the live /metrics endpoint at the end of every round."""

    def __init__(self, exporter: MetricsExporter) -> None:
        self.exporter = exporter
        self.pages: list[str] = []

    def on_round_end(self, info, row, client_rows, traces) -> None:
        with urllib.request.urlopen(self.exporter.url, timeout=5) as resp:
            self.pages.append(resp.read().decode())


def _samples(page: str) -> dict[tuple, float]:
    """{(name, sorted labels without run/algorithm): value} of one scrape."""
    out = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("run", "algorithm")}
            assert s.labels.get("run") == "m" and s.labels.get("algorithm") == "fedavg"
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def test_metrics_endpoint_is_updated_each_round():
    exporter = MetricsExporter("127.0.0.1", 0)
    scrape = _Scrape(exporter)
    rows = run(tiny(rounds=2), "m", None, [exporter, scrape])
    assert len(scrape.pages) == 2
    first, last = _samples(scrape.pages[0]), _samples(scrape.pages[-1])
    assert first[("mecsim_rounds_total", ())] == 1
    assert last[("mecsim_rounds_total", ())] == 2
    assert last[("mecsim_transferred_bytes_total", (("direction", "up"),))] == sum(
        r["bytes_up"] for r in rows
    )
    assert last[("mecsim_emulated_seconds_total", ())] == pytest.approx(rows[-1]["elapsed_s"])
    assert last[("mecsim_round_phase_seconds", (("phase", "upload"),))] == rows[-1]["ul_time_s"]
    assert last[("mecsim_user_accuracy_ratio", (("stat", "mean"),))] == pytest.approx(
        rows[-1]["mean_accuracy"]
    )
    assert last[("mecsim_round_clients", (("status", "selected"),))] == 4


#: Shipped scenarios whose two rounds take seconds, not tens of seconds (ResNet18, 100
#: PHSFL clients, KAPC's five local epochs): the fast tier runs the others. Their smoke
#: runs train on half the pools (every client still holds data: the partitions' minimums
#: hold), so a client's fit is one or two batches rather than two to four; the ResNet18
#: one draws 5 of its 100 clients a round, not 10 (a ResNet18 fit is ~1 s: KAPC's
#: relations are still between several clients).
_HEAVY_SCENARIOS = {
    "kapc-cifar10-system.yaml": {
        "dataset": {"train_size": 1000, "test_size": 250},
        "topology": {"participation": 0.05},
    },
    "phsfl-mnist-4x25.yaml": {"dataset": {"train_size": 1000, "test_size": 500}},
    "kapc-mnist-10.yaml": {"dataset": {"train_size": 3000, "test_size": 500}},
}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name in _HEAVY_SCENARIOS else [])
        for p in sorted((ROOT / "scenarios").glob("*.yaml"))
    ],
)
def test_every_scenario_runs_two_seeded_rounds(path, tmp_path):
    data = load_scenario(path).model_dump(mode="json")
    data.update(rounds=2)
    # one local epoch: the same code paths at a fraction of the CPU (PHSFL 4x25's shipped
    # kappa_0 = 5 took 137 s of the suite for these two rounds; full-scale runs are the
    # benchmarks' and the golden-record tests' business)
    data["training"]["epochs"] = 1
    data["metrics"]["enabled"] = False
    data["execution"]["backend"] = "local"
    for section, values in _HEAVY_SCENARIOS.get(path.name, {}).items():
        data[section].update(values)
    rows = run(scenario_from_dict(data, str(path)), "smoke")
    assert len(rows) == 2
    assert all(r["round_time_s"] > 0 and r["selected"] >= 1 for r in rows)
    assert not math.isnan(rows[-1]["mean_accuracy"])


@pytest.mark.ray
@pytest.mark.slow
def test_cli_default_run_with_ray(tmp_path, capsys):
    code = main(
        ["run", "--rounds", "2", "--out", str(tmp_path), "--run-id", "cli", "--metrics-port", "0"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "Average time per round" in out and "Communication and computation" in out
    assert "U-Comm (s/%)" in (tmp_path / "cli" / "summary.md").read_text()
    assert len(pd.read_csv(tmp_path / "cli" / "rounds.csv")) == 2
    assert main(["run", "--rounds", "2", "--out", str(tmp_path), "--run-id", "cli"]) == 2
