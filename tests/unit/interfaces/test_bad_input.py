"""Bad input is refused before anything starts: the adversarial corpus, in-process.

Every case of ``tests/support/bad_input_corpus.py`` goes through ``mecsim validate`` and
``mecsim run`` (``mecsim.interfaces.cli.main``): exit code 2, one line per problem naming the file
and the field, no traceback (an exception escaping ``main`` fails the test), nothing
written in the case's directory, no code run, no file content echoed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support.bad_input_corpus import MARKER, busy_port, cases, materialise, snapshot
from support.paths import ROOT

from mecsim.interfaces.cli import main

CASES = cases()
UNPRIVILEGED = [c for c in CASES if c.unprivileged]


def assert_refused(case, command, code, out, err, path, before, after, directory):
    assert code == 2, f"{command} {case.name}: exit {code}\n{out}\n{err}"
    assert not (directory / MARKER).exists(), "the crafted input ran code"
    assert after == before, f"{command} {case.name} wrote {sorted(after - before)}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and case.field in err, f"{command} {case.name}: {err!r}"
    problems = [ln for ln in lines if ": warning: " not in ln]
    assert all(ln.startswith(str(path)) for ln in problems), lines  # every line names the file
    assert "Traceback" not in out + err
    for text in case.forbidden:
        assert text not in out + err


def _run_case(case, command, tmp_path, capsys, monkeypatch):
    directory = tmp_path / "case"
    holder = busy_port() if case.busy_port else None
    try:
        path, args = materialise(
            case, directory, holder.getsockname()[1] if holder is not None else None
        )
        monkeypatch.chdir(directory)
        before = snapshot(directory)
        argv = (
            ["validate", str(path)]
            if command == "validate"
            else ["run", str(path), "--no-plots", *args]
        )
        code = main(argv)
        out, err = capsys.readouterr()
        after = snapshot(directory)
    finally:
        if holder is not None:
            holder.close()
    assert_refused(case, command, code, out, err, path, before, after, directory)
    return err


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.validate], ids=[c.name for c in CASES if c.validate]
)
def test_validate_refuses(case, tmp_path, capsys, monkeypatch):
    if case.unprivileged and os.geteuid() == 0:
        pytest.skip(
            "root binds any port and writes anywhere: "
            "test_unprivileged_cases_in_a_subprocess drops those powers"
        )
    err = _run_case(case, "validate", tmp_path, capsys, monkeypatch)
    assert err.strip(), "refused without a word"  # (assert_refused checks each line)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_run_refuses_before_anything_starts(case, tmp_path, capsys, monkeypatch):
    if case.unprivileged and os.geteuid() == 0:
        pytest.skip(
            "root binds any port and writes anywhere: "
            "test_unprivileged_cases_in_a_subprocess drops those powers"
        )
    err = _run_case(case, "run", tmp_path, capsys, monkeypatch)
    assert err.strip(), "refused without a word"  # (assert_refused checks each line)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the in-process tests cover these as non-root")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
@pytest.mark.parametrize("case", UNPRIVILEGED, ids=[c.name for c in UNPRIVILEGED])
def test_unprivileged_cases_in_a_subprocess(case, tmp_path):
    """Root may listen on port 81 and write anywhere: run without those capabilities
    (setpriv drops CAP_NET_BIND_SERVICE and CAP_DAC_OVERRIDE), for real."""
    from support.bad_input_corpus import _run_subprocess

    src = ROOT
    for command in ("run",):  # validate runs the same pre-flight (in-process tests above)
        directory = tmp_path / command
        path, args = materialise(case, directory)
        before = snapshot(directory)
        argv = (
            ["validate", str(path)]
            if command == "validate"
            else ["run", str(path), "--no-plots", *args]
        )
        code, out, err = _run_subprocess(src, argv, directory, 120, unprivileged=True)
        assert_refused(case, command, code, out, err, path, before, snapshot(directory), directory)
        assert code == 2  # (assert_refused checks the message and that nothing was written)


def test_the_corpus_is_large_and_covers_every_kind():
    names = {c.name for c in CASES}
    assert len(CASES) >= 47
    for needed in (
        "invalid_utf8",
        "duplicate_top_key",
        "deep_flow_sequence",
        "empty_file",
        "lr_inf",
        "distance_nan",
        "seed_float_1e23",
        "mtfl_fedavg_adam_with_sgd",
        "batch_no_machine_can_hold",
        "metrics_port_busy",
        "metrics_port_privileged",
        "metrics_host_unresolvable",
        "trace_path_is_directory",
        "trace_path_with_markup",
        "trace_path_etc_passwd",
        "cifar_crafted_pickle",
        "run_id_traversal",
        "name_traversal",
        "dataset_root_missing",
        "uplink_own_bands_shared",
    ):
        assert needed in names


def test_a_crafted_pickle_would_run_code_and_is_refused(tmp_path):
    """The payload is real: a general unpickler runs it; mecsim's refuses it."""
    import pickle

    from support.bad_input_corpus import _Exec

    from mecsim.data import DatasetError
    from mecsim.data.datasets import _unpickle

    payload = pickle.dumps(_Exec(f"touch {tmp_path / 'ran'}"), protocol=2)
    subprocess.run(
        [sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
        input=payload,
        check=True,
    )
    assert (tmp_path / "ran").exists()  # a general pickle.load executes it
    (tmp_path / "ran").unlink()
    batch = tmp_path / "data_batch_1"
    batch.write_bytes(payload)
    with pytest.raises(DatasetError, match="refused") as info:
        _unpickle(batch)
    assert not (tmp_path / "ran").exists()
    assert "os.system" not in str(info.value) and "posix" not in str(info.value)
