"""mecsim's transfer times held to ns-3 (docs/validation.md).

Every case of the stored reference (``validation/reference/``: ns-3.37's times) is timed
by mecsim through a scenario file, as ``python -m validation.compare`` does, and held to
the figures the validation states: TCP (point-to-point and shared bottlenecks) median
|error| <= 10 % and each case within 25 %, but for the cases named in
:data:`OUTSIDE_25` (each held to its own measured error, so it cannot drift either);
every 802.11ax cell's last upload within 15 %; the held-out TCP cases
(``reference/tcp_holdout.json``) to the same figures. Needs no ns-3: the reference is
data.

With ns-3 installed, a few cases are also run live in ns-3 (a few seconds) and held to
the same tolerance, so a change to the programs or to ns-3 that moves the reference is
caught too; without it they skip, saying why.
"""

from __future__ import annotations

import json
import statistics
import sys

import pytest
from support.paths import ROOT

if str(ROOT) not in sys.path:  # validation/ is the repository's, not installed
    sys.path.insert(0, str(ROOT))

from validation import compare  # noqa: E402
from validation.ns3 import ns3_available, run  # noqa: E402

#: TCP cases mecsim misses by more than 25 %, with the error measured when the model was
#: fitted (mecsim / ns-3 - 1) and why; each is held within 5 points of it. The grid has
#: none; the held-out cases (never used to adjust a model) have one:
OUTSIDE_25 = {
    # 3 MB at 5 Mb/s, 60 ms each way: FqCoDel's interval (100 ms, its default) is shorter
    # than the 120 ms round trip (RFC 8289 §4.3 asks for the worst-case RTT), so slow
    # start's overshoot (HyStart sees the queue a doubling late: 98 segments for a path of
    # 50) draws drops, a retransmission is dropped again and two timeouts follow. Through
    # a 100-packet FIFO ns-3 takes 5.243 s, mecsim 5.232 s (-0.2 %).
    "3000000B-5M-60ms": -0.297,
}


@pytest.fixture(scope="module")
def rows() -> list[compare.Row]:
    return compare.all_rows()


def _hold(tcp: list[compare.Row]) -> None:
    errors = {r.case: r.error for r in tcp}
    assert statistics.median(abs(e) for e in errors.values()) <= 0.10
    for case, error in errors.items():
        if case in OUTSIDE_25:
            assert abs(error - OUTSIDE_25[case]) <= 0.05, (case, error)
        else:
            assert abs(error) <= 0.25, (case, error)


def test_tcp_times_hold_against_ns3(rows):
    tcp = [r for r in rows if r.kind in ("p2p", "shared") and r.grid == "grid"]
    assert len(tcp) >= 40 and {r.kind for r in tcp} == {"p2p", "shared"}
    assert sum("loss" in r.case for r in tcp) >= 10
    _hold(tcp)


def test_tcp_times_hold_on_the_held_out_cases(rows):
    """Cases the models were never adjusted on (other sizes, rates, delays, losses and
    flow counts: validation/cases.py HOLDOUT) are held to the same figures."""
    held = [r for r in rows if r.kind in ("p2p", "shared") and r.grid == "held-out"]
    assert len(held) >= 15 and {r.kind for r in held} == {"p2p", "shared"}
    assert sum("loss" in r.case for r in held) >= 5
    _hold(held)


#: long round trips through fq_codel that mecsim misses by more than 25 %, with their
#: measured error (docs/validation.md, "Long round trips"): slow start overshoots the path
#: into CoDel's drops, which mecsim's loss-free flow does not model
RTT_OUTSIDE_25 = {
    "1000000B-5M-50ms": -0.300,
    "3000000B-10M-50ms": -0.280,
    "10000000B-50M-50ms": -0.368,
    "1000000B-5M-60ms": -0.353,
    "3000000B-5M-60ms": -0.297,
    "10000000B-5M-60ms": -0.268,
    "10000000B-5M-100ms": -0.276,
    "10000000B-10M-100ms": -0.290,
}


def test_long_round_trips_hold_through_a_fifo_and_are_known_short_through_fq_codel(rows):
    """The long-round-trip set (validation/cases.py RTT_SWEEP) runs every case through a
    deep FIFO and through fq_codel. Through the FIFO, what mecsim's loss-free flow
    assumes, every case is within 2 % but the 10 MB flows at 2 Mb/s (within 11 %);
    through fq_codel the figures docs/validation.md states hold (median |error| 8.9 %,
    the cases of :data:`RTT_OUTSIDE_25` outside 25 %, each within 5 points of its
    measured error), so a model of the AQM that moves them must update the docs and this
    test."""
    rtt = [r for r in rows if r.grid == "rtt"]
    fifo = [r for r in rtt if r.case.endswith("-fifo")]
    codel = [r for r in rtt if not r.case.endswith("-fifo")]
    assert len(fifo) == len(codel) == 90
    for r in fifo:  # 10 MB at 2 Mb/s (40 s) outgrows even the 1,000-packet FIFO and loses
        assert abs(r.error) <= (0.11 if r.case.startswith("10000000B-2M-") else 0.02), r
    errors = {r.case: r.error for r in codel}
    assert abs(statistics.median(abs(e) for e in errors.values()) - 0.089) <= 0.005
    for case, error in errors.items():
        if case in RTT_OUTSIDE_25:
            assert abs(error - RTT_OUTSIDE_25[case]) <= 0.05, (case, error)
        else:
            assert abs(error) <= 0.25, (case, error)


