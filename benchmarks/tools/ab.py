"""A/B: one benchmark on two revisions, run alternately in one sitting.

    python benchmarks/tools/ab.py REV_A REV_B [--trials 5] -- \
        benchmarks/speed/overhead.py --trials 1

Both revisions are checked out into temporary git worktrees and run with this
environment's Python and packages, each importing its own code: its ``mecsim`` (with
``agents/`` and ``channel/`` laid out as that revision's ``pyproject.toml`` installs them)
comes first on ``PYTHONPATH``, also for the Ray workers it starts. The benchmark runs A,
B, A, B, ... ``--trials`` times each; every number it prints is a figure, matched between
runs by its place in the output (its line among the lines with numbers, and its place on
the line). For each figure the report gives the median of A and of B, the ratio B/A of
the medians, and the spread of the ratio over the trial pairs (min-max of B_i/A_i).

This is how a speed claim is made in this project (docs/speed.md): "faster" or "as fast
as before" needs an A/B from this tool, run on a machine doing nothing else; figures
measured under other load are not speed claims. ``--quick`` (the suite's check): the
plugin-discovery benchmark's quick run (fresh processes that import the revision's
``mecsim``, a few seconds), HEAD against HEAD, twice each.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
#: A printed number: 12, -0.5, 1e-3, and 85,487 (thousands separated by commas).
NUMBER = re.compile(r"(?<![\w.,])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")


@dataclass
class Revision:
    label: str  # A or B
    rev: str
    commit: str
    tree: Path  # the worktree
    path: Path  # what goes first on PYTHONPATH


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def _import_root(tree: Path, scratch: Path) -> Path:
    """Where the revision's packages import from as its pyproject installs them: the
    worktree itself, or, when ``package-dir`` maps a package to another folder (agents/
    installs as mecsim.agents), a tree of symlinks with the installed layout."""
    try:
        config = tomllib.loads((tree / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return tree
    mapping = config.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    moved = {pkg: d for pkg, d in mapping.items() if pkg.replace(".", "/") != d}
    if not moved:
        return tree
    links = scratch / "import-root"
    shutil.rmtree(links, ignore_errors=True)
    tops = {pkg.split(".")[0] for pkg in mapping}
    for top in tops:
        (links / top).mkdir(parents=True)
        for entry in (tree / mapping.get(top, top)).iterdir():
            (links / top / entry.name).symlink_to(entry)
    for pkg, d in sorted(moved.items()):
        if "." in pkg:
            target = links / pkg.replace(".", "/")
            target.unlink(missing_ok=True)
            target.symlink_to(tree / d)
    return links


#: Written where each revision imports from (first on PYTHONPATH, so Python imports it at
#: start-up, in the benchmark and in every Ray worker): an editable install of mecsim
#: (``pip install -e .``) puts a finder on ``sys.meta_path`` that maps the packages
#: ``package-dir`` moves (mecsim.agents, mecsim.channel) to the working tree, ahead of
#: PYTHONPATH; without this, a revision would run its own ``mecsim`` with the working
#: tree's ``agents/`` and ``channel/``.
SITECUSTOMIZE = """\
import sys

