"""`mecsim report`: the papers' tables from hand-made records (exact numbers), figures."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread
from support.scenarios import tiny

from mecsim.analysis.plots import PLOT_NAMES, PlotWriter
from mecsim.analysis.tables import (
    ReportError,
    build_tables,
    convergence_round,
    from_rows,
    label_runs,
    load_run,
)
from mecsim.interfaces.cli import main
from mecsim.run.rows import CLIENT_COLUMNS, ROUND_COLUMNS
from mecsim.store.session import run_in_folder

MiB = 2**20
NAN = float("nan")

# (round_time, dl, client, ul, server, idle, elapsed, MiB up, MiB down, client GFLOPs,
#  server GFLOPs, server RSS MB, client peak MiB, mean accuracy)
RUN_A = [  # "fedavg": 4 rounds, every round evaluated
    (10, 2, 5, 3, 0, 0, 10, 1, 2, 4, 0.5, 100, 10, 0.50),
    (12, 2, 6, 3, 1, 0, 22, 1, 2, 4, 0.5, 120, 12, 0.70),
    (8, 1, 4, 2, 1, 0, 30, 3, 2, 2, 0.5, 110, 11, 0.795),
    (10, 2, 5, 2, 1, 0, 40, 3, 2, 2, 0.5, 90, 9, 0.80),
]
RUN_B = [  # "local": no communication, round 2 not evaluated, round 2 idles 2 s
    (4, 0, 4, 0, 0, 0, 4, 0, 0, 2, 0.0, 50, 5, 0.60),
    (6, 0, 4, 0, 0, 2, 10, 0, 0, 2, 0.0, 50, 5, NAN),
    (5, 0, 5, 0, 0, 0, 15, 0, 0, 2, 0.0, 50, 5, 0.60),
]


def _write_run(path: Path, run_id: str, algorithm: str, table, client_acc) -> Path:
    """rounds.csv / clients.csv laid out as RecordsWriter writes them."""
    path.mkdir(parents=True)
    with (path / "rounds.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROUND_COLUMNS, restval="")
        w.writeheader()
        for i, (t, dl, cl, ul, sv, idle, el, up, down, cg, sg, rss, peak, acc) in enumerate(table):
            w.writerow(
                {
                    "run_id": run_id,
                    "round": i,
                    "algorithm": algorithm,
                    "selected": 2,
                    "completed": 2,
                    "dropped": 0,
                    "round_time_s": t,
                    "dl_time_s": dl,
                    "client_time_s": cl,
                    "ul_time_s": ul,
                    "server_time_s": sv,
                    "idle_time_s": idle,
                    "elapsed_s": el,
                    "bytes_up": up * MiB,
                    "bytes_down": down * MiB,
                    "client_gflops": cg,
                    "server_gflops": sg,
                    "server_rss_mb": rss,
                    "client_peak_mb": peak,
                    # run A: 5 J per emulated second of the round; run B: none
                    # (records without energy)
                    "energy_j": 5 * t if algorithm == "fedavg" else "",
                    # its parts: 40 % compute, 20 % radio, 30 % idle, 10 % asleep
                    **{
                        f"energy_{part}_j": share * t if algorithm == "fedavg" else ""
                        for part, share in (
                            ("compute", 2),
                            ("radio", 1),
                            ("idle", 1.5),
                            ("sleep", 0.5),
                        )
                    },
                    "mean_accuracy": "" if math.isnan(acc) else acc,
                    "min_accuracy": "" if math.isnan(acc) else acc - 0.1,
                    "max_accuracy": "" if math.isnan(acc) else acc + 0.1,
                    "host_wall_s": 0.1,
                }
            )
    with (path / "clients.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CLIENT_COLUMNS, restval="")
        w.writeheader()
        last = len(table) - 1
        for cid, acc in enumerate(client_acc):
            w.writerow(
                {
                    "run_id": run_id,
                    "round": last,
                    "client_id": cid,
                    "selected": True,
                    "accuracy": acc,
                }
            )
    (path / "scenario.yaml").write_text(f"name: hand\nrounds: {len(table) + 1}\n")
    return path


@pytest.fixture
def two_runs(tmp_path):
    a = _write_run(tmp_path / "a", "a", "fedavg", RUN_A, [0.7, 0.8, 0.9])
    b = _write_run(tmp_path / "b", "b", "local", RUN_B, [0.5, 0.7])
    return a, b


def test_tables_from_hand_made_records(two_runs):
    runs = [load_run(p) for p in two_runs]
    label_runs(runs)
    t = build_tables(runs, target=0.7, window=1)

    k5 = t.kapc_time.set_index("run")
    assert k5.loc["a", "time_s"] == 10.0
    assert (k5.loc["a", "u_comm_s"], k5.loc["a", "u_comm_pct"]) == (2.5, 25.0)
    assert (k5.loc["a", "d_comm_s"], k5.loc["a", "d_comm_pct"]) == (1.75, 17.5)
    assert (k5.loc["a", "client_s"], k5.loc["a", "client_pct"]) == (5.0, 50.0)
    assert (k5.loc["a", "server_s"], k5.loc["a", "server_pct"]) == (0.75, 7.5)
    assert k5.loc["b", "idle_s"] == pytest.approx(2 / 3)
    assert k5.loc["b", "idle_pct"] == pytest.approx(100 * 2 / 15)
    assert "backhaul_s" not in k5.columns  # no run has a backhaul phase

    k6 = t.kapc_cost.set_index("run")
    assert k6.loc["a"].to_dict() == {
        "method": "fedavg",
        "u_comm_mib": 2.0,
        "d_comm_mib": 2.0,
        "c_comp_gflops": 3.0,
        "s_comp_gflops": 0.5,
        "client_energy_j": 50.0,
        **{
            f"energy_{part}_pct": pytest.approx(pct)
            for part, pct in (("compute", 40), ("radio", 20), ("idle", 30), ("sleep", 10))
        },
        "server_mem_mib": 120.0,
        "server_mem_mb": 120.0,  # the old name of the same MiB figure
        "client_step_mem_mib": 12.0,
        "best_mean_acc": 0.8,
    }
    assert math.isnan(k6.loc["b", "client_energy_j"])
    assert math.isnan(k6.loc["b", "energy_sleep_pct"])

    dc = t.dcpfl.set_index("run")
    # A: 0.795 at round 3 is within 0.01 of the final 0.80, 0.70 at round 2 is not
    assert dc.loc["a", "convergence_round"] == 3
    assert dc.loc["a", "comm_rounds"] == 3
    assert dc.loc["a", "comm_time_s"] == 13.0  # (2+3) + (2+3) + (1+2)
    assert dc.loc["a", "total_time_s"] == 30.0
    assert dc.loc["a", "final_acc"] == 0.8
    # B: settled at its first evaluation; never communicates
    assert dc.loc["b", "convergence_round"] == 1
    assert (dc.loc["b", "comm_rounds"], dc.loc["b", "comm_time_s"]) == (0, 0.0)
    assert dc.loc["b", "total_time_s"] == 4.0
    assert dc.loc["b", "total_time_ratio"] == pytest.approx(4 / 30)
    # to the common target 0.70: A first reaches it in round 2 (22 s, 1+1 up + 2+2 down MiB)
    assert dc.loc["a", ["target_round", "target_time_s", "target_mib"]].tolist() == [2, 22, 6]
    assert math.isnan(dc.loc["b", "target_round"])  # B never reaches 0.70
    # without --target: the highest whole point both final accuracies reach, 60 %
    auto = build_tables(runs, window=1).dcpfl.set_index("run")
    assert auto.loc["a", "target"] == pytest.approx(0.60)
    assert auto["target_round"].tolist() == [2, 1]  # A: 0.50, then 0.70

    acc = t.accuracy.set_index("run")
    assert acc.loc["a", ["best_mean_acc", "best_round", "final_acc"]].tolist() == [0.8, 4, 0.8]
    assert acc.loc["a", ["rounds_to_target", "time_to_target_s"]].tolist() == [2, 22.0]
    assert math.isnan(acc.loc["b", "rounds_to_target"])
    assert acc.loc["b", ["best_round", "evaluated_rounds"]].tolist() == [1, 2]

    md = t.markdown()
    for line in [
        "| method | Time (s) | U-Comm (s/%) | D-Comm (s/%) | Client (s/%) | Server (s/%) "
        "| Idle (s/%) |",
        "| fedavg (a) | 10.00 | 2.50 (25.00) | 1.75 (17.50) | 5.00 (50.00) | 0.75 (7.50) "
        "| 0.00 (0.00) |",
        "| local (b) | 5.00 | 0.00 (0.00) | 0.00 (0.00) | 4.33 (86.67) | 0.00 (0.00) "
        "| 0.67 (13.33) |",
        "| fedavg (a) | 2.00 | 2.00 | 3.00 | 0.500 | 50.0 | 40/20/30/10 | 120.0 | 12.00 | 80.00 |",
        "| local (b) | 0.00 | 0.00 | 2.00 | 0.000 | - | -/-/-/- | 50.0 | 5.00 | 60.00 |",
        "| Learning scheme | Round time (s) | Down (%) | Client (%) | Up (%) | Server (%) "
        "| Idle (%) |",
        "| fedavg (a) | 10.00 | 17.5 | 50.0 | 25.0 | 7.5 | 0.0 |",
        "| local (b) | 5.00 | 0.0 | 86.7 | 0.0 | 0.0 | 13.3 |",
        "| Method | Final Acc. (fraction) | Best Acc. (fraction) | Comm. rounds | Comm. time (s) "
        "| Total time (s) | Converged at round | Round to 70 % | Time to 70 % (s) "
        "| Sent to 70 % (MiB) |",
        "| fedavg (a) | 0.800 | 0.800 | 3 | 13.0 | 30.0 (×1.00) | 3 | 2 | 22.0 | 6.0 |",
        "| local (b) | 0.600 | 0.600 | - | - | 4.0 (×0.13) | 1 | X | X | X |",
        "| method | Rounds | Best mean acc (%) | Best round | Final acc (%) | Rounds to 70 % "
        "| Time to target (s) |",
        "| fedavg (a) | 4 | 80.00 | 4 | 80.00 | 2 | 22.0 |",
        "| local (b) | 3 | 60.00 | 1 | 60.00 | X | X |",
    ]:
        assert line in md.splitlines(), line


def test_convergence_means_staying_near_the_final_accuracy():
    rows = [
        {"round": i, "algorithm": "x", "mean_accuracy": a, "elapsed_s": i + 1.0}
        for i, a in enumerate([0.5, 0.81, 0.7, 0.795, 0.80])
    ]
    r = from_rows("x", rows)
    assert convergence_round(r, 0.01, window=1) == 3  # 0.81 reached it, then accuracy fell
    assert convergence_round(r, 0.2, window=1) == 1
    assert convergence_round(r, 0.5, window=1) == 0
    # window 2: final = (0.795 + 0.80) / 2 = 0.7975; trailing means 0.5, 0.655, 0.755,
    # 0.7475, 0.7975 -> only the last is within 0.01 of it
    assert convergence_round(r, 0.01, window=2) == 4
    # tolerance 0.06 (target 0.7375): 0.755 and 0.7475 clear it, 0.655 does not
    assert convergence_round(r, 0.06, window=2) == 2


def test_default_window_is_five_evaluated_rounds(two_runs):
    """RUN_A with the default window: final = mean(0.5, 0.7, 0.795, 0.80) = 0.69875;
    trailing means 0.5, 0.6, 0.665, 0.69875, so only the last round is within 0.01."""
    runs = [load_run(p) for p in two_runs]
    label_runs(runs)
    dc = build_tables(runs).dcpfl.set_index("run")
    assert dc.loc["a", "final_acc"] == pytest.approx(0.69875)
    assert dc.loc["a", "convergence_round"] == 4
    assert dc.loc["a", "comm_rounds"] == 4
    assert dc.loc["a", "comm_time_s"] == 17.0  # (2+3) + (2+3) + (1+2) + (2+2)
    assert dc.loc["a", "total_time_s"] == 40.0
    assert "Final Acc.: the mean over the last 5 evaluated rounds" in build_tables(runs).markdown()


def test_backhaul_appears_when_a_run_has_it_and_counts_as_communication():
    rows = [
        {
            "round": i,
            "algorithm": "hier",
            "round_time_s": 10.0,
            "dl_time_s": 1.0,
            "client_time_s": 5.0,
            "ul_time_s": 2.0,
            "server_time_s": 0.0,
            "backhaul_time_s": 2.0,
            "idle_time_s": 0.0,
            "elapsed_s": 10.0 * (i + 1),
            "bytes_up": 1,
            "bytes_down": 1,
            "client_gflops": 1.0,
            "server_gflops": 0.0,
            "server_rss_mb": 1.0,
            "client_peak_mb": 1.0,
            "mean_accuracy": 0.5,
        }
        for i in range(2)
    ]
    t = build_tables([from_rows("h", rows)])
    assert t.kapc_time["backhaul_pct"].tolist() == [20.0]
    assert t.mtfl_time["backhaul_pct"].tolist() == [20.0]
    assert t.dcpfl["comm_time_s"].tolist() == [5.0]  # converged at round 1: 1 + 2 + 2
    assert (
        "| hier | 10.00 | 2.00 (20.00) | 1.00 (10.00) | 5.00 (50.00) | 0.00 (0.00) "
        "| 2.00 (20.00) |" in t.markdown().splitlines()
    )


def test_report_command_writes_markdown_csv_and_plots(two_runs, tmp_path, capsys):
    out = tmp_path / "rep"
    assert (
        main(["report", *map(str, two_runs), "--target", "0.7", "--window", "1", "--out", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "| fedavg (a) | 10.00 | 2.50 (25.00) |" in printed
    assert "(fedavg, 4 rounds of 5)" in printed  # interrupted run: 4 of the scenario's 5
    assert "| fedavg (a) | 10.00 | 2.50 (25.00) |" in (out / "tables.md").read_text()
    dc = pd.read_csv(out / "dcpfl_tables_1_2.csv")
    assert dc["total_time_s"].tolist() == [30.0, 4.0]
    assert pd.read_csv(out / "kapc_table5_time.csv")["u_comm_pct"].tolist() == [25.0, 0.0]
    assert pd.read_csv(out / "mtfl_table4_time.csv").columns.tolist() == [
        "method",
        "run",
        "round_time_s",
        "down_pct",
        "client_pct",
        "up_pct",
        "server_pct",
        "idle_pct",
    ]
    assert pd.read_csv(out / "accuracy.csv")["rounds_to_target"].tolist()[0] == 2
    for name in PLOT_NAMES:
        _assert_png(out / name)


def _assert_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 5000, path
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200
    assert float(np.std(img[..., :3])) > 0.01, f"{path} is blank"


def test_report_defaults_to_the_run_folder_and_can_skip_plots(two_runs, capsys):
    a, _ = two_runs
    assert main(["report", str(a), "--no-plots", "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    assert (a / "report" / "tables.md").is_file()
    assert not list((a / "report").glob("*.png"))
    # one run: labelled by its algorithm alone
    assert "| fedavg | 10.00 |" in (a / "report" / "tables.md").read_text()


def test_report_errors_name_the_path(tmp_path, two_runs, capsys):
    missing = tmp_path / "nope"
    assert main(["report", str(missing)]) == 2
    assert f"{missing}: no such run directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert f"{empty}: not a run directory (no rounds.csv)" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rounds.csv").write_text("round,algorithm\n0,fedavg\n")
    assert main(["report", str(bad)]) == 2
    assert f"{bad / 'rounds.csv'}: missing columns" in capsys.readouterr().err
    assert main(["report", str(two_runs[0]), str(two_runs[0])]) == 2
    assert "given twice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["report", str(two_runs[0]), "--target", "70"])
    assert exc.value.code == 2
    assert "not a fraction in (0, 1]" in capsys.readouterr().err
    with pytest.raises(ReportError, match="no rounds recorded"):
        from_rows("x", [])


def test_plots_are_written_at_the_end_of_a_real_run_and_report_agrees(tmp_path, capsys):
    out = tmp_path / "run"
    plots = PlotWriter(out / "plots")
    rows = run_in_folder(tiny(rounds=2), out, observers=[plots]).rows
    assert sorted(p.name for p in plots.written) == sorted(PLOT_NAMES)
    for name in PLOT_NAMES:
        _assert_png(out / "plots" / name)
    assert main(["report", str(out), "--quiet"]) == 0
    k5 = pd.read_csv(out / "report" / "kapc_table5_time.csv")
    assert k5["time_s"].iloc[0] == pytest.approx(np.mean([r["round_time_s"] for r in rows]))
    acc = pd.read_csv(out / "report" / "accuracy.csv")
    assert acc["final_acc"].iloc[0] == pytest.approx(rows[-1]["mean_accuracy"])


def test_run_summary_adds_backhaul_and_idle_only_when_present():
    """summary.md / the printed table of one run (mecsim.store.summary), from hand-made rows."""
    from mecsim.store.summary import summarise, table_rows

    row = {
        "round_time_s": 10.0,
        "ul_time_s": 2.0,
        "dl_time_s": 1.0,
        "client_time_s": 5.0,
        "server_time_s": 0.0,
        "idle_time_s": 0.0,
        "elapsed_s": 10.0,
        "bytes_up": MiB,
        "bytes_down": MiB,
        "client_gflops": 1.0,
        "server_gflops": 0.0,
        "server_rss_mb": 1.0,
        "client_peak_mb": 1.0,
        "mean_accuracy": 0.5,
        "host_wall_s": 0.1,
    }
    header, cells, _, _ = table_rows(summarise([row]))
    assert "Backhaul (s/%)" not in header and "Idle (s/%)" not in header
    hier = [
        {**row, "backhaul_time_s": 2.0},
        {**row, "backhaul_time_s": 1.0, "idle_time_s": 1.0, "elapsed_s": 20.0},
    ]
    header, cells, _, _ = table_rows(summarise(hier))
    assert header[-2:] == ["Backhaul (s/%)", "Idle (s/%)"]
    assert cells[-2:] == ["1.50 (15.00)", "0.50 (5.00)"]
