"""The third, fourth and fifth draws of 802.11ax cells, with small uploads, held to ns-3.

``validation/reference/wifi_holdout_N.json`` (N = 3, 4, 5): ns-3.37's times over 10 seeds
a cell for the 8 cells of ``HOLDOUT_CELLS_N`` (``python validation/wifi_reference.py
cells-holdout-N``), each drawn from a fixed seed of its own: four cells from the first
held-out sets' distribution (2-15 stations, 200 kB / 800 kB / 3 MB) and four small uploads
(1-3 stations, 200-800 kB). What each is now (docs/validation.md, "Held-out cells"):

- the **third** was run once with the model before the window-limited flow (8 of 8 within
  15 %); that flow as first built put a pair outside (+20.3 %), and its trace gave the rule
  for cell-mates: no longer held out;
- the **fourth** was run once after that rule (6 of 8: two pairs at 80 MHz short by 25.7
  and 21.1 %); their traces gave the ACK train's chance for a station with a cell-mate:
  development data since;
- the **fifth** was run once after that chance was fixed, never used to change it.

Each is held at the figures it has now. Timed by mecsim through scenario files as
``python -m validation.compare`` does. Needs no ns-3; with it, one cell of each is run
live and must give the stored times again.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass

import pytest
from support.paths import ROOT

if str(ROOT) not in sys.path:  # validation/ is the repository's, not installed
    sys.path.insert(0, str(ROOT))

from validation import compare, wifi_reference  # noqa: E402
from validation.ns3 import ns3_available, run  # noqa: E402


@dataclass(frozen=True)
class Draw:
    number: int
    #: the median |error| it has now (held to ±1 point)
    median: float
    #: cells outside 15 %, held at their error (±5 points); none in these draws now
    outside_15: dict[str, float]
    #: the cell run live in ns-3, seed 1: its index in the reference and its name
    live: tuple[int, str]

    @property
    def cells(self) -> list:
        return getattr(wifi_reference, f"HOLDOUT_CELLS_{self.number}")

    @property
    def reference(self) -> dict:
        name = f"wifi_holdout_{self.number}.json"
        return json.loads((compare.REFERENCE / name).read_text())

    @property
    def earlier(self) -> set[str]:
        """The cells of every set drawn before it."""
        sets = [wifi_reference.HOLDOUT_CELLS, wifi_reference.HOLDOUT_CELLS_2]
        sets += [wifi_reference.SMALL_CELLS]
        sets += [getattr(wifi_reference, f"HOLDOUT_CELLS_{n}") for n in range(3, self.number)]
        return {name for cells in sets for name, _ in cells}


DRAWS = [
    # with the ACK train's chance: 3.9 % (largest 7.5 %); with no train for a station
    # with a cell-mate 4.1 % (largest 13.9 %, the pair at 5 and 33 m); when run once,
    # with the model before the window-limited flow, 2.7 % (largest 6.9 %)
    Draw(3, 0.039, {}, (7, "2sta_5-33m_80MHz_472000B")),
    # run once: 7.5 %, 6 of 8; with the chance its traces gave: 5.6 % (largest 8.2 %)
    Draw(4, 0.056, {}, (2, "2sta_14-34m_80MHz_200000B")),
    # run once after the chance was fixed: 2.0 %, 8 of 8 (largest 3.8 %, the pair at 22
    # and 41 m, 80 MHz, 334 kB)
    Draw(5, 0.020, {}, (5, "2sta_22-41m_80MHz_334000B")),
]
IDS = [f"draw{d.number}" for d in DRAWS]


@pytest.mark.parametrize("d", DRAWS, ids=IDS)
def test_the_set_is_its_draw_over_ten_seeds_every_upload_ended(d: Draw):
    """The stored cells are the ones the code draws, with seeds 1-10 of the same program
    (Linux's delayed-ACK timeout), every station's upload received whole."""
    reference = d.reference
    assert reference["seeds"] == list(wifi_reference.HOLDOUT_SEEDS) == list(range(1, 11))
    assert [c["case"] for c in reference["cases"]] == [n for n, _ in d.cells]
    for case, (_, options) in zip(reference["cases"], d.cells, strict=True):
        assert case["options"] == {"bytes": str(wifi_reference.BYTES), **options}
        assert len(case["runs"]) == 10
        for seed, r in enumerate(case["runs"], start=1):
            assert r["summary"]["seed"] == seed
            assert r["summary"]["del_ack_timeout_ms"] == 40.0
            assert r["summary"]["all_done"] is True
            assert all(s["received"] == s["bytes"] for s in r["stations"])


@pytest.mark.parametrize("d", DRAWS, ids=IDS)
def test_the_draw_is_the_first_sets_distribution_and_small_uploads(d: Draw):
    """Four cells of 2-15 stations, 200 kB / 800,040 B / 3 MB, and four of 1-3 stations,
    200-800 kB; the nearest at 5-30 m, the farthest 5-30 m further and at most 60 m
    out; 20/40/80 MHz; no cell of the earlier sets."""
    earlier = d.earlier
    assert len(d.cells) == 8
    for i, (name, o) in enumerate(d.cells):
        assert name not in earlier
        n, nbytes = int(o["stations"]), int(o["bytes"])
        if i < 4:
            assert 2 <= n <= 15 and nbytes in (200_000, 800_040, 3_000_000)
        else:
            assert 1 <= n <= 3 and 200_000 <= nbytes <= 800_000
        if n > 1:
            near, far = int(o["min_m"]), int(o["max_m"])
            assert 5 <= near <= 30 and near + 5 <= far <= min(near + 30, 60)
        assert o["width_mhz"] in ("20", "40", "80")


@pytest.mark.parametrize("d", DRAWS, ids=IDS)
def test_the_draw_is_held_at_its_figures(d: Draw):
    """Every last upload within 15 % of ns-3's 10-seed mean but those named, which are
    held at their errors (±5 points), and the median where it is (±1 point): a change of
    the model that moves them is seen."""
    rows = {r.case: r for r in compare.wifi_rows(d.reference, f"held-out-{d.number}")}
    assert len(rows) == 8
    median = statistics.median(abs(r.error) for r in rows.values())
    assert median == pytest.approx(d.median, abs=0.01)
    for r in rows.values():
        if r.case in d.outside_15:
            assert abs(r.error - d.outside_15[r.case]) <= 0.05, (r.case, r.error)
        else:
            assert abs(r.error) <= 0.15, (r.case, r.error)


@pytest.mark.parametrize("d", DRAWS, ids=IDS)
def test_the_docs_table_shows_every_cell_of_the_draw(d: Draw):
    doc = (ROOT / "docs" / "validation.md").read_text()
    for case in d.reference["cases"]:
        assert f"| wifi | {case['case']} |" in doc, case["case"]


@pytest.mark.parametrize("d", DRAWS, ids=IDS)
def test_live_ns3_cell_gives_the_stored_times(d: Draw):
    """One pair of the draw, seed 1, run again in ns-3: the same times to the microsecond
    (the simulation is deterministic for a seed)."""
    if ns3_available() is None:
        pytest.skip("ns-3 is not installed (Debian: apt-get install ns3 libns3-dev g++)")
    index, name = d.live
    stored = d.reference["cases"][index]
    assert stored["case"] == name
    out = run("wifi_cell", **stored["options"], seed=1)
    times = [s["time_s"] for s in out if "time_s" in s]
    assert times == [s["time_s"] for s in stored["runs"][0]["stations"]]