def test_the_slow_start_replica_leaves_slow_start_where_ns3_does():
    """validation/slow_start_replica.py follows a flow's packets as ns-3.37 does (HyStart
    on the smoothed RTT, the first segment ACKed alone) and ends slow start at ns-3's
    window, stored from ns-3's traces (``--write``), on 35 of the 36 paths; the one it
    misses (20 ms, 50 Mb/s: 163 against ns-3's 307) is named so that it cannot hide a
    second."""
    from validation.slow_start_replica import REFERENCE, slow_start_exit

    cases = json.loads(REFERENCE.read_text())["cases"]
    assert len(cases) == 36
    missed = []
    for case in cases:
        ns3 = case["ns3_exit_segments"]
        assert ns3 is not None, case  # through a FIFO no loss comes before HyStart
        mine = slow_start_exit(case["delay_s"], case["rate_bps"]).window
        if abs(mine - ns3) > 1:
            missed.append((case["delay_s"], case["rate_bps"], mine, ns3))
    assert missed == [(0.02, 50e6, 163.0, 307.0)]


def test_single_lossy_transfers_spread_like_ns3s(rows):
    """The expectation is what the engines use; single transfers spread around it. Over
    the lossy point-to-point cases mecsim's sample paths' 90th percentile lies within
    40 % of ns-3's runs' (the 10th percentiles are both near the loss-free time)."""
    lossy = [r for r in rows if r.mecsim_p10_p90_s is not None]
    assert len(lossy) >= 15
    for r in lossy:
        assert r.ns3_p10_p90_s is not None
        ns3_p90, mine_p90 = r.ns3_p10_p90_s[1], r.mecsim_p10_p90_s[1]
        assert abs(mine_p90 / ns3_p90 - 1) <= 0.40, (r.case, ns3_p90, mine_p90)


def test_wifi_cells_last_upload_within_15_percent(rows):
    wifi = [r for r in rows if r.kind == "wifi"]
    assert len(wifi) >= 12
    for r in wifi:
        assert abs(r.error) <= 0.15, (r.case, r.error)
    assert statistics.median(abs(r.error) for r in wifi) <= 0.05


def test_the_reference_is_what_the_docs_table_shows():
    """docs/validation.md's table is this comparison's, case for case."""
    doc = (ROOT / "docs" / "validation.md").read_text()
    for name in ("tcp.json", "tcp_holdout.json", "tcp_rtt.json"):
        tcp = json.loads((compare.REFERENCE / name).read_text())
        for case in tcp["cases"]:
            assert f"| {case['kind']} | {case['id']} |" in doc, case["id"]


#: cases run live in ns-3 by the suite: (case id in the reference, tolerance)
LIVE = ("800040B-10M-20ms", "800040B-100M-20ms", "800040B-100M-20ms-x5")


@pytest.mark.parametrize("case_id", LIVE)
def test_live_ns3_cases_hold(case_id):
    version = ns3_available()
    if version is None:
        pytest.skip("ns-3 is not installed (Debian: apt-get install ns3 libns3-dev g++)")
    tcp = json.loads((compare.REFERENCE / "tcp.json").read_text())
    case = next(c for c in tcp["cases"] if c["id"] == case_id)
    out = run(
        "tcp_flows",
        bytes=case["bytes"],
        rate_bps=case["rate_bps"],
        delay_s=case["delay_s"],
        loss=0.0,
        flows=case["flows"],
        cc="cubic",
        min_rto_s=case["min_rto_s"],
        seed=1,
        run=1,
    )
    flows = [r for r in out if "time_s" in r]
    assert len(flows) == case["flows"]
    ns3_s = max(f["time_s"] for f in flows)
    # nothing random in a loss-free case: ns-3 gives the stored number again
    assert ns3_s == pytest.approx(case["cubic"]["time_s"]["mean"], rel=1e-6)
    mecsim_s = compare.mecsim_time_s(compare.tcp_scenario(case), [case["bytes"]] * case["flows"])
    assert mecsim_s / ns3_s - 1 == pytest.approx(0.0, abs=0.10)
