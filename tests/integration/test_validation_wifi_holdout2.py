"""802.11ax cells beyond the grid, held to ns-3 (docs/validation.md, "Held-out cells").

Three stored sets, each ns-3.37's times over 10 seeds a cell (``validation/reference/``),
timed by mecsim through scenario files as ``python -m validation.compare`` does:

- ``wifi_holdout.json``: the 8 cells first drawn at random (``HOLDOUT_CELLS``), re-run
  with 10 seeds when 3 seeds' mean put one of them outside 15 %;
- ``wifi_holdout_2.json``: a second draw from the same distribution
  (``HOLDOUT_CELLS_2``), run once after, never used to change a model;
- ``wifi_small.json``: small uploads in 1- and 2-station cells around the cell that
  missed (``SMALL_CELLS``), which say where the model is off, and why (the docs).

Needs no ns-3: the references are data. With ns-3 installed, one cell is also run live
and must give the stored times again.
"""

from __future__ import annotations

import json
import statistics
import sys

import pytest
from support.paths import ROOT

if str(ROOT) not in sys.path:  # validation/ is the repository's, not installed
    sys.path.insert(0, str(ROOT))

from validation import compare, wifi_reference  # noqa: E402
from validation.ns3 import ns3_available, run  # noqa: E402


def _reference(name: str) -> dict:
    return json.loads((compare.REFERENCE / name).read_text())


def _rows(name: str, grid: str) -> dict[str, compare.Row]:
    return {r.case: r for r in compare.wifi_rows(_reference(name), grid)}


@pytest.fixture(scope="module")
def first() -> dict[str, compare.Row]:
    return _rows("wifi_holdout.json", "held-out")


@pytest.fixture(scope="module")
def second() -> dict[str, compare.Row]:
    return _rows("wifi_holdout_2.json", "held-out-2")


@pytest.fixture(scope="module")
def small() -> dict[str, compare.Row]:
    return _rows("wifi_small.json", "small")


#: runs in which one station's TCP connection never opened (its SYN-ACKs reach its MAC,
#: never its TCP), (set, cell, seed): left out of the comparison (validation/compare.py)
NEVER_CONNECTED = {
    ("wifi_holdout.json", "14sta_10-21m_80MHz_200000B", 8),
    ("wifi_holdout_2.json", "14sta_9-32m_20MHz_800040B", 8),
}


@pytest.mark.parametrize(
    ("name", "cases"),
    [
        ("wifi_holdout.json", wifi_reference.HOLDOUT_CELLS),
        ("wifi_holdout_2.json", wifi_reference.HOLDOUT_CELLS_2),
        ("wifi_small.json", wifi_reference.SMALL_CELLS),
    ],
)
def test_each_set_is_its_draw_over_ten_seeds_every_upload_ended(name, cases):
    """The stored cells are the ones the code draws (names and options), each run with
    seeds 1-10 of the same program, every station's upload received whole but in the
    runs of :data:`NEVER_CONNECTED`, where one station received nothing."""
    reference = _reference(name)
    assert reference["seeds"] == list(range(1, 11)) == list(wifi_reference.HOLDOUT_SEEDS)
    assert [c["case"] for c in reference["cases"]] == [n for n, _ in cases]
    for case, (_, options) in zip(reference["cases"], cases, strict=True):
        assert case["options"] == {"bytes": str(wifi_reference.BYTES), **options}
        assert len(case["runs"]) == 10
        for seed, r in enumerate(case["runs"], start=1):
            assert r["summary"]["seed"] == seed
            assert r["summary"]["del_ack_timeout_ms"] == 40.0  # Linux's, not ns-3's 200
            whole = [s["received"] == s["bytes"] for s in r["stations"]]
            if (name, case["case"], seed) in NEVER_CONNECTED:
                assert r["summary"]["all_done"] is False and whole.count(False) == 1
                assert min(s["received"] for s in r["stations"]) == 0
            else:
                assert r["summary"]["all_done"] is True and all(whole)


def test_the_second_draw_is_new_cells_from_the_same_distribution():
    """2-15 stations between a nearest at 5-30 m and a farthest 5-30 m further and at
    most 60 m out, 20/40/80 MHz, 200 kB / 800,040 B / 3 MB, and no cell of the first."""
    first = {n for n, _ in wifi_reference.HOLDOUT_CELLS}
    for name, o in wifi_reference.HOLDOUT_CELLS_2:
        assert name not in first
        n, near, far = int(o["stations"]), int(o["min_m"]), int(o["max_m"])
        assert 2 <= n <= 15 and 5 <= near <= 30 and near + 5 <= far <= min(near + 30, 60)
        assert o["width_mhz"] in ("20", "40", "80")
        assert o["bytes"] in ("200000", "800040", "3000000")


