"""One process, several users of torch's global generator: a run's initial model must not
depend on what other threads do meanwhile (``mecsim serve`` prepares runs in one thread
while it checks submissions, which build models, in others)."""

from __future__ import annotations

import threading

import numpy as np
from support.scenarios import tiny

from mecsim.agents.models import build_model, get_flat, model_layout
from mecsim.run import preflight, torch_rng


def _initial_weights(seed: int) -> np.ndarray:
    """A run's initial model, built as mecsim.run.setup.prepare builds it."""
    with torch_rng.seeded(seed):
        model = build_model("mlp_2nn", (1, 28, 28), 10)
    return get_flat(model, model_layout(model))


def test_a_preflight_in_another_thread_leaves_a_runs_initial_model_alone() -> None:
    reference = _initial_weights(3)
    scenario = tiny(model={"name": "mlp_2nn"})
    stop = threading.Event()
    checks = [0]

    def check_submissions() -> None:
        while not stop.is_set():
            preflight.find_problems(scenario)  # builds models, steps one on the meta device
            checks[0] += 1

    thread = threading.Thread(target=check_submissions, daemon=True)
    thread.start()
    try:
        for _ in range(60):
            assert np.array_equal(_initial_weights(3), reference)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert checks[0] > 0  # the pre-flight did run alongside


def test_untouched_undoes_its_draws() -> None:
    import torch

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    with torch_rng.untouched():
        torch.rand(100)
    assert torch.equal(torch.rand(3), expected)
