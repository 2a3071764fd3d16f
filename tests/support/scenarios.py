"""The tiny scenario most tests build on: it trains for real on the embedded MNIST data."""

from __future__ import annotations

import copy
from typing import Any

import mecsim.registry as registry
from mecsim.scenario import Scenario, scenario_from_dict
from mecsim.testing import TINY_ASYNC

#: mecsim's own algorithms (installed plugins, e.g. examples/ditto in an environment where
#: someone installed it, are not the suite's to parametrize over), but ``flower``: it runs a Flower
#: app the scenario names (tests/integration/test_flower.py)
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
    # built on this scenario work by hand; tests/unit/channel/test_tcp.py and
    # tests/integration/test_validation.py time the default TCP flow
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


def tiny_async_dict(**aggregation: Any) -> dict[str, Any]:
    """A small asynchronous scenario as a dict (docs/async.md): the conformance kit's
    (`mecsim.testing.TINY_ASYNC`: 4 clients, two Pi 3B, a Pi 4 and the default device, in
    one shared cell, 400 embedded MNIST samples, 6 server versions evaluated every 3) on
    two hosts; ``aggregation`` is its ``aggregation:`` section."""
    data = copy.deepcopy(TINY_ASYNC)
    data["name"] = "async-tiny"
    data["execution"] = {"backend": "local", "hosts": 2}
    data["aggregation"] = aggregation
    return data
