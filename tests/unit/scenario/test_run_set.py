"""``mecsim run / validate --set PATH=VALUE``: the sweep's dotted overrides, one value each,
checked as the file is (exit 2, one line naming the field, nothing written), recorded in
the run's scenario.yaml; ``--resume`` takes none (the run continues as recorded)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from support.scenarios import tiny

from mecsim.interfaces.cli import main
from mecsim.scenario import load_scenario
from mecsim.scenario.overrides import OverrideError, parse_assignment, parse_sets, parse_values

RUN = ["--quiet", "--no-plots", "--no-metrics", "--backend", "local"]


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps(tiny(rounds=2).model_dump(mode="json")))
    return path


def test_one_value_a_list_or_a_quoted_string_per_set() -> None:
    assert parse_assignment("topology.clients=4") == ("topology.clients", 4)
    assert parse_assignment("channel.uplink.bandwidth_hz=1e6") == (
        "channel.uplink.bandwidth_hz",
        1e6,
    )
    assert parse_assignment("deadline_s=null") == ("deadline_s", None)
    # a list is one value; quotes keep commas and digits as text
    assert parse_assignment("evaluation.target_accuracy=[0.5, 0.8]") == (
        "evaluation.target_accuracy",
        [0.5, 0.8],
    )
    assert parse_assignment('name="a, b"') == ("name", "a, b")
    assert parse_assignment("name='3'") == ("name", "3")
    assert parse_assignment("x=[1, 'a,b', 2]") == ("x", [1, "a,b", 2])
    assert parse_assignment("name=O'Brien") == ("name", "O'Brien")  # not a quote
    # the sweep's parser, the same syntax: quoted commas do not split its values
    assert parse_values('1,"x,y",3') == [1, "x,y", 3]
    for bad, words in [
        ("topology.clients=4,5", "2 values"),
        ("topology.clients=", "expected path=value"),
        ('name="a', "unterminated quote"),
        ("seed=1:5:3", "3 values"),
    ]:
        with pytest.raises(OverrideError, match=words):
            parse_assignment(bad)
    with pytest.raises(OverrideError, match=r"^--set topology.clients=4,5: 2 values"):
        parse_sets(["seed=1", "topology.clients=4,5"])


def test_run_applies_each_set_and_records_it_in_the_run_folder(tmp_path: Path) -> None:
    path = _file(tmp_path)
    args = ["run", str(path), "--out", str(tmp_path / "runs"), "--run-id", "r", *RUN]
    sets = [
        "--set",
        "topology.clients=3",
        "--set",
        "training.lr=0.1",
        "--set",
        "evaluation.target_accuracy=[0.2, 0.3]",
        "--set",
        "rounds=5",  # --rounds, the named option, wins over a --set of the same field
    ]
    assert main([*args, *sets, "--rounds", "2"]) == 0
    recorded = load_scenario(tmp_path / "runs" / "r" / "scenario.yaml")
    assert recorded.topology.clients == 3 and recorded.training.lr == 0.1
    assert recorded.evaluation.target_accuracy == [0.2, 0.3] and recorded.rounds == 2
    clients = pd.read_csv(tmp_path / "runs" / "r" / "clients.csv")
    assert sorted(clients["client_id"].unique()) == [0, 1, 2]
    assert len(pd.read_csv(tmp_path / "runs" / "r" / "rounds.csv")) == 2


@pytest.mark.parametrize(
    "option, words",
    [
        ("topology.clientz=3", "'clientz' is not a field of topology; valid: clients,"),
        ("training.lr=-1", "training.lr: Input should be greater than 0"),
        ("training.lr=fast", "training.lr: Input should be a valid number"),
        ("topology.clients=3,4", "--set topology.clients=3,4: 2 values"),
        ("nonsense", "expected path=value"),
    ],
)
def test_a_bad_set_is_one_line_naming_it_exit_2_and_nothing_written(
    tmp_path: Path, capsys, option: str, words: str
) -> None:
    path = _file(tmp_path)
    out = tmp_path / "runs"
    assert main(["run", str(path), "--out", str(out), "--set", option, *RUN]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(str(path)), err  # the file it was applied to
    assert not out.exists()
    assert main(["validate", str(path), "--set", option]) == 2
    assert words in capsys.readouterr().err


def test_submit_parses_its_sets_as_run_does_before_it_calls_a_server(
    tmp_path: Path, capsys
) -> None:
    # no server listens there: the option is refused first (the server checks the fields)
    args = ["submit", str(_file(tmp_path)), "--server", "http://127.0.0.1:9"]
    assert main([*args, "--set", "topology.clients=3,4"]) == 2
    assert "--set topology.clients=3,4: 2 values" in capsys.readouterr().err


def test_validate_checks_the_file_with_its_sets(tmp_path: Path, capsys) -> None:
    path = _file(tmp_path)
    assert main(["validate", str(path), "--set", "topology.clients=3"]) == 0
    assert f"{path}: ok" in capsys.readouterr().out


@pytest.mark.slow
def test_resume_continues_the_recorded_scenario_and_refuses_a_set(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A run started with --set and stopped after its first round resumes to the records
    of an uninterrupted run with the same --set (its scenario.yaml holds them); --resume
    with a --set of its own, the same or another, is refused before anything starts."""
    import mecsim.interfaces.cli.run as cli_run
    from mecsim.run.observers import RunObserver
    from mecsim.testing import first_difference

    path = _file(tmp_path)
    runs = tmp_path / "runs"
    sets = ["--set", "topology.clients=3", "--set", "seed=7"]
    assert main(["run", str(path), "--out", str(runs), "--run-id", "whole", *sets, *RUN]) == 0

    real = cli_run.run_in_folder
    done: list[int] = []

    class Count(RunObserver):
        def on_round_end(self, info, round_row, client_rows, traces) -> None:
            done.append(1)

    def stop_after_one(*a, **kw):
        kw["observers"] = [*kw["observers"], Count()]
        kw["should_stop"] = lambda: "interrupted" if done else False
        return real(*a, **kw)

    monkeypatch.setattr(cli_run, "run_in_folder", stop_after_one)
    assert main(["run", str(path), "--out", str(runs), "--run-id", "cut", *sets, *RUN]) == 0
    monkeypatch.setattr(cli_run, "run_in_folder", real)
    assert len(pd.read_csv(runs / "cut" / "rounds.csv")) == 1
    capsys.readouterr()

    for again in (sets, ["--set", "topology.clients=4"]):
        assert main(["run", "--resume", str(runs / "cut"), *again, *RUN]) == 2
        err = capsys.readouterr().err
        assert "give no scenario file, --set," in err
    assert len(pd.read_csv(runs / "cut" / "rounds.csv")) == 1  # nothing started

    assert main(["run", "--resume", str(runs / "cut"), *RUN]) == 0
    recorded = load_scenario(runs / "cut" / "scenario.yaml")
    assert recorded.topology.clients == 3 and recorded.seed == 7
    assert first_difference(runs / "whole", runs / "cut") is None
