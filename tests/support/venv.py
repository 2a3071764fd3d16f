"""A throwaway venv that sees this environment's packages: plugin packages the tests
``pip install -e`` go there, never into the environment the suite runs in.

``python -m venv`` makes a venv on the base interpreter, which does not see the packages of
the venv the suite runs in (torch, Ray, mecsim's editable install); a ``.pth`` file in the
new venv adds this environment's site-packages folders after its own with
:func:`site.addsitedir` (which also runs their ``.pth`` files: the editable install's
finder), so nothing is downloaded or copied, and a package installed into the new venv
is found first. pip, setuptools and pytest are this environment's too.
"""

from __future__ import annotations

import os
import site
import subprocess
import sysconfig
import venv
from pathlib import Path


class PluginVenv:
    """The venv at ``path``: :attr:`python` runs in it, :meth:`install` and
    :meth:`uninstall` change only it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(path)
        self.python = str(path / "bin" / "python")
        purelib = self.run(
            "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        ).stdout.strip()
        outer = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
        outer = list(dict.fromkeys(p for p in outer if Path(p).is_dir()))
        Path(purelib, "_outer_environment.pth").write_text(
            "".join(f"import site; site.addsitedir({p!r})\n" for p in outer)
        )

    def run(self, *argv: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        """This venv's Python with ``argv``; asserts that it exits 0."""
        done = subprocess.run(
            [self.python, *argv], capture_output=True, text=True, timeout=timeout, **kwargs
        )
        assert done.returncode == 0, f"{argv}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        return done

    def install(self, *folders: Path) -> None:
        """``pip install -e`` each folder, offline (no dependencies, no build isolation)."""
        editable = [a for f in folders for a in ("-e", str(f))]
        self.run(
            "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-deps",
            "--no-build-isolation", *editable,
        )  # fmt: skip

    def uninstall(self, *dists: str) -> None:
        subprocess.run(
            [self.python, "-m", "pip", "--disable-pip-version-check", "uninstall", "-y", *dists],
            capture_output=True,
            timeout=300,
            check=False,
        )
