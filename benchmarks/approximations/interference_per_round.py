"""Geometric interference per round against per instant, on real round timelines
(docs/mobility.md, "Interference from geometry").

mecsim evaluates ``channel.interference: {model: geometric}`` once per round: every
selected client of another co-channel cell is heard for the whole of each upload. This
runs docs/mobility.md's example (21 clients in 7 hexagonal UMi cells of 200 m, per-cell
placement, strongest-site association, FedAvg on MNIST, 10 MHz-30 MHz uplinks at
23-30 dBm) with reuse 1 and 3, and recomputes each round's uploads exactly: between
consecutive events (an upload's start or end) the set of transmitters is fixed, so each
rate is constant and hears only the co-channel clients transmitting then. The uploads
start when the run's timeline says (after download and compute, which the uplink does
not change); the figures are the per-round upload time's relative excess over the
exact one, per client-round (median, max), and the excess of the round's last upload
end, relative to the exact round from its start to that end.

Then the same scenario with ``channel.interference.timing: instant`` (mecsim's own
per-instant solution): each of its client-rounds' upload ends against this script's
exact recomputation (the largest relative difference), and its last upload ends.

    python benchmarks/approximations/interference_per_round.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import yaml

from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.scenario import scenario_from_dict
from mecsim.scenario.loader import default_scenario_path
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder

ROOT = Path(__file__).resolve().parents[2]


def _merge(a: dict, b: dict) -> dict:
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            _merge(a[k], v)
        else:
            a[k] = v
    return a


def docs_example(reuse: int, rounds: int, timing: str = "round") -> dict:
    """The default scenario with docs/mobility.md's first YAML block, geometric
    interference of ``reuse``."""
    base = yaml.safe_load(Path(default_scenario_path()).read_text())
    text = (ROOT / "docs" / "mobility.md").read_text()
    block = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    data = _merge(copy.deepcopy(base), block)
    data["channel"]["interference"] = {"model": "geometric", "reuse": reuse}
    if timing != "round":
        data["channel"]["interference"]["timing"] = timing
    data["rounds"] = rounds
    data.setdefault("execution", {})["backend"] = "local"
    data.setdefault("metrics", {})["enabled"] = False
    return data


def exact_uploads_s(
    start_s: np.ndarray,
    bits: np.ndarray,
    signal_w: np.ndarray,
    cross_w: np.ndarray,
    noise_w: np.ndarray,
    bandwidth_hz: np.ndarray,
) -> np.ndarray:
    """Each upload's end, interference per instant: ``cross_w[j, i]`` is what client j
    puts into client i's site (0 when not co-channel or the same cell)."""
    n = len(bits)
    left = bits.astype(float).copy()
    done = np.full(n, np.inf)
    t = 0.0
    while np.isinf(done).any():
        active = (start_s <= t) & np.isinf(done)
        inter = cross_w[active].sum(axis=0)  # from the clients transmitting now
        rate = bandwidth_hz * np.log2(1.0 + signal_w / (inter + noise_w))
        finish = np.where(active, t + left / rate, np.inf)
        nxt = min(start_s[start_s > t].min(initial=np.inf), finish.min())
        ends = active & (finish == nxt)
        going = active & ~ends
        left[going] *= (finish[going] - nxt) / (finish[going] - t)
        left[ends], done[ends] = 0.0, nxt
        t = nxt
    return done


