"""mecsim's transfer times held to ns-3 (docs/validation.md).

Every case of the stored reference (``validation/reference/``: ns-3.37's times) is timed
by mecsim through a scenario file, as ``python -m validation.compare`` does, and held to
the figures the validation states: TCP (point-to-point and shared bottlenecks) median
|error| <= 10 % and each case within 25 %; every 802.11ax cell's last upload within
15 %; the held-out TCP cases (``reference/tcp_holdout.json``, and
``reference/tcp_holdout_long.json``, held out from the AQM model: one case outside 25 %,
held at its measured error) to the same figures.
Needs no ns-3: the reference is data.

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


@pytest.fixture(scope="module")
def rows() -> list[compare.Row]:
    return compare.all_rows()


def _hold(tcp: list[compare.Row]) -> None:
    errors = {r.case: r.error for r in tcp}
    assert statistics.median(abs(e) for e in errors.values()) <= 0.10
    for case, error in errors.items():
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


#: cases of HOLDOUT_LONG mecsim misses by more than 25 %, with the error measured when
#: the set was first run (mecsim / ns-3 - 1); each is held within 5 points of it
LONG_OUTSIDE_25 = {
    # 3.3 MB at 48 Mb/s, 30 ms each way: ns-3.37's HyStart (on the smoothed round trip)
    # leaves slow start at 563 segments on a path of 241; CoDel's drops cut the window
    # three times in a row and a timeout follows (NewReno: 0.954 s, -6 %)
    "3300000B-48M-30ms": -0.259,
}


def test_tcp_times_hold_on_the_cases_held_out_from_the_aqm_model(rows):
    """Cases drawn at random (20-150 ms one way; validation/cases.py HOLDOUT_LONG) after
    the AQM model was built on the long round trips, never used to change it: median
    |error| <= 10 %, every case within 25 % but those of :data:`LONG_OUTSIDE_25`."""
    held = [r for r in rows if r.grid == "held-out-long"]
    assert len(held) == 26 and {r.kind for r in held} == {"p2p", "shared"}
    assert statistics.median(abs(r.error) for r in held) <= 0.10
    for r in held:
        if r.case in LONG_OUTSIDE_25:
            assert abs(r.error - LONG_OUTSIDE_25[r.case]) <= 0.05, r
        else:
            assert abs(r.error) <= 0.25, r


def test_long_round_trips_hold_through_fq_codel_and_through_a_fifo(rows):
    """The long-round-trip set (validation/cases.py RTT_SWEEP) runs every case through
    fq_codel (mecsim's ``queue: fq_codel``: the drop after slow start, channel/tcp.py
    item 4) and through a deep FIFO (``queue: fifo``). Through fq_codel: median |error|
    <= 10 % and every case within 25 % (docs/validation.md: 4.5 %, largest 24.1 %);
    through the FIFO every case within 2 % but the 10 MB flows at 2 Mb/s (within 11 %)."""
    rtt = [r for r in rows if r.grid == "rtt"]
    fifo = [r for r in rtt if r.case.endswith("-fifo")]
    codel = [r for r in rtt if not r.case.endswith("-fifo")]
    assert len(fifo) == len(codel) == 90
    for r in fifo:  # 10 MB at 2 Mb/s (40 s) outgrows even the 1,000-packet FIFO and loses
        assert abs(r.error) <= (0.11 if r.case.startswith("10000000B-2M-") else 0.02), r
    errors = {r.case: r.error for r in codel}
    assert statistics.median(abs(e) for e in errors.values()) <= 0.10
    for case, error in errors.items():
        assert abs(error) <= 0.25, (case, error)
    # the AQM's drop is what brings them in: without it (the FIFO's time) the fq_codel
    # cases are short by more, two of them beyond 25 %
    by = {r.case: r for r in rtt}
    assert sum(by[c + "-fifo"].mecsim_s / by[c].ns3_s - 1 < -0.25 for c in errors) == 2


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
    """The grid's cells (validation/wifi_reference.py CELL_CASES, 3 seeds): every last
    upload within 15 %, median <= 10 % (docs/validation.md: 3.9 %, largest 9.4 %, with the
    window-limited flow; 5.4 % and 12.7 % before it, since the reference took Linux's
    delayed-ACK timeout; 2.0 % before that, when ns-3's 200 ms held some stations' ACKs
    past their retransmission timeouts)."""
    wifi = [r for r in rows if r.kind == "wifi" and r.grid == "grid"]
    assert len(wifi) >= 12
    for r in wifi:
        assert abs(r.error) <= 0.15, (r.case, r.error)
    assert statistics.median(abs(r.error) for r in wifi) <= 0.10


def test_held_out_wifi_cells_last_upload_within_15_percent(rows):
    """Cells drawn at random (validation/wifi_reference.py HOLDOUT_CELLS: 2-15 stations,
    20-80 MHz, 200 kB-3 MB each) and run after the Wi-Fi model, never used to change it,
    10 seeds a cell: the same figure. (With 3 seeds, one was +17.2 %: ns-3's own spread,
    tests/integration/test_validation_wifi_holdout2.py.)"""
    held = [r for r in rows if r.kind == "wifi" and r.grid == "held-out"]
    assert len(held) == 8
    assert statistics.median(abs(r.error) for r in held) <= 0.05
    for r in held:
        assert abs(r.error) <= 0.15, (r.case, r.error)


def test_the_reference_is_what_the_docs_table_shows():
    """docs/validation.md's table is this comparison's, case for case."""
    doc = (ROOT / "docs" / "validation.md").read_text()
    for name in ("tcp.json", "tcp_holdout.json", "tcp_rtt.json", "tcp_holdout_long.json"):
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
