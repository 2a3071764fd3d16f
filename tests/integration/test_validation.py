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

ROOT = ROOT
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
    for name in ("tcp.json", "tcp_holdout.json"):
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