def measure(
    run_dir: Path, data: dict
) -> tuple[list[float], list[float], list[tuple[float, float]]]:
    """Per client-round and per round relative excess of the per-round upload times, and
    each round's last upload end (s from the round's start): (per round, exact)."""
    sc = scenario_from_dict(data, "interference")
    net = NetworkModel(sc, device_profiles(sc))
    cells = net.cells
    assert cells is not None and cells.groups is not None and cells.path_loss_db is not None
    grp, srv = cells.groups, net.edge_server
    clients = read_csv_exact(run_dir / "clients.csv")
    n0 = 10 ** (sc.channel.noise_psd_dbm_per_hz / 10) / 1000
    per_client, per_round, ends = [], [], []
    for _, rows in clients[clients["selected"].astype(bool)].groupby("round"):
        ids = rows["client_id"].to_numpy(dtype=int)
        start = (rows["start_s"] + rows["download_s"] + rows["compute_s"]).to_numpy()
        up = rows["upload_s"].to_numpy()
        b = rows["bandwidth_hz"].to_numpy()
        noise = n0 * b
        sinr = 10 ** (rows["uplink_snr_db"].to_numpy() / 10)
        signal = sinr * (rows["ul_interference_w"].to_numpy() + noise)
        p_w = 10 ** (rows["tx_power_dbm"].to_numpy() / 10) / 1000
        s = srv[ids]
        co = (grp[s][:, None] == grp[s][None, :]) & (s[:, None] != s[None, :])
        cross = np.where(co, p_w[:, None] * 10 ** (-cells.path_loss_db[ids][:, s] / 10), 0.0)
        bits = up * rows["uplink_rate_bps"].to_numpy()  # what the per-round rate sent
        exact = exact_uploads_s(start, bits, signal, cross, noise, b)
        per_client += list((up - (exact - start)) / (exact - start))
        begin = rows["start_s"].min()  # the round's start: its excess over the exact end
        per_round.append(((start + up).max() - exact.max()) / (exact.max() - begin))
        ends.append(((start + up).max() - begin, exact.max() - begin))
    return per_client, per_round, ends


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round per reuse factor")
    args = ap.parse_args()
    rounds = 1 if args.quick else 3
    out = Path(os.environ.get("MECSIM_BENCH_DIR") or tempfile.mkdtemp(prefix="mecsim-itf-"))
    print(
        f"{'reuse':>5} {'client-rounds':>13} {'median excess':>13} {'max excess':>10} "
        f"{'last upload end, per round / exact (s), each round':>50}"
    )
    for reuse in (1, 3):
        data = docs_example(reuse, rounds)
        run_dir = out / f"interference-reuse{reuse}"
        run_in_folder(scenario_from_dict(data, "interference"), run_dir)
        per_client, _, ends = measure(run_dir, data)
        shown = ", ".join(f"{a:.3f} / {b:.3f}" for a, b in ends)
        print(
            f"{reuse:>5} {len(per_client):>13} {np.median(per_client):>13.2%} "
            f"{max(per_client):>10.2%} {shown:>50}"
        )
        assert min(per_client) >= -1e-9, "per round is never faster than per instant"
        assert all(math.isfinite(x) for x in per_client)
        instant_dir = out / f"interference-reuse{reuse}-instant"
        run_in_folder(scenario_from_dict(docs_example(reuse, rounds, "instant"), "i"), instant_dir)
        worst, last = instant_against_exact(run_dir, instant_dir, data)
        print(
            f"{reuse:>5} timing: instant, upload ends against the exact ones: largest "
            f"relative difference {worst:.2e}; last upload ends "
            + ", ".join(f"{x:.3f}" for x in last)
        )
        assert worst < 1e-9, "mecsim's per-instant uploads are the exact ones"


def instant_against_exact(
    run_dir: Path, instant_dir: Path, data: dict
) -> tuple[float, list[float]]:
    """A ``timing: instant`` run's upload ends (s from each round's start) against the
    exact ones recomputed from the per-round run (the same starts: download and compute
    do not depend on the uplink): the largest relative difference, and each round's last
    upload end of the instant run."""
    sc = scenario_from_dict(data, "interference")
    net = NetworkModel(sc, device_profiles(sc))
    cells = net.cells
    assert cells is not None and cells.groups is not None and cells.path_loss_db is not None
    grp, srv = cells.groups, net.edge_server
    per_round = read_csv_exact(run_dir / "clients.csv")
    instant = read_csv_exact(instant_dir / "clients.csv")
    n0 = 10 ** (sc.channel.noise_psd_dbm_per_hz / 10) / 1000
    worst, last = 0.0, []
    chosen = per_round["selected"].astype(bool)
    for (rnd, rows), (_, inst) in zip(
        per_round[chosen].groupby("round"),
        instant[instant["selected"].astype(bool)].groupby("round"),
        strict=True,
    ):
        assert rows["client_id"].tolist() == inst["client_id"].tolist(), rnd
        ids = rows["client_id"].to_numpy(dtype=int)
        start = (rows["start_s"] + rows["download_s"] + rows["compute_s"]).to_numpy()
        b = rows["bandwidth_hz"].to_numpy()
        noise = n0 * b
        sinr = 10 ** (rows["uplink_snr_db"].to_numpy() / 10)
        signal = sinr * (rows["ul_interference_w"].to_numpy() + noise)
        p_w = 10 ** (rows["tx_power_dbm"].to_numpy() / 10) / 1000
        s = srv[ids]
        co = (grp[s][:, None] == grp[s][None, :]) & (s[:, None] != s[None, :])
        cross = np.where(co, p_w[:, None] * 10 ** (-cells.path_loss_db[ids][:, s] / 10), 0.0)
        bits = rows["upload_s"].to_numpy() * rows["uplink_rate_bps"].to_numpy()
        exact = exact_uploads_s(start, bits, signal, cross, noise, b)
        got = (
            inst["start_s"] + inst["download_s"] + inst["compute_s"] + inst["upload_s"]
        ).to_numpy()
        worst = max(worst, float(np.max(np.abs(got - exact) / (exact - start))))
        last.append(float(got.max() - inst["start_s"].min()))
    return worst, last


if __name__ == "__main__":
    main()
