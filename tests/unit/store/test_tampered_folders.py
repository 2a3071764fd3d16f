"""A run folder that was tampered with, cut, or written by another version is read
strictly by the one reader (:mod:`mecsim.store.reader`): refused with one line naming
the file (and the line, where there is one), exit 2 and nothing written, or read as it
was written. Never replayed into numbers that differ from the run's while marked exact
(issue 41, item 4).

One good folder is made once (the tiny scenario, 3 rounds); each case tampers a copy and
hands it to every reader: a replay (``mecsim.replay``), ``mecsim sweep``, ``mecsim
report`` and a resume (``prepare_resume``). A replay that is accepted and says it is
exact must give the good folder's replayed numbers, round for round.
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.paths import DATA
from support.scenarios import tiny

from mecsim.analysis.replay import RunLoadError, replay
from mecsim.interfaces.cli import main
from mecsim.store.runfolder import RunFolderError, prepare_resume
from mecsim.store.session import run_in_folder

OVERRIDE = {"channel.uplink.bandwidth_hz": 2e6}
LEGACY = DATA / "legacy_runs" / "fedavg-finished"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tampered") / "good"
    run_in_folder(tiny(rounds=3), folder)
    return folder


@pytest.fixture(scope="module")
def reference(good: Path) -> pd.DataFrame:
    result = replay(good, OVERRIDE)
    assert result.exact and len(result.rounds) == 3
    return result.rounds


# ---------------------------------------------------------------------- the tampering


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def _edit_line(name: str, line: int, edit: Callable[[str], str]) -> Callable[[Path], None]:
    """Replace line ``line`` (1-based) of file ``name`` with ``edit(line)``."""

    def tamper(folder: Path) -> None:
        lines = _lines(folder / name)
        lines[line - 1] = edit(lines[line - 1].rstrip("\n")) + "\n"
        (folder / name).write_text("".join(lines))

    return tamper


def _trace(line: int, change: Callable[[dict], object]) -> Callable[[Path], None]:
    """Change the JSON object on line ``line`` of optraces.jsonl (``change`` edits it in
    place, or returns what to write instead)."""

    def edit(text: str) -> str:
        obj = json.loads(text)
        out = change(obj)
        return json.dumps(obj if out is None else out)

    return _edit_line("optraces.jsonl", line, edit)


def _op(kind: str, field: str, value: object) -> Callable[[dict], None]:
    """Set ``field`` of the first ``kind`` op of client 1 to ``value``."""

    def change(obj: dict) -> None:
        op = next(o for o in obj["clients"]["1"] if o["op"] == kind)
        op[field] = value

    return change


def _cell(name: str, line: int, column: str, value: str) -> Callable[[Path], None]:
    """Set one cell of a CSV file (``line`` 1-based, the header is line 1)."""

    def tamper(folder: Path) -> None:
        frame = pd.read_csv(folder / name, dtype=str, keep_default_na=False)
        frame.loc[line - 2, column] = value
        frame.to_csv(folder / name, index=False)

    return tamper


def _csv(name: str, change: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        frame = pd.read_csv(folder / name, dtype=str, keep_default_na=False)
        change(frame).to_csv(folder / name, index=False)

    return tamper


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        (folder / name).write_bytes(data)

    return tamper


def _cut(name: str, keep: Callable[[bytes], int]) -> Callable[[Path], None]:
    """Keep the first ``keep(data)`` bytes of a file."""

    def tamper(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: keep(data)])

    return tamper


def _cut_mid_line(name: str, line: int) -> Callable[[Path], None]:
    """Cut line ``line`` in the middle, the lines after it kept."""
    return _edit_line(name, line, lambda text: text[: len(text) // 2])


def _meta(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        meta = json.loads((folder / "run.json").read_text())
        out = change(meta)
        (folder / "run.json").write_text(json.dumps(meta if out is None else out))

    return tamper


def _scenario(change: Callable[[dict], None], drop_sha: bool = False) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        data = yaml.safe_load((folder / "scenario.yaml").read_text())
        change(data)
        (folder / "scenario.yaml").write_text(yaml.safe_dump(data))
        if drop_sha:  # as a version before run.json recorded it
            _meta(lambda m: m.pop("scenario_sha256") and None)(folder)

    return tamper


def _both(*tampers: Callable[[Path], None]) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        for t in tampers:
            t(folder)

    return tamper


def _binary_line(name: str, line: int) -> Callable[[Path], None]:
    """Line ``line`` replaced by bytes that are not UTF-8."""

    def tamper(folder: Path) -> None:
        lines = (folder / name).read_bytes().split(b"\n")
        lines[line - 1] = b"\xff\xfe\x00garbage\x9c"
        (folder / name).write_bytes(b"\n".join(lines))

    return tamper


def _nest(depth: int) -> str:
    return '{"round": 1, "x": ' + "[" * depth + "]" * depth + "}"


def _set(obj: dict, key: str, value: object) -> None:
    obj[key] = value


def _rename_client(obj: dict) -> None:
    obj["clients"]["9"] = obj["clients"].pop("3")
    obj["selected"] = [9 if c == 3 else c for c in obj["selected"]]


# (case, tamper, the file a refusal names (None: accepted), the line it names or None)
BAD_NUMBERS = ["-1", "NaN", "Infinity", "-Infinity", "1e400", '"12"', "true", "null", "1.5"]
CASES: list[tuple[str, Callable[[Path], None], str | None, int | None]] = [
    # op-traces: every numeric cost field of every op, with every bad number
    *[
        (
            f"optraces-{kind}-{field}={value}",
            _edit_line(
                "optraces.jsonl",
                2,
                lambda text, kind=kind, field=field, value=value: re.sub(
                    rf'("op": "{kind}", "{field}": )[^,}}]+', rf"\g<1>{value}", text, count=1
                ),
            ),
            "optraces.jsonl",
            2,
        )
        for kind, field in (
            ("download", "nbytes"),
            ("upload", "nbytes"),
            ("compute", "flops"),
        )
        for value in BAD_NUMBERS
        if not (field == "flops" and value == "1.5")  # a float is a float
    ],
    *[
        (
            f"optraces-compute-batches={value}",
            _trace(2, _op("compute", "batches", json.loads(value))),
            "optraces.jsonl",
            2,
        )
        for value in ("-1", "1.5", "true", '"5"', "null")
    ],
    *[
        (
            f"optraces-aggregate_flops={value}",
            _edit_line(
                "optraces.jsonl",
                3,
                lambda t, value=value: re.sub(
                    r'"aggregate_flops": [^,]+', f'"aggregate_flops": {value}', t
                ),
            ),
            "optraces.jsonl",
            3,
        )
        for value in BAD_NUMBERS
        if value != "1.5"
    ],
    (
        "optraces-round-NaN",
        _trace(2, lambda o: _set(o, "round", float("nan"))),
        "optraces.jsonl",
        2,
    ),
    ("optraces-round-string", _trace(2, lambda o: _set(o, "round", "1")), "optraces.jsonl", 2),
    ("optraces-round-float", _trace(2, lambda o: _set(o, "round", 1.0)), "optraces.jsonl", 2),
    ("optraces-round-negative", _trace(1, lambda o: _set(o, "round", -1)), "optraces.jsonl", 1),
    ("optraces-no-round-key", _trace(2, lambda o: o.pop("round") and None), "optraces.jsonl", 2),
    (
        "optraces-no-clients-key",
        _trace(1, lambda o: o.pop("clients") and None),
        "optraces.jsonl",
        1,
    ),
    ("optraces-list-line", _trace(2, lambda o: [o]), "optraces.jsonl", 2),
    ("optraces-number-line", _edit_line("optraces.jsonl", 2, lambda t: "42"), "optraces.jsonl", 2),
    ("optraces-string-line", _edit_line("optraces.jsonl", 1, lambda t: '"x"'), "optraces.jsonl", 1),
    ("optraces-null-line", _edit_line("optraces.jsonl", 3, lambda t: "null"), "optraces.jsonl", 3),
    ("optraces-empty-line", _edit_line("optraces.jsonl", 2, lambda t: ""), "optraces.jsonl", 2),
    (
        "optraces-nested-10k",
        _edit_line("optraces.jsonl", 2, lambda t: _nest(10_000)),
        "optraces.jsonl",
        2,
    ),
    (
        "optraces-nested-200k",
        _edit_line("optraces.jsonl", 2, lambda t: _nest(200_000)),
        "optraces.jsonl",
        2,
    ),
    (
        "optraces-newer-op",
        _trace(2, lambda o: o["clients"]["0"].insert(1, {"op": "quantise", "nbytes": 10})),
        "optraces.jsonl",
        2,
    ),
    (
        "optraces-newer-key",
        _trace(2, lambda o: _set(o, "compression", "int8")),
        "optraces.jsonl",
        2,
    ),
    ("optraces-newer-op-field", _trace(2, _op("upload", "codec", "zstd")), "optraces.jsonl", 2),
    (
        "optraces-op-without-kind",
        _trace(2, lambda o: o["clients"]["1"][0].pop("op") and None),
        "optraces.jsonl",
        2,
    ),
    (
        "optraces-backhaul-sideways",
        _trace(
            2,
            lambda o: o["clients"]["1"].append(
                {"op": "backhaul", "nbytes": 1, "direction": "sideways"}
            ),
        ),
        "optraces.jsonl",
        2,
    ),
    ("optraces-client-beyond-topology", _trace(2, _rename_client), "optraces.jsonl", 2),
    (
        "optraces-client-id-text",
        _trace(2, lambda o: _set(o, "clients", {f"x{k}": v for k, v in o["clients"].items()})),
        "optraces.jsonl",
        2,
    ),
    (
        "optraces-selected-not-traced",
        _trace(2, lambda o: _set(o, "selected", [0, 1, 2])),
        "optraces.jsonl",
        2,
    ),
    (
        "optraces-selected-twice",
        _trace(2, lambda o: _set(o, "selected", [0, 1, 2, 2])),
        "optraces.jsonl",
        2,
    ),
    (
        "optraces-failed-unselected",
        _trace(2, lambda o: _set(o, "failed", {"7": "crashed"})),
        "optraces.jsonl",
        2,
    ),
    (
        "optraces-duplicated-round",
        _edit_line("optraces.jsonl", 3, lambda t: t.replace('"round": 2', '"round": 1')),
        "optraces.jsonl",
        3,
    ),
    (
        "optraces-duplicated-line",
        lambda f: (f / "optraces.jsonl").write_text(
            "".join(_lines(f / "optraces.jsonl")[:2] + _lines(f / "optraces.jsonl")[1:])
        ),
        "optraces.jsonl",
        3,
    ),
    (
        "optraces-reordered",
        lambda f: (f / "optraces.jsonl").write_text("".join(_lines(f / "optraces.jsonl")[::-1])),
        "optraces.jsonl",
        1,
    ),
    ("optraces-cut-mid-line-2", _cut_mid_line("optraces.jsonl", 2), "optraces.jsonl", 2),
    ("optraces-binary-line", _binary_line("optraces.jsonl", 2), "optraces.jsonl", 2),
    (
        "optraces-binary-file",
        _write("optraces.jsonl", bytes(range(256)) * 8 + b"\n"),
        "optraces.jsonl",
        1,
    ),
    (
        "optraces-nul-bytes",
        _edit_line("optraces.jsonl", 3, lambda t: t[:20] + "\x00" + t[20:]),
        "optraces.jsonl",
        3,
    ),
    ("optraces-empty-file", _write("optraces.jsonl", b""), "good", None),
    # cut at the end, as a kill leaves it: the rounds before are read
    ("optraces-cut-mid-last-line", _cut("optraces.jsonl", lambda d: len(d) - 40), None, None),
    ("optraces-cut-without-newline", _cut("optraces.jsonl", lambda d: len(d) - 1), None, None),
    # rounds.csv
    ("rounds-round-NaN", _cell("rounds.csv", 3, "round", ""), "rounds.csv", 3),
    ("rounds-round-nan-text", _cell("rounds.csv", 3, "round", "nan"), "rounds.csv", 3),
    ("rounds-round-float", _cell("rounds.csv", 3, "round", "1.5"), "rounds.csv", 3),
    ("rounds-round-negative", _cell("rounds.csv", 2, "round", "-1"), "rounds.csv", 2),
    ("rounds-round-text", _cell("rounds.csv", 4, "round", "two"), "rounds.csv", 4),
    (
        "rounds-duplicated-row",
        _csv("rounds.csv", lambda f: pd.concat([f.iloc[:2], f.iloc[1:]])),
        "rounds.csv",
        4,
    ),
    ("rounds-missing-row", _csv("rounds.csv", lambda f: f.drop(index=1)), "rounds.csv", 3),
    (
        "rounds-missing-column",
        _csv("rounds.csv", lambda f: f.drop(columns=["round_time_s"])),
        "rounds.csv",
        None,
    ),
    (
        "rounds-no-round-column",
        _csv("rounds.csv", lambda f: f.drop(columns=["round"])),
        "rounds.csv",
        None,
    ),
    (
        "rounds-column-twice",
        _csv("rounds.csv", lambda f: f.rename(columns={"dl_time_s": "ul_time_s"})),
        "rounds.csv",
        1,
    ),
    *[
        (f"rounds-{col}={value}", _cell("rounds.csv", 3, col, value), "rounds.csv", 3)
        for col in (
            "round_time_s",
            "ul_time_s",
            "elapsed_s",
            "bytes_up",
            "energy_j",
            "client_gflops",
        )
        for value in ("-1", "inf", "-inf", "abc")
    ],
    *[
        (f"rounds-{col}={value}", _cell("rounds.csv", 3, col, value), "rounds.csv", 3)
        for col, value in (
            ("bytes_down", "1.5"),
            ("mean_accuracy", "1.7"),
            ("mean_accuracy", "-0.2"),
            ("selected", "-2"),
            ("faults", "0.5"),
        )
    ],
    (
        "rounds-too-many-cells",
        _edit_line("rounds.csv", 3, lambda t: t + ",1,2"),
        "rounds.csv",
        None,
    ),
    ("rounds-cut-mid-line-2", _cut_mid_line("rounds.csv", 2), "rounds.csv", None),
    ("rounds-binary", _write("rounds.csv", b"\x89PNG\r\n\x1a\n\x00\x00garbage\n"), "rounds.csv", 1),
    ("rounds-empty", _write("rounds.csv", b""), "rounds.csv", None),
    (
        "rounds-header-only",
        lambda f: (f / "rounds.csv").write_text(_lines(f / "rounds.csv")[0]),
        "good",
        None,
    ),
    # accepted: a kill's cut last row, a column a newer version added
    ("rounds-cut-mid-last-line", _cut("rounds.csv", lambda d: len(d) - 30), None, None),
    ("rounds-newer-column", _csv("rounds.csv", lambda f: f.assign(carbon_g="1.0")), None, None),
    # clients.csv
    (
        "clients-duplicated-row",
        _csv("clients.csv", lambda f: pd.concat([f.iloc[:5], f.iloc[4:]])),
        "clients.csv",
        7,
    ),
    ("clients-client-beyond-topology", _cell("clients.csv", 3, "client_id", "9"), "clients.csv", 3),
    ("clients-client-id-NaN", _cell("clients.csv", 3, "client_id", ""), "clients.csv", 3),
    ("clients-selected-maybe", _cell("clients.csv", 4, "selected", "maybe"), "clients.csv", 4),
    ("clients-finish-negative", _cell("clients.csv", 4, "finish_s", "-3"), "clients.csv", 4),
    ("clients-bytes-negative", _cell("clients.csv", 4, "bytes_up", "-800040"), "clients.csv", 4),
    ("clients-gflops-inf", _cell("clients.csv", 4, "gflops", "inf"), "clients.csv", 4),
    ("clients-download-negative", _cell("clients.csv", 5, "download_s", "-1"), "clients.csv", 5),
    ("clients-upload-minus-inf", _cell("clients.csv", 5, "upload_s", "-inf"), "clients.csv", 5),
    ("clients-energy-text", _cell("clients.csv", 2, "energy_j", "lots"), "clients.csv", 2),
    (
        "clients-missing-column",
        _csv("clients.csv", lambda f: f.drop(columns=["client_id"])),
        "clients.csv",
        None,
    ),
    (
        "clients-missing-selected-row",
        _csv("clients.csv", lambda f: f.drop(index=5)),
        "clients.csv",
        None,
    ),
    ("clients-binary", _write("clients.csv", b"\xff\xfe\x00\x01" * 100 + b"\n"), "clients.csv", 1),
    # run.json
    ("meta-garbage", _write("run.json", b"this is not json {"), "run.json", 1),
    ("meta-binary", _write("run.json", bytes(range(256))), "run.json", 1),
    ("meta-list", _meta(lambda m: [m]), "run.json", 1),
    ("meta-empty", _write("run.json", b""), "run.json", 1),
    ("meta-nested", _write("run.json", b"[" * 100_000 + b"]" * 100_000), "run.json", 1),
    ("meta-newer-format", _meta(lambda m: _set(m, "records_format", 99)), "run.json", None),
    ("meta-format-text", _meta(lambda m: _set(m, "records_format", "1")), "run.json", None),
    (
        "meta-step-memory-negative",
        _meta(lambda m: _set(m, "step_memory_bytes", -5)),
        "run.json",
        None,
    ),
    ("meta-status-unknown", _meta(lambda m: _set(m, "status", "exploded")), "run.json", None),
    (
        "meta-resume-from-NaN",
        _meta(lambda m: _set(m, "resumes", [{"from_round": float("nan")}])),
        "run.json",
        None,
    ),
    (
        "meta-aggregate-rate-zero",
        _meta(lambda m: _set(m, "aggregate_flops_per_s", 0)),
        "run.json",
        None,
    ),
    # scenario.yaml: changed after the run
    (
        "scenario-more-clients",
        _scenario(lambda d: d["topology"].update(clients=6)),
        "scenario.yaml",
        None,
    ),
    (
        "scenario-fewer-clients",
        _scenario(lambda d: d["topology"].update(clients=3)),
        "scenario.yaml",
        None,
    ),
    (
        "scenario-other-channel",
        _scenario(lambda d: d["channel"]["uplink"].update(bandwidth_hz=1e5)),
        "scenario.yaml",
        None,
    ),
    # ... in a folder of a version that recorded no sha256: the clients still counted
    (
        "scenario-more-clients-no-sha",
        _scenario(lambda d: d["topology"].update(clients=6), drop_sha=True),
        "scenario.yaml",
        None,
    ),
    (
        "scenario-fewer-clients-no-sha",
        _scenario(lambda d: d["topology"].update(clients=3), drop_sha=True),
        "scenario.yaml",
        None,
    ),
    ("scenario-garbage", _write("scenario.yaml", b"{{{ not: yaml"), "scenario.yaml", None),
    # together: the cut last round in two files
    (
        "cut-last-round-everywhere",
        _both(
            _cut("optraces.jsonl", lambda d: len(d) - 10), _cut("rounds.csv", lambda d: len(d) - 10)
        ),
        None,
        None,
    ),
]


def _ids() -> list[str]:
    return [c[0] for c in CASES]


def test_the_cases_have_distinct_names() -> None:
    assert len(set(_ids())) == len(CASES) > 140


def _refusal(lines: list[str], names: str, line: int | None) -> None:
    assert len(lines) == 1, lines
    text = lines[0]
    assert "Traceback" not in text and "\n" not in text
    if names != "good":
        assert names in text, text
    if line is not None:
        assert f"{names}:{line}:" in text, text


@pytest.mark.parametrize("case, tamper, names, line", CASES, ids=_ids())
def test_a_tampered_folder_is_refused_naming_the_file_or_read_as_written(
    good: Path,
    reference: pd.DataFrame,
    tmp_path: Path,
    capfd,
    case: str,
    tamper: Callable[[Path], None],
    names: str | None,
    line: int | None,
) -> None:
    folder = tmp_path / "run"
    shutil.copytree(good, folder, ignore=shutil.ignore_patterns(".lock"))
    tamper(folder)
    # (1) a replay: refused in one line naming the file, or exact and the run's numbers
    # (a scenario.yaml that is not one is refused by the scenario's loader, which names
    # the file; a replay of a folder without rounds is refused naming the folder)
    replay_refused = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            result = replay(folder, OVERRIDE)
        except RunLoadError as exc:
            replay_refused = True
            _refusal([str(exc)], names or "?", line)
    if not replay_refused:
        assert names is None, f"{case}: accepted, expected a refusal naming {names}"
        rows = result.rounds
        assert 0 < len(rows) <= len(reference)
        if result.exact:  # never wrong and exact
            pd.testing.assert_frame_equal(
                rows.reset_index(drop=True), reference.iloc[: len(rows)].reset_index(drop=True)
            )
    else:
        assert names is not None, f"{case}: refused, expected it to be read"
    # (2) mecsim sweep over it: exit 2 with the same one line, nothing written
    capfd.readouterr()
    out = tmp_path / "sweep"
    code = main(
        [
            "sweep",
            str(folder),
            "--set",
            "channel.uplink.bandwidth_hz=2e6",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    stdout, stderr = capfd.readouterr()
    errors = [ln for ln in (stdout + stderr).splitlines() if ln.startswith("error:")]
    if replay_refused:
        assert code == 2 and not out.exists(), (stdout, stderr)
        assert "Traceback" not in stdout + stderr
        _refusal(errors, names or "?", line)
    else:
        assert code == 0 and not errors and (out / "sweep.csv").is_file(), (stdout, stderr)
        swept = pd.read_csv(out / "sweep.csv")
        if bool(swept["exact"].iloc[0]):
            # the replay's total emulated time, to the digit: the good run's rounds
            n = int(swept["rounds"].iloc[0])
            assert swept["total_time_s"].iloc[0] == pytest.approx(
                float(reference["round_time_s"].iloc[:n].sum()), rel=1e-12
            )
    # (3) mecsim report: exit 0, or exit 2 in one line naming the file
    report = tmp_path / "report"
    code = main(["report", str(folder), "--out", str(report), "--no-plots", "--quiet"])
    stdout, stderr = capfd.readouterr()
    assert code in (0, 2) and "Traceback" not in stdout + stderr, (code, stdout, stderr)
    if code == 2:
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        if names == "scenario.yaml":  # fewer clients than the records hold: found there
            _refusal(lines, "clients.csv", None)
            assert "topology.clients changed?" in lines[0]
        else:
            assert names in ("rounds.csv", "clients.csv", "good"), (case, stderr)
            _refusal(lines, names, line)
        assert not report.exists()
    elif names in ("rounds.csv", "clients.csv") and case != "clients-missing-selected-row":
        pytest.fail(f"{case}: mecsim report read a tampered {names}")
    # (4) a resume: refused in one line before anything is changed, or prepared
    meta_path = folder / "run.json"
    try:
        meta = json.loads(meta_path.read_text())
        if isinstance(meta, dict) and meta.get("status") == "finished":
            meta["status"] = "interrupted"
            meta_path.write_text(json.dumps(meta))
    except (ValueError, UnicodeDecodeError, RecursionError):
        pass

    def files() -> dict[str, bytes]:  # (the lock a resume takes is not the folder's)
        return {
            p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".lock"
        }

    before = files()
    try:
        target = prepare_resume(folder)
    except RunFolderError as exc:
        assert files() == before, f"{case}: a refused resume changed the folder"
        assert "\n" not in str(exc)
        if names not in (None, "good"):
            assert names in str(exc), (case, str(exc))
    else:
        target.lock.release()
        refusable = ("optraces.jsonl", "rounds.csv", "clients.csv", "run.json", "scenario.yaml")
        # an empty rounds.csv is what a kill before its header leaves: the run starts over
        if names in refusable and case not in ("clients-missing-selected-row", "rounds-empty"):
            pytest.fail(f"{case}: a resume accepted a tampered {names}")


def test_a_folder_of_a_version_before_the_strict_reader_is_read(tmp_path: Path) -> None:
    # mecsim 0.1's folder (no records_format, no scenario_sha256): read as it was written
    folder = tmp_path / "legacy"
    shutil.copytree(LEGACY, folder)
    result = replay(folder, OVERRIDE)
    assert result.exact and len(result.rounds) == 3
    assert main(["report", str(folder), "--out", str(tmp_path / "r"), "--no-plots", "--quiet"]) == 0


def test_the_one_line_names_file_and_line_for_a_negative_nbytes(good: Path, tmp_path: Path) -> None:
    # the case that used to give wrong bytes and energy marked exact
    folder = tmp_path / "run"
    shutil.copytree(good, folder, ignore=shutil.ignore_patterns(".lock"))
    _trace(2, _op("upload", "nbytes", -800040))(folder)
    with pytest.raises(RunLoadError) as info:
        replay(folder, OVERRIDE)
    assert str(info.value) == (
        f"{folder / 'optraces.jsonl'}:2: clients.1.2.upload.nbytes: Input should be "
        "greater than or equal to 0"
    )
