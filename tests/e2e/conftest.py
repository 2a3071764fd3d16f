"""End-to-end fixtures: the throwaway venv that plugin packages are installed into."""

from __future__ import annotations

import pytest
from support.venv import PluginVenv


@pytest.fixture(scope="session")
def plugin_venv(tmp_path_factory: pytest.TempPathFactory) -> PluginVenv:
    """One throwaway venv per test process (tests/support/venv.py): the tests that
    ``pip install`` a package install it there, so the suite's own environment is left as
    it was, whatever a test does or fails to do."""
    return PluginVenv(tmp_path_factory.mktemp("plugin-venv"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the throwaway venv is marked ``pip_install`` (``-m "not
    pip_install"`` leaves them out)."""
    for item in items:
        if "plugin_venv" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.pip_install)
