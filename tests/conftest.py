"""Shared fixtures: tiny scenarios that train for real on the embedded MNIST data."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mecsim.scenario import Scenario, scenario_from_dict

TINY: dict[str, Any] = {
    "name": "tiny",
    "seed": 3,
    "rounds": 2,
    "dataset": {"name": "mnist-embedded", "train_size": 400, "test_size": 100,
                "partition": {"method": "dirichlet", "alpha": 0.5}},
    "model": {"name": "mlp_2nn"},
    "topology": {"clients": 4},
    "channel": {"model": "shannon",
                "interference": {"unit": "noise"}},
    "training": {"epochs": 1, "batch_size": 16, "lr": 0.05},
    "metrics": {"enabled": False},
    "execution": {"backend": "local", "hosts": 2},
}


def tiny(**overrides: Any) -> Scenario:
    """The tiny scenario with top-level sections merged one level deep (``channel``,
    being a choice of model, is replaced whole)."""
    data = copy.deepcopy(TINY)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict) and key != "channel":
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return scenario_from_dict(data, "tiny")


@pytest.fixture
def tiny_scenario() -> Scenario:
    return tiny()
