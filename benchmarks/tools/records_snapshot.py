"""Records before and after a change that must not change results.

Runs every shipped scenario (``scenarios/*.yaml`` and the embedded default) for a few
rounds through the ``mecsim`` command, in-process and under Ray, and keeps each run's
``rounds.csv``, ``clients.csv`` and ``optraces.jsonl`` with the host-measuring columns
(wall times, resident memory) blanked. Two snapshots taken on one machine before and
after a refactor must be identical byte for byte::

    python benchmarks/tools/records_snapshot.py take /tmp/before          # on the old revision
    python benchmarks/tools/records_snapshot.py take /tmp/after           # on the new one
    python benchmarks/tools/records_snapshot.py compare /tmp/before /tmp/after
    python benchmarks/tools/records_snapshot.py changes /tmp/before /tmp/after   # by how much

``changes`` says, for a change meant to change results, by how much: per run and file,
each column that differs with the mean and range of its relative change over the rows
(a Markdown table). ``compare`` prints each file that differs with its first differing
row and column (:func:`mecsim.testing.first_difference`), and exits 1 if any does. The
runs go through the ``mecsim`` command only (``run --rounds --backend --out --run-id
--quiet --no-plots --no-metrics``); the columns blanked are those
:func:`mecsim.testing.compared_columns` leaves out. Snapshots of the same revision on two
machines with other SIMD units (AVX-512 vs AVX2) differ in the last bits of floats;
compare on one machine.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ("rounds.csv", "clients.csv", "optraces.jsonl")
#: An asynchronous run (docs/async.md) records ``updates.csv`` in place of ``clients.csv``.
ASYNC_FILES = ("rounds.csv", "updates.csv", "optraces.jsonl")


def run_files(folder: Path) -> tuple[str, ...]:
    """The files a run (or a snapshot of one) in ``folder`` keeps."""
    return ASYNC_FILES if (folder / "updates.csv").exists() else FILES


def _mecsim() -> str:
    exe = Path(sys.executable).parent / "mecsim"
    return str(exe) if exe.exists() else (shutil.which("mecsim") or "mecsim")


def scenarios(only: list[str] | None) -> list[tuple[str, str | None]]:
    """(name, file) of every shipped scenario; the embedded default has file None."""
    out: list[tuple[str, str | None]] = [("default", None)]
    out += [(p.stem, str(p)) for p in sorted((ROOT / "scenarios").glob("*.yaml"))]
    if only:
        out = [(n, f) for n, f in out if n in only]
    return out


def normalised(path: Path) -> str:
    """The file's text with the columns of a CSV that differ run to run blanked: those a
    host measures (wall clock, resident memory) and ``run_id``, the folder's name."""
    from mecsim.testing import compared_columns  # deferred: imports torch

    text = path.read_text()
    if path.suffix != ".csv":
        return text
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return text
    header = rows[0]
    kept = set(compared_columns(header))
    blank = [i for i, name in enumerate(header) if name not in kept]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for row in rows[1:]:
        w.writerow(["" if i in blank else v for i, v in enumerate(row)])
    return buf.getvalue()


def take(out: Path, rounds: int, backends: list[str], only: list[str] | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, path in scenarios(only):
        for backend in backends:
            key = f"{name}.{backend}"
            dest = out / key
            if dest.is_dir() and all((dest / f).exists() for f in run_files(dest)):
                print(f"{key}: kept from an earlier take")
                continue
            tmp = out / ".runs"
            shutil.rmtree(tmp / key, ignore_errors=True)
            cmd = [
                _mecsim(),
                "run",
                *([path] if path else []),
                "--rounds",
                str(rounds),
                "--backend",
                backend,
                "--hosts",
                "2",
                "--out",
                str(tmp),
                "--run-id",
                key,
                "--quiet",
                "--no-plots",
                "--no-metrics",
            ]
            t0 = time.perf_counter()
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}
            )
            took = time.perf_counter() - t0
            if proc.returncode != 0:
                failed += 1
                print(
                    f"{key}: FAILED (exit {proc.returncode}, {took:.0f} s)\n"
                    f"{proc.stderr.strip()[-2000:]}"
                )
                continue
            dest.mkdir(parents=True, exist_ok=True)
            files = run_files(tmp / key)
            for f in files:
                (dest / f).write_text(normalised(tmp / key / f))
            shutil.rmtree(tmp / key, ignore_errors=True)
            digest = hashlib.sha256(b"".join((dest / f).read_bytes() for f in files))
            print(f"{key}: {digest.hexdigest()[:16]} ({took:.1f} s)", flush=True)
    shutil.rmtree(out / ".runs", ignore_errors=True)
    return 1 if failed else 0