def test_the_first_held_out_set_over_ten_seeds(first):
    """The cell that missed with 3 seeds (2 stations at 18 and 44 m, 40 MHz, 200 kB:
    +17.2 % of a 3-seed mean of 0.0339 s with the model then) is within 15 % of the
    10-seed mean, and so is every other."""
    assert len(first) == 8
    assert statistics.median(abs(r.error) for r in first.values()) <= FIRST_MEDIAN
    for r in first.values():
        assert abs(r.error) <= 0.15, (r.case, r.error)
    cell = first["2sta_18-44m_40MHz_200000B"]
    # ns-3's own spread: the fastest of the 10 seeds is 0.0316 s, the slowest 0.0410 s
    assert cell.ns3_min_s == pytest.approx(0.031590, abs=1e-6)
    assert cell.ns3_max_s == pytest.approx(0.041035, abs=1e-6)
    assert cell.error == pytest.approx(FIRST_TARGET_ERROR, abs=0.005)


#: measured when the sets were run (docs/validation.md: first set 3.0 %, second 4.7 %;
#: with the window-limited flow 2.7 % and 4.9 %); held to the validation's figure for
#: cells, median <= 10 %
FIRST_MEDIAN = SECOND_MEDIAN = 0.10
#: the cell that missed with 3 seeds, against the 10 seeds' mean (0.0352 s): mecsim's
#: 0.0341 s (0.0397 s, +12.8 %, before the window-limited flow; 0.0314 s, -10.8 %, while
#: no station with a cell-mate had an ACK train; now each has it with the chance the
#: medium is idle as its ACKs come back)
FIRST_TARGET_ERROR = -0.031


def test_the_second_draw_is_held_to_15_percent(second):
    """Drawn and run once after the first set's re-run, the model unchanged: every last
    upload within 15 % (docs/validation.md: median 4.7 %, largest 9.0 %)."""
    assert len(second) == 8
    assert statistics.median(abs(r.error) for r in second.values()) <= SECOND_MEDIAN
    for r in second.values():
        assert abs(r.error) <= 0.15, (r.case, r.error)


#: small uploads mecsim misses by more than 15 %, the error measured with the ACK
#: train's chance for a station with a cell-mate (mecsim / ns-3's mean over 10 seeds -
#: 1); each would be held within 5 points of it. None since: before the window-limited
#: flow 8 of 30 were outside, by up to 43 %; with it and no train for a station with a
#: cell-mate, 2 (the pair at 5 and 12 m, 80 MHz: -33.9 and -33.0 %), now -4.9 and +1.0 %
#: (docs/validation.md)
SMALL_OUTSIDE_15: dict[str, float] = {}
#: the largest small upload's |error| now (the pair at 5 and 12 m, 40 MHz, 200 kB,
#: +13.5 %), and the median (4.9 %), each held within a point
SMALL_LARGEST, SMALL_MEDIAN = 0.135, 0.049


def test_small_uploads_are_off_where_the_docs_say(small):
    """The model's gap on small uploads (docs/validation.md, "What is left"), held at
    its measured errors (±5 points) so that a change that moves them, or a new case
    outside 15 %, is seen: every cell within 15 % since a station with a cell-mate has
    the ACK train with the chance the medium is idle as its ACKs come back (the pair of
    fast stations at 80 MHz, where one of them at times leaves slow start at about 20
    segments in ns-3, was short by 33-34 % without it)."""
    assert len(small) == 30
    errors = [abs(r.error) for r in small.values()]
    assert max(errors) == pytest.approx(SMALL_LARGEST, abs=0.01)
    assert statistics.median(errors) == pytest.approx(SMALL_MEDIAN, abs=0.01)
    for r in small.values():
        if r.case in SMALL_OUTSIDE_15:
            assert abs(r.error - SMALL_OUTSIDE_15[r.case]) <= 0.05, (r.case, r.error)
        else:
            assert abs(r.error) <= 0.15, (r.case, r.error)


def test_the_docs_table_shows_every_stored_cell():
    doc = (ROOT / "docs" / "validation.md").read_text()
    for name in ("wifi_holdout.json", "wifi_holdout_2.json", "wifi_small.json"):
        for case in _reference(name)["cases"]:
            assert f"| wifi | {case['case']} |" in doc, case["case"]


def test_live_ns3_cell_gives_the_stored_times():
    """The cell that missed, seed 4 (three collided A-MPDUs, the slowest of the 10), run
    again in ns-3: the same times to the microsecond (the simulation is deterministic
    for a seed)."""
    if ns3_available() is None:
        pytest.skip("ns-3 is not installed (Debian: apt-get install ns3 libns3-dev g++)")
    stored = _reference("wifi_holdout.json")["cases"][0]
    assert stored["case"] == "2sta_18-44m_40MHz_200000B"
    out = run("wifi_cell", **stored["options"], seed=4)
    times = [s["time_s"] for s in out if "time_s" in s]
    assert times == [s["time_s"] for s in stored["runs"][3]["stations"]]
