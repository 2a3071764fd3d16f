"""Real kills at chosen points, for testing that nothing is lost (a chaos hook).

Set ``MECSIM_KILL_AT`` to make the ``mecsim`` process kill itself with SIGKILL — the
same signal as ``kill -9``, an OOM kill or a power cut would deliver — when it reaches
one of these points:

- ``round-start:N``: round N (0-based) has been planned but nothing of it is recorded;
- ``round-end:N``: round N's records are written (fsync'ed, or an asynchronous run's
  version's given to the OS: :mod:`mecsim.store.records`), its checkpoint not yet;
- ``finish``: every round is done and the Parquet copy of ``rounds.csv`` is written, but
  ``clients.parquet`` and ``summary.md`` are not.

The tests use it to kill a run at exact points; nothing else does.
"""

from __future__ import annotations

import os
import signal


def kill_point(point: str) -> None:
    """SIGKILL this process if ``MECSIM_KILL_AT`` names ``point``."""
    if os.environ.get("MECSIM_KILL_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)
