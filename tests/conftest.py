"""Fixtures every test may use: the tiny scenario (tests/support/scenarios.py) and one Ray
instance per test process. The folders below add their own (tests/e2e/conftest.py)."""

from __future__ import annotations

import pytest
from support.scenarios import tiny

from mecsim.scenario import Scenario


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
