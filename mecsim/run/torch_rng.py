"""torch's global random generator belongs to the process, and several runs may share a
process (``mecsim serve`` runs them in threads, and checks submissions in others).

A run's initial model comes from ``torch.manual_seed(seed)`` then building the model,
which draws from that generator: anything else drawing from it in between (another run's
model, a pre-flight check building one) would change the run's initial weights. So every
use of the global generator in mecsim goes through one lock: :func:`seeded` for a run's
initial model, :func:`untouched` for a model built only to be inspected (its draws are
undone when it is done).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_LOCK = threading.RLock()


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """The global generator seeded with ``seed``, and no other thread drawing from it."""
    with _LOCK:
        torch.manual_seed(seed)
        yield


@contextmanager
def untouched() -> Iterator[None]:
    """Draws from the global generator inside are undone afterwards, and no other thread
    draws from it meanwhile."""
    with _LOCK, torch.random.fork_rng(devices=[]):
        yield
