"""What the run loop tells its observers: :class:`RunObserver`'s hooks and
:class:`RunInfo`.

Kept apart from :mod:`mecsim.run.loop` (which imports torch and the algorithms) so the
observers that only write files (records, figures, metrics, progress) import in a
fraction of a second, e.g. in the child process that draws a service run's figures.
``mecsim.run.loop`` re-exports both names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mecsim.scenario import Scenario


class RunObserver:
    """Hooks of the run loop; override the ones you need."""

    def on_run_start(self, info: RunInfo) -> None: ...

    def on_run_resume(self, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
        """A resumed run starts after ``rounds`` (its finished rounds, read back from its
        records); by default the same as :meth:`on_run_start`."""
        self.on_run_start(info)

    def on_round_end(
        self,
        info: RunInfo,
        round_row: dict[str, Any],
        client_rows: list[dict[str, Any]],
        traces: dict[str, Any],
    ) -> None: ...

    def on_checkpoint_start(self, info: RunInfo, rounds_done: int) -> None:
        """A checkpoint after ``rounds_done`` rounds is about to be written: what it refers
        to (the records of those rounds) must be on disk before it is."""

    def on_checkpoint(self, info: RunInfo, rounds_done: int, nbytes: int, seconds: float) -> None:
        """A checkpoint after ``rounds_done`` rounds was written."""

    def on_fault(self, info: RunInfo, rnd: int, message: str) -> None:
        """An actor died in round ``rnd``; the run recovers from its last checkpoint."""

    def on_placement(self, info: RunInfo, rnd: int, hosts: list[dict[str, Any]]) -> None:
        """Host actors were (re)started before round ``rnd``: where each runs (node id and
        IP, CPUs; None in-process) and which clients it hosts."""

    def on_run_end(self, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
        """Every planned round is done."""

    def on_run_stopped(
        self, info: RunInfo, rounds: list[dict[str, Any]], status: str, message: str
    ) -> None:
        """The run stopped before its last round: ``status`` is ``interrupted`` (Ctrl-C,
        SIGTERM), ``cancelled`` (asked to stop) or ``failed`` (``message`` says why)."""


@dataclass
class RunInfo:
    run_id: str
    scenario: Scenario
    out_dir: Any  # pathlib.Path or None
    num_params: int
    model_nbytes: int
    step_memory_bytes: int
    step_flops: float
    client_devices: list[str]
    extra: dict[str, Any] = field(default_factory=dict)
    resumed_from: int = 0  # rounds already done when this process started the run
