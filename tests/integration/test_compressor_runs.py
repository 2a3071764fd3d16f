"""Compressors in whole runs: what is charged, what is learned, error feedback's state
through checkpoints, and the conformance kit catching compressors that break their word."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.scenarios import tiny

from mecsim.agents.algorithms import TrainConfig
from mecsim.agents.compressors import TopK
from mecsim.agents.host import ClientHost, HostSetup
from mecsim.agents.models import build_model, model_layout
from mecsim.api import register
from mecsim.interfaces.cli import main
from mecsim.registry import COMPRESSORS
from mecsim.run.backends.base import ClientMap
from mecsim.run.preflight import checkpoint_bytes
from mecsim.scenario import Scenario
from mecsim.store.session import run_in_folder
from mecsim.testing import check_compressor

#: the 2NN on 28 x 28 inputs: 784·200 + 200, BatchNorm's weight, bias, running mean and
#: variance (4 · 200), 200·200 + 200, 200·10 + 10 values
N = 784 * 200 + 200 + 4 * 200 + 200 * 200 + 200 + 200 * 10 + 10


def _run(tmp_path: Path, label: str, **compressor: object) -> tuple[pd.DataFrame, pd.DataFrame]:
    sc = tiny(rounds=3, compressor=compressor) if compressor else tiny(rounds=3)
    run_in_folder(sc, tmp_path / label, backend="local")
    return (
        pd.read_csv(tmp_path / label / "rounds.csv"),
        pd.read_csv(tmp_path / label / "clients.csv"),
    )


def test_uploads_charge_the_payload_and_training_changes(tmp_path: Path) -> None:
    assert N == 200_010
    plain_rounds, plain = _run(tmp_path, "plain")
    q_rounds, q = _run(tmp_path, "q8", name="quantize", params={"bits": 8})
    # 8-bit, blocks of 1024: 8 + 8 ceil(N / 1024) + N = 8 + 8 * 196 + 200010
    assert (plain["bytes_up"] == 4 * N).all()
    assert 8 + 8 * 196 + N == 201_586
    assert (q["bytes_up"] == 201_586).all()
    assert (q["bytes_down"] == plain["bytes_down"]).all()  # downloads as they were
    # the device encodes (the update n, then 6 n), the server decodes (2 n, then n)
    assert np.allclose(q["gflops"] - plain["gflops"], 7 * N / 1e9, rtol=1e-12, atol=0)
    assert (q["server_compute_s"] > 0).all() and (plain["server_compute_s"] == 0).all()
    # the server aggregated what it decoded: the models, and so the losses, differ
    assert not np.allclose(q_rounds["mean_test_loss"], plain_rounds["mean_test_loss"])
    assert np.allclose(q_rounds["mean_accuracy"], plain_rounds["mean_accuracy"], atol=0.05)


def test_topk_sends_k_positions_and_values(tmp_path: Path) -> None:
    _, c = _run(tmp_path, "topk", name="topk", params={"fraction": 0.1})
    k = round(0.1 * N)
    assert k == 20_001
    assert (c["bytes_up"] == 8 + 8 * k).all()


def test_error_feedback_pins_clients_to_their_hosts() -> None:
    def movable(**compressor: object) -> bool:
        sc = tiny(compressor=compressor) if compressor else tiny()
        setup = _host_setup(sc)
        hosts = [{0: None, 1: None}, {2: None, 3: None}]
        return ClientMap({"algorithm": "fedavg", "client_samples": {}}, setup, hosts).movable

    assert movable()
    assert movable(name="quantize")  # no residual: no state
    assert not movable(name="topk")  # error feedback: a residual per client
    assert movable(name="topk", params={"error_feedback": False})


def _host_setup(sc: Scenario) -> HostSetup:
    return HostSetup(
        "mlp_2nn",
        (1, 28, 28),
        10,
        "fedavg",
        {},
        TrainConfig(),
        0,
        np.zeros(1, np.float32),
        compressor=sc.compressor.name,
        compressor_params=dict(sc.compressor.params),
    )


@pytest.mark.parametrize(
    "name, params",
    [
        ("quantize", {"bits": 8}),  # the fast tier's case; each of the others ~3 s too
        pytest.param("quantize", {"bits": 4}, marks=pytest.mark.slow),
        pytest.param("topk", {}, marks=pytest.mark.slow),
        pytest.param("random_mask", {}, marks=pytest.mark.slow),
    ],
)
def test_the_builtins_pass_the_kit(name: str, params: dict) -> None:
    check_compressor(name, params).assert_ok()


def test_the_kit_fails_resume_when_residuals_are_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    restore = ClientHost.load_state_dict

    def forgetful(self: ClientHost, encoded: dict) -> None:
        restore(self, encoded)
        self.residuals = {}

    monkeypatch.setattr(ClientHost, "load_state_dict", forgetful)
    report = check_compressor("topk", properties=["resume"])
    result = report.result("resume")
    assert not result.passed
    assert "a residual not restored?" in result.reason and result.first_difference


class _Cheat(TopK):
    """Sends only the values, keeps the positions on the instance: not charged."""

    def encode(self, x: np.ndarray, seed: int) -> bytes:
        payload = super().encode(x, seed)
        n, k = struct.unpack_from("<II", payload)
        self.kept = np.frombuffer(payload, "<u4", k, 8).copy()
        return struct.pack("<II", n, k) + payload[8 + 4 * k :]

    def encoded_nbytes(self, n: int) -> int:
        return 8 + 4 * self.k(n)

    def decode(self, payload: bytes) -> np.ndarray:
        n, k = struct.unpack_from("<II", payload)
        out = np.zeros(n, np.float32)
        out[getattr(self, "kept", np.arange(k))] = np.frombuffer(payload, "<f4", k, 8)
        return out


class _Boastful(TopK):
    """States an error bound of 0: top-k leaves values out."""

    def error_bound(self, x: np.ndarray) -> float:
        return 0.0


def test_the_kit_catches_a_decoder_that_reads_more_than_the_payload() -> None:
    register("compressor", "cheat_topk", _Cheat)
    register("compressor", "boastful_topk", _Boastful)
    try:
        bytes_ = check_compressor("cheat_topk", properties=["bytes"]).result("bytes")
        assert not bytes_.passed
        assert "a fresh instance decodes the payload differently" in bytes_.reason
        trip = check_compressor("boastful_topk", properties=["roundtrip"]).result("roundtrip")
        assert not trip.passed
        assert "exceeds the stated error_bound 0" in trip.reason
    finally:
        COMPRESSORS.unregister("cheat_topk")
        COMPRESSORS.unregister("boastful_topk")


def test_mecsim_check_runs_the_compressor_kit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "quantize", "--params", "{bits: 4}", "--property", "bytes"]) == 0
    out = capsys.readouterr().out
    assert "PASS bytes" in out and "SKIP roundtrip" in out
    assert main(["check", "quantize", "--params", "{bits: 3}"]) == 2
    assert "Input should be 4 or 8" in capsys.readouterr().err


def test_checkpoints_are_bounded_with_a_residual_per_client() -> None:
    layout = model_layout(build_model("mlp_2nn", (1, 28, 28), 10))
    assert layout.nbytes == 4 * N
    keep = tiny().checkpoint.keep
    # FedAvg's clients keep nothing: the server's two models; error feedback adds one
    # residual for each of the 4 clients
    assert checkpoint_bytes(tiny(), layout) == keep * 2 * 4 * N
    assert checkpoint_bytes(tiny(compressor={"name": "topk"}), layout) == keep * 6 * 4 * N
    assert checkpoint_bytes(tiny(compressor={"name": "quantize"}), layout) == keep * 2 * 4 * N
