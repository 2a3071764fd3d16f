"""Concurrent downloads: downlink.mode auto time-shares the server's band for algorithms
whose downloads differ per client, keeps the full band for broadcasts, and the full-band
assumption is printed under the tables when a run makes it for personalised downloads."""

from __future__ import annotations

import pytest
from support.scenarios import BUILTIN_ALGORITHMS

from mecsim.agents.algorithms import algorithm_classes
from mecsim.analysis.tables import build_tables, label_runs, load_run
from mecsim.emulation.engine import time_round
from mecsim.emulation.network import NetworkModel, device_profiles, downlink_note
from mecsim.emulation.ops import Download
from mecsim.scenario import scenario_from_dict
from mecsim.store.session import run_in_folder

PERSONALISED = {
    "kapc",
    "kapc_bls",
    "dcpfl",
    "dcpfl_nola",
    "dcpfl_nodc",
    "kmeans_cluster",
    "phsfl",
    "hsfl",
}


def _scenario(algorithm: str, mode: str | None = None, **extra):
    downlink = {} if mode is None else {"mode": mode}
    return scenario_from_dict(
        {
            "algorithm": {"name": algorithm},
            "channel": {"model": "shannon", "downlink": downlink, "interference": None},
            "topology": {"clients": 4},
            **extra,
        },
        "s.yaml",
    )


def test_every_algorithm_declares_its_downloads():
    declared = {
        name for name in BUILTIN_ALGORITHMS if algorithm_classes(name)[0].personalised_downloads
    }
    assert declared == PERSONALISED


@pytest.mark.parametrize("algorithm", BUILTIN_ALGORITHMS)
def test_auto_resolves_by_algorithm(algorithm):
    sc = _scenario(algorithm)
    assert sc.channel.downlink.mode == "auto"  # the default
    expected = "shared" if algorithm in PERSONALISED else "full"
    assert sc.downlink_mode() == expected
    net = NetworkModel(sc, device_profiles(sc))
    assert net.network.downlink_shared is (expected == "shared")
    assert downlink_note(sc) is None  # auto never makes the full-band assumption silently


def test_shared_band_hand_computed():
    """4 personalised downloads of 1 MB: time-shared, the last finishes after the sum of
    the solo times; with the full band each after its own solo time."""
    traces = {c: (Download(1_000_000),) for c in range(4)}
    times = {}
    for mode in ("auto", "full"):
        sc = _scenario("kapc", mode)
        specs, servers, net, _ = NetworkModel(sc, device_profiles(sc)).round(0, [0, 1, 2, 3])
        solo = [8e6 / specs[c].downlink_rate_bps for c in range(4)]
        t = time_round(traces, specs, servers, net)
        times[mode] = t.round_time_s
        if mode == "full":
            assert t.round_time_s == pytest.approx(max(solo), rel=1e-12)
        else:
            # egalitarian sharing from t = 0: the last download ends at sum(solo)
            assert t.round_time_s == pytest.approx(sum(solo), rel=1e-9)
    assert times["auto"] > times["full"]


def test_note_for_personalised_downloads_on_the_full_band():
    note = downlink_note(_scenario("kapc", "full"))
    assert note is not None and "kapc sends each client its own model" in note
    assert "the 4 concurrent downloads each use the whole 50 MHz band" in note
    assert downlink_note(_scenario("fedavg", "full")) is None  # a broadcast: no assumption
    assert downlink_note(_scenario("kapc", "shared")) is None
    fixed = scenario_from_dict(
        {
            "algorithm": {"name": "kapc"},
            "channel": {
                "model": "fixed_rate",
                "uplink": {"rate_bps": 1e6},
                "downlink": {"rate_bps": 1e6},
            },
        },
        "s.yaml",
    )
    assert fixed.downlink_mode() is None and downlink_note(fixed) is None


def test_note_printed_in_summary_and_report(tmp_path):
    sc = _scenario(
        "kapc",
        "full",
        rounds=1,
        seed=1,
        dataset={"train_size": 200, "test_size": 80},
        execution={"backend": "local"},
        metrics={"enabled": False},
    )
    out = tmp_path / "kapc"
    run_in_folder(sc, out)
    note = downlink_note(sc)
    assert note in (out / "summary.md").read_text()
    runs = [load_run(out)]
    label_runs(runs)
    md = build_tables(runs).markdown()
    assert "## Assumptions" in md and note in md
