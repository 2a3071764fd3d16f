"""``compressor:`` in a scenario: refused before anything starts, naming the field and the
file, when it cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest

from mecsim.interfaces.cli import main
from mecsim.scenario import ScenarioError, load_scenario
from mecsim.store.checkpoints import scenario_digest

#: scenario_digest of "rounds: 1" computed by main at 830185b, before the section existed
DIGEST_BEFORE = "28e1e2c771d7c34da6abf4cda0b5ccf4d5a01b352b9f7f26937bd81237d23273"


def _file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text("rounds: 1\n" + body)
    return path


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "compressor: {name: zip}\n",
            "compressor.name: unknown compressor 'zip'; known: quantize, random_mask, topk",
        ),
        (
            "compressor: {name: quantize, params: {bits: 3}}\n",
            "compressor.params.bits: Input should be 4 or 8 (compressor quantize)",
        ),
        (
            "compressor: {name: topk, params: {fraction: 0}}\n",
            "compressor.params.fraction: Input should be greater than 0 (compressor topk)",
        ),
        (
            "compressor: {name: random_mask, params: {fraction: 1.5}}\n",
            "compressor.params.fraction: Input should be less than or equal to 1 (compressor "
            "random_mask)",
        ),
        (
            "compressor: {params: {bits: 4}}\n",
            "compressor.params: no compressor is named (compressor.name is null)",
        ),
        (
            "algorithm: {name: kapc}\ncompressor: {name: topk}\n",
            "compressor.name: compressor 'topk' cannot be applied: algorithm 'kapc' does not "
            "upload the whole flat model",
        ),
        (
            "aggregation: {mode: async}\ncompressor: {name: topk}\n",
            "compressor.name: compressor 'topk' cannot be applied with aggregation.mode "
            "async: the emulated-time loop does not time the server's decoding",
        ),
        (
            "algorithm: {name: phsfl}\ncompressor: {name: topk}\n",
            "algorithm 'phsfl' is hierarchical",
        ),
    ],
)
def test_bad_compressors_are_refused_naming_the_field_and_the_file(
    tmp_path: Path, body: str, expected: str
) -> None:
    path = _file(tmp_path, body)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_the_refusal_lists_the_algorithms_that_work(tmp_path: Path) -> None:
    path = _file(tmp_path, "algorithm: {name: mtfl}\ncompressor: {name: quantize}\n")
    with pytest.raises(
        ScenarioError, match="algorithms it works with: fedavg, fedprox, kmeans_cluster"
    ):
        load_scenario(path)


def test_cli_refuses_a_bad_compressor_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    argv = ["run", "--set", "compressor.name=quantize", "--set", "compressor.params={bits: 2}"]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "params.bits: Input should be 4 or 8 (compressor quantize)" in err
    assert not out.exists()


def test_no_compressor_keeps_the_digest_of_runs_recorded_before_the_field(
    tmp_path: Path,
) -> None:
    plain = load_scenario(_file(tmp_path, ""))
    assert plain.compressor.name is None
    # scenario_digest of this file before the compressor section existed (main at
    # 830185b): a checkpoint written then still belongs to its run
    assert scenario_digest(plain) == DIGEST_BEFORE
    named = load_scenario(_file(tmp_path, "compressor: {name: topk}\n"))
    assert scenario_digest(named) != DIGEST_BEFORE
