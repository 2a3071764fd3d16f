"""The global model a round's tasks share, handed from the central server actor to the
host actors on the same machine through a shared-memory file, instead of a new object in
Ray's object store every round.

Why: a flat algorithm's plan (:meth:`.actors.CentralServerActor.plan_by_reference`)
put the round's global model into the object store (``ray.put``, ~1 ms for the 0.8 MB
2NN on the development machine, more when it ran beside the driver's timing of the round
that ended), and every host fetched it again (~0.3 ms). That plan sits on the path from
one round's aggregate to the next round's training. The server instead keeps one file
in ``/dev/shm`` (:class:`ModelBoard`) with :data:`SLOTS` slots, copies round ``r``'s
model into slot ``r % SLOTS`` and hands out only where it is (:class:`SharedModel`); each
host maps the file once, read-only, and reads the slot in place.

When it is used: a flat algorithm whose tasks all carry the same weights array (FedAvg
and its kin, not a personalised model per client), every host and the central server on
the driver's Ray node, and a model of at least
:data:`mecsim.run.backends.actors.SHARE_WEIGHTS_BYTES`. Otherwise the object store, as before; and
if the file cannot be made or given memory (a full ``/dev/shm``), the server says so
and keeps to the object store.

Why a slot is never written while it is read: round ``r``'s hosts read slot ``r % 2``
only during their calls of round ``r``, and every one of those calls has returned before
round ``r``'s aggregate exists (the server folds or fetches their uploads), which comes
before the plan of round ``r + 1``, let alone ``r + 2``, the next to write that slot.

Clean-up: the file is named like the hosts' upload files (the executor's prefix plus
``model``, see :mod:`mecsim.run.backends.shared_uploads`), so the executor removes it when it closes
or restarts its actors, and a later executor removes it if the driver was killed; both
look at the driver's machine only, which is why the board is used only when the server
runs there, and why the server makes it when its actors start
(:meth:`mecsim.run.backends.actors.CentralServerActor.open_board`), not at a plan that could still
be running when the executor cleans up. Readers' mappings stay valid until their
processes end.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mecsim.run.backends import shared_uploads

#: Slots of the board: round r's model goes to slot r % SLOTS.
SLOTS = 2
#: The board's name after the executor's file-name prefix.
NAME = "model"


class ModelBoard:
    """The server's file of :data:`SLOTS` slots, each a float32 vector of ``size``; its
    memory reserved at once (``posix_fallocate``: a full ``/dev/shm`` raises
    :class:`OSError` here, never a SIGBUS on a later write)."""

    def __init__(self, path: Path, size: int) -> None:
        page = mmap.PAGESIZE
        self.path, self.size = path, size
        self.slot_bytes = -(-size * 4 // page) * page
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, SLOTS * self.slot_bytes)
            os.posix_fallocate(fd, 0, SLOTS * self.slot_bytes)
            self._map = mmap.mmap(fd, SLOTS * self.slot_bytes)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        self._floats = np.frombuffer(self._map, dtype=np.float32)

    def put(self, rnd: int, weights: np.ndarray) -> SharedModel:
        """Copy round ``rnd``'s model into its slot; where it is, for the hosts."""
        if weights.shape != (self.size,):
            raise ValueError(f"a model of shape {weights.shape} on a board of {self.size}")
        offset = (rnd % SLOTS) * self.slot_bytes
        np.copyto(self._floats[offset // 4 : offset // 4 + self.size], weights, casting="no")
        return SharedModel(str(self.path), offset, self.size)


@dataclass(frozen=True)
class SharedModel:
    """``size`` float32 at byte ``offset`` of the board file at ``path``."""

    path: str
    offset: int
    size: int

    def array(self) -> np.ndarray:
        """The model, a read-only view of this process's mapping of the board (mapped
        once per process and path)."""
        data = shared_uploads.mapped(self.path, remove_name=False)
        return data[self.offset // 4 : self.offset // 4 + self.size]
