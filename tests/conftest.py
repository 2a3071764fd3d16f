"""Shared fixtures: tiny scenarios that train for real on the embedded MNIST data."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import mecsim.registry as registry
from mecsim.scenario import Scenario, scenario_from_dict

#: mecsim's own algorithms (the installed plugins, e.g. examples/ditto once the suite has
#: installed it, are not the suite's to parametrize over), but ``flower``: it runs a Flower
#: app the scenario names (tests/test_flower.py)
BUILTIN_ALGORITHMS = sorted(
    i.name for i in registry.ALGORITHMS.entries() if i.builtin and i.name != "flower"
)

TINY: dict[str, Any] = {
    "name": "tiny",
    "seed": 3,
    "rounds": 2,
    "dataset": {
        "name": "mnist-embedded",
        "train_size": 400,
        "test_size": 100,
        "partition": {"method": "dirichlet", "alpha": 0.5},
    },
    "model": {"name": "mlp_2nn"},
    "topology": {"clients": 4},
    # links timed as latency + bits / rate (transport: ideal), the arithmetic the tests
    # built on this scenario work by hand; tests/test_tcp.py and test_validation.py time
    # the default TCP flow
    "channel": {
        "model": "shannon",
        "interference": {"unit": "noise"},
        "uplink": {"transport": "ideal"},
        "downlink": {"transport": "ideal"},
    },
    "backhaul": {"transport": "ideal"},
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


@pytest.fixture(scope="session")
def _ray_instance():
    """The Ray instance this test process shares: started by the first test that needs it
    (a ``ray`` test), stopped at the end of the session."""
    started: list[bool] = []
    yield started
    if started:
        import ray  # deferred: only sessions that ran a Ray test pay for importing Ray

        ray.shutdown()


@pytest.fixture(autouse=True)
def _shared_ray(request, _ray_instance):
    """Tests marked ``ray`` run on one Ray instance per test process (on loopback, as
    ``mecsim run`` starts it), not one each: its start and stop take ~3 s. A ``ray`` test
    whose Ray is not this process's (a subprocess's, a cluster's, one it starts and stops
    itself) is marked ``own_ray`` as well: none is started for it (a test that starts its
    own shuts the shared one down first; the next ``ray`` test starts it again)."""
    marker = request.node.get_closest_marker
    if marker("ray") and not marker("own_ray"):
        import os

        from mecsim.run.backends.ray_start import ensure_ray

        if ensure_ray(num_cpus=max(4, os.cpu_count() or 1)):
            _ray_instance.append(True)
    yield