# benchmarks/tools/ab.py: this revision's code, not the editable install's working tree
sys.meta_path[:] = [
    f for f in sys.meta_path
    if not getattr(f, "__module__", "").startswith("__editable___mecsim_")
]
"""


def checkout(label: str, rev: str, scratch: Path) -> Revision:
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tree = scratch / f"tree-{label}"
    _git("worktree", "add", "--detach", "--force", str(tree), commit)
    path = _import_root(tree, scratch / label)
    (path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return Revision(label, rev, commit[:10], tree, path)


def run_once(r: Revision, command: list[str], timeout_s: float) -> tuple[str, float]:
    """(stdout, seconds) of the benchmark on revision ``r``."""
    script, *rest = command
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(r.path), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(r.tree / script), *rest],
        # from where the revision imports: Ray puts the driver's working folder on its
        # workers' sys.path, and the worktree's own mecsim/ lacks agents/ and channel/
        cwd=r.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{r.label} ({r.rev}) {script} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return proc.stdout, took


def figures(text: str) -> dict[tuple[int, int], float]:
    """Every number printed, keyed by (its line among the lines with numbers, its place on
    the line)."""
    out: dict[tuple[int, int], float] = {}
    k = 0
    for line in text.splitlines():
        found = NUMBER.findall(line)
        if not found:
            continue
        for j, number in enumerate(found):
            out[(k, j)] = float(number.replace(",", ""))
        k += 1
    return out


def _lines_with_numbers(text: str) -> list[str]:
    return [line for line in text.splitlines() if NUMBER.search(line)]


def report(a: Revision, b: Revision, runs: dict[str, list[str]], only: str | None) -> str:
    """One row per figure: where it is, both medians, the ratio and its spread."""
    first = _lines_with_numbers(runs["A"][0])
    fa = [figures(t) for t in runs["A"]]
    fb = [figures(t) for t in runs["B"]]
    keys = [k for k in fa[0] if all(k in f for f in fa + fb)]
    rows = [
        f"A = {a.rev} ({a.commit}), B = {b.rev} ({b.commit}); {len(fa)} runs each, "
        "alternating. Figure: its line in A's first run, the figure in [brackets].",
        f"{'median A':>12} {'median B':>12} {'B/A':>7} {'B/A spread':>15}  figure",
    ]
    for key in keys:
        k, j = key
        line = first[k] if k < len(first) else ""
        if only and not re.search(only, line):
            continue
        xs, ys = [f[key] for f in fa], [f[key] for f in fb]
        ma, mb = statistics.median(xs), statistics.median(ys)
        pairs = [y / x for x, y in zip(xs, ys, strict=False) if x]
        ratio = f"{mb / ma:7.3f}" if ma else f"{'-':>7}"
        spread = f"{min(pairs):.3f}-{max(pairs):.3f}" if pairs else "-"
        spans = [m.span() for m in NUMBER.finditer(line)]
        shown = line
        if j < len(spans):
            s, e = spans[j]
            shown = f"{line[:s]}[{line[s:e]}]{line[e:]}"
        rows.append(f"{ma:12.6g} {mb:12.6g} {ratio} {spread:>15}  {' '.join(shown.split())}")
    return "\n".join(rows)


#: what ``--quick`` runs on each revision: a check that the A/B runs (worktrees, import
#: roots, figures matched by place), not a measurement, so the cheapest benchmark that
#: imports the revision's code in processes of its own (the engine's quick run took ~25 s
#: a trial, four of them)
QUICK_BENCHMARK = ["benchmarks/speed/plugin_discovery.py", "--quick"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--quick"]:
        argv = ["HEAD", "HEAD", "--trials", "2", "--", *QUICK_BENCHMARK]
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Everything after -- is the benchmark and its "
        "arguments, a path relative to the repository.",
    )
    p.add_argument("rev_a", help="the baseline revision (a commit, tag or branch)")
    p.add_argument("rev_b", help="the revision compared with it")
    p.add_argument("--trials", type=int, default=3, help="runs of each revision (default 3)")
    p.add_argument("--only", metavar="REGEX", help="report only figures on lines matching")
    p.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds one run may take (default 3600)"
    )
    args = p.parse_args(argv)
    if not command:
        p.error("give the benchmark after --, e.g. -- benchmarks/speed/overhead.py --trials 1")
    if args.trials < 1:
        p.error("--trials must be at least 1")
    scratch = Path(tempfile.mkdtemp(prefix="mecsim-ab-"))
    revisions: list[Revision] = []
    try:
        for label, rev in (("A", args.rev_a), ("B", args.rev_b)):
            try:
                revisions.append(checkout(label, rev, scratch))
            except subprocess.CalledProcessError as exc:
                print(
                    f"error: {rev}: not a revision of this repository "
                    f"({exc.stderr.strip().splitlines()[-1] if exc.stderr else exc})",
                    file=sys.stderr,
                )
                return 2
            if not (revisions[-1].tree / command[0]).is_file():
                print(f"error: {command[0]} does not exist in {rev}", file=sys.stderr)
                return 2
        a, b = revisions
        runs: dict[str, list[str]] = {"A": [], "B": []}
        for trial in range(args.trials):
            for r in (a, b):
                out, took = run_once(r, command, args.timeout)
                runs[r.label].append(out)
                print(
                    f"trial {trial + 1}/{args.trials} {r.label} ({r.rev}): {took:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
        print(report(a, b, runs, args.only))
        return 0
    finally:
        for r in revisions:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(r.tree)], cwd=ROOT, capture_output=True
            )
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
