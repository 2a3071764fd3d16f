"""The run loop exempts the process's set-up heap from Python's cyclic garbage collector
while the rounds run (full collections would stall rounds) and gives it back after."""

from __future__ import annotations

import gc

import pytest
from support.scenarios import tiny

from mecsim.run.loop import run
from mecsim.run.observers import RunObserver


class _Probe(RunObserver):
    def __init__(self, fail: bool = False) -> None:
        self.frozen: list[int] = []
        self.fail = fail

    def on_round_end(self, info, round_row, client_rows, traces) -> None:
        self.frozen.append(gc.get_freeze_count())
        if self.fail:
            raise RuntimeError("observer failed")


@pytest.mark.parametrize("fail", [False, True])
def test_the_heap_is_frozen_during_the_rounds_and_collectable_after(fail):
    assert gc.get_freeze_count() == 0
    probe = _Probe(fail)
    if fail:
        with pytest.raises(RuntimeError, match="observer failed"):
            run(tiny(rounds=2), "heap", None, [probe])
    else:
        run(tiny(rounds=2), "heap", None, [probe])
    assert probe.frozen and all(n > 0 for n in probe.frozen)
    assert gc.get_freeze_count() == 0  # finished or failed, all collectable again
