"""Scenario files: schema, defaults, and errors that name the field and the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.paths import ROOT

from mecsim.interfaces.cli import main
from mecsim.scenario import (
    ScenarioError,
    default_scenario_path,
    json_schema,
    load_scenario,
    resolved_yaml,
    scenario_from_dict,
)

SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.name for p in SCENARIOS])
def test_every_shipped_scenario_validates(path):
    scenario = load_scenario(path)
    assert scenario.rounds >= 1
    # the resolved form (what a run records) validates to the same scenario
    again = scenario_from_dict(yaml.safe_load(resolved_yaml(scenario)), "resolved")
    assert again == scenario


def test_default_scenario_is_embedded_and_runs_fedavg():
    scenario = load_scenario(default_scenario_path())
    assert scenario.algorithm.name == "fedavg"
    assert scenario.dataset.name == "mnist-embedded"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text,expected",
    [
        ("training:\n  lr: -0.1\n", "bad.yaml: training.lr: Input should be greater than 0"),
        (
            "topology:\n  clients: 10\n  participaton: 0.5\n",
            "bad.yaml: topology.participaton: Extra inputs are not permitted",
        ),
        (
            "channel:\n  model: shannon\n  interference:\n    uplink_mean: 1\n",
            "bad.yaml: channel.interference.unit: Field required",
        ),
        (
            "algorithm:\n  name: fedavg\n  params:\n    mu: 0.1\n",
            "bad.yaml: algorithm.params.mu: Extra inputs are not permitted",
        ),
        ("algorithm:\n  name: fedsgd\n", "bad.yaml: algorithm.name: unknown algorithm 'fedsgd'"),
        (
            "devices:\n  clients:\n    - profile: rpi9\n",
            "bad.yaml: devices.clients.0.profile: unknown device profile 'rpi9'",
        ),
        (
            "topology:\n  clients: 4\ndevices:\n  clients:\n    - {profile: rpi4, count: 3}\n",
            "bad.yaml: devices.clients: the groups cover 3 clients but topology.clients is 4",
        ),
        ("rounds: [1\n", "bad.yaml: line 2, column 1: invalid YAML"),
        ("- just\n- a list\n", "bad.yaml: the top level must be a mapping"),
    ],
)
def test_errors_name_the_file_and_the_field(tmp_path, text, expected):
    with pytest.raises(ScenarioError) as info:
        load_scenario(_write(tmp_path, text))
    assert expected in str(info.value)


def test_missing_file_is_one_clear_line(tmp_path):
    with pytest.raises(ScenarioError, match="nope.yaml: cannot read scenario file"):
        load_scenario(tmp_path / "nope.yaml")


def test_cli_bad_scenario_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, "rounds: 0\n")
    code = main(["run", str(path), "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"{path}: rounds: Input should be greater than or equal to 1"]
    assert not (tmp_path / "runs").exists()


def test_cli_validate_and_schema(tmp_path, capsys):
    good = SCENARIOS[0]
    # metrics.port 0: the shipped 9464 may be another process's on this machine meanwhile
    # (a run of a parallel test's, a user's); the port check has tests of its own
    assert main(["validate", str(good), "--set", "metrics.port=0"]) == 0
    assert main(["validate", str(_write(tmp_path, "seed: -1\n"))]) == 2
    out_file = tmp_path / "schema.json"
    assert main(["schema", "-o", str(out_file)]) == 0
    schema = json.loads(out_file.read_text())
    assert schema == json_schema()
    assert {"channel", "devices", "algorithm", "training"} <= set(schema["properties"])


def test_schema_documents_units():
    text = json.dumps(json_schema())
    for field in ("bandwidth_hz", "tx_power_dbm", "noise_psd_dbm_per_hz", "snr_offset_db"):
        assert field in text


def test_aliases_count_as_the_values_they_stand_for(tmp_path):
    from mecsim.scenario.loader import MAX_NODES

    # an anchored list of 1,000 values used 99 times is 100,099 values: one too many
    # for the bound of 100,000 if aliases were free it would pass
    values = ", ".join(["1"] * 999)
    text = f"a: &a [{values}]\nb: [" + ", ".join(["*a"] * 99) + "]\n"
    with pytest.raises(ScenarioError, match="more than 100,000 values"):
        load_scenario(_write(tmp_path, text))
    assert MAX_NODES == 100_000
    # used 90 times it is under the bound: the loader reads it and the schema
    # refuses the unknown keys (so the limit did not misfire)
    text = f"a: &a [{values}]\nb: [" + ", ".join(["*a"] * 90) + "]\n"
    with pytest.raises(ScenarioError) as info:
        load_scenario(_write(tmp_path, text))
    assert "bad.yaml: a: Extra inputs are not permitted" in str(info.value)


def test_limits_at_their_edge(tmp_path):
    # 1,000 keys and 65,536 characters are allowed (the schema then refuses the keys)
    keys = ", ".join(f"k{i}: 1" for i in range(1000))
    with pytest.raises(ScenarioError) as info:
        load_scenario(_write(tmp_path, "description: {" + keys + "}\n"))
    assert "Input should be a valid string" in str(info.value)
    path = _write(tmp_path, "description: " + "x" * 65_536 + "\n")
    assert load_scenario(path).description == "x" * 65_536
    keys = ", ".join(f"k{i}: 1" for i in range(1001))
    with pytest.raises(ScenarioError, match="more than 1,000 keys"):
        load_scenario(_write(tmp_path, "description: {" + keys + "}\n"))


def test_many_problems_are_listed_up_to_a_bound(tmp_path):
    # 300 misspelt fields: 50 lines, then how many more, not 300 lines
    text = "".join(f"field_{i}: 1\n" for i in range(300))
    with pytest.raises(ScenarioError) as info:
        load_scenario(_write(tmp_path, text))
    lines = str(info.value).splitlines()
    assert len(lines) == 51
    assert lines[0].endswith("bad.yaml: field_0: Extra inputs are not permitted")
    assert lines[-1] == "... and 250 more problems"


def test_a_shannon_uplink_is_a_band_of_its_own_or_a_share_of_the_cell():
    def uplink(**fields):
        sc = scenario_from_dict({"channel": {"model": "shannon", "uplink": fields}})
        return sc.channel.uplink.access, sc.channel.shared_media("fedavg")[0]

    # unambiguous without access: a band of its own (not shared), or one band, shared
    assert uplink(bandwidth_hz=[10e6, 30e6]) == (None, False)
    assert uplink(bandwidth_hz=20e6, shared=True) == (None, True)
    # access alone sets shared; the old combination only when asked for by name
    assert uplink(access="dedicated", bandwidth_hz=[10e6, 30e6]) == ("dedicated", False)
    assert uplink(access="shared_cell", bandwidth_hz=20e6) == ("shared_cell", True)
    assert uplink(access="shared_own_band", bandwidth_hz=[10e6, 30e6]) == (
        "shared_own_band",
        True,
    )
    for fields, says in (
        ({"bandwidth_hz": [10e6, 30e6], "shared": True}, "say which you mean"),
        ({"access": "dedicated", "shared": True}, "leave shared out or set it false"),
        ({"access": "shared_cell", "shared": False}, "leave shared out or set it true"),
        ({"access": "shared_cell", "bandwidth_hz": [10e6, 30e6]}, "one number"),
    ):
        with pytest.raises(ScenarioError, match=rf"^f\.yaml: channel\.uplink\.access: .*{says}"):
            scenario_from_dict({"channel": {"model": "shannon", "uplink": fields}}, "f.yaml")