def compare(a: Path, b: Path) -> int:
    from mecsim.testing import first_difference  # deferred: imports torch

    keys = sorted(
        {p.name for p in a.iterdir() if p.is_dir() and not p.name.startswith(".")}
        | {p.name for p in b.iterdir() if p.is_dir() and not p.name.startswith(".")}
    )
    bad = compared = 0
    for key in keys:
        files = sorted({f for d in (a / key, b / key) if d.is_dir() for f in run_files(d)})
        for f in files:
            compared += 1
            pa, pb = a / key / f, b / key / f
            if not pa.exists() or not pb.exists():
                print(f"{key}/{f}: only in {a if pa.exists() else b}")
                bad += 1
                continue
            if pa.read_text() != pb.read_text():
                where = first_difference(pa.parent, pb.parent, (f,))
                print(f"{key}/{f}: {where or 'the same values, written otherwise'}")
                bad += 1
    print(
        f"{len(keys)} runs, {compared} files compared: "
        f"{'identical' if not bad else f'{bad} differ'}"
    )
    return 1 if bad else 0


def _columns(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(path.read_text())))
    return (rows[0], rows[1:]) if rows else ([], [])


def _relative(a: str, b: str) -> float | None:
    """(b − a) / |a| of two numeric cells; None where either is not a number or a is 0."""
    try:
        x, y = float(a), float(b)
    except ValueError:
        return None
    if x == 0.0 or x != x or y != y:
        return None
    return (y - x) / abs(x)


def changes(a: Path, b: Path) -> int:
    """Per run and CSV file, every column whose values differ, with the mean and range of
    the relative change over its rows: the table a change meant to change results gives."""
    keys = sorted(p.name for p in a.iterdir() if p.is_dir() and (b / p.name).is_dir())
    print("| run | file | column | rows changed | mean change | range |")
    print("|---|---|---|---|---|---|")
    same = []
    for key in keys:
        differs = False
        for f in sorted(set(run_files(a / key)) & set(run_files(b / key))):
            if not f.endswith(".csv"):
                continue
            ha, ra = _columns(a / key / f)
            hb, rb = _columns(b / key / f)
            for name in [h for h in ha if h in hb]:
                ia, ib = ha.index(name), hb.index(name)
                pairs = [(x[ia], y[ib]) for x, y in zip(ra, rb, strict=False)]
                changed = [(x, y) for x, y in pairs if x != y]
                if not changed:
                    continue
                differs = True
                rel = [r for r in (_relative(x, y) for x, y in changed) if r is not None]
                mean = f"{100 * statistics.fmean(rel):+.2f} %" if rel else "(not numeric)"
                span = f"{100 * min(rel):+.2f} … {100 * max(rel):+.2f} %" if rel else ""
                print(f"| {key} | {f} | {name} | {len(changed)}/{len(pairs)} | {mean} | {span} |")
            for name in sorted(set(ha) ^ set(hb)):
                differs = True
                print(f"| {key} | {f} | {name} | only in {'a' if name in ha else 'b'} | | |")
        if not differs:
            same.append(key)
    print(f"\nunchanged: {', '.join(same) if same else 'none'}")
    return 0


def quick() -> int:
    """The suite's check of this script: the default scenario, 1 round in-process, taken
    twice into a temporary folder and compared (the same seed gives the same records)."""
    import tempfile

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        for out in (a, b):
            if take(out, 1, ["local"], ["default"]):
                return 1
        code = compare(a, b)
    print(f"quick check: {time.perf_counter() - t0:.1f} s")
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--quick"]:
        return quick()
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="--quick: the default scenario taken twice, compared",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("take", help="run the scenarios and keep their records")
    t.add_argument("out", type=Path)
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--backends", default="local,ray", help="comma-separated (default both)")
    t.add_argument("--only", nargs="*", metavar="NAME", help="only these scenarios")
    c = sub.add_parser("compare", help="compare two snapshots")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    ch = sub.add_parser("changes", help="by how much two snapshots differ, column by column")
    ch.add_argument("a", type=Path)
    ch.add_argument("b", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "take":
        return take(args.out, args.rounds, args.backends.split(","), args.only)
    if args.cmd == "changes":
        return changes(args.a, args.b)
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
