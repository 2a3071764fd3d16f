"""Streamed uploads handed from a host actor to the server on the same machine through a
shared-memory file, instead of a new object in Ray's object store every call.

Why: a held call's uploads travel as one object (:class:`mecsim.run.backends.actors.UploadRows`),
and Ray copies it into a new place in its object store each time. The host process has
usually never touched those pages, so writing 40 MB of 2NN uploads there costs ~10,000
page faults (measured in a host actor: 9,000-10,700 minor faults per 50-client call in
most rounds, ~1.4 µs each on the development machine: ~14 ms, plus the 40 MB copy itself,
~6 ms), and the server's first read of them faults again. A host instead keeps one file
in ``/dev/shm`` with :data:`SLOTS` slots, writes each client's upload straight into a row
of the current slot (FedAvg's ``get_flat(out=row)``: no copy at all), and returns only
where the rows are (:class:`SharedUploadRows`); the server maps the file once, read-only,
and folds the rows in place. After the first rounds no page is faulted again.

When it is used (:meth:`.ray_executor.RayExecutor._fit_streamed`): a streamed round
(the server folds each part's uploads and lets them go at once, so no reader keeps a row
past its part), a host on the same Ray node as the central server, and a call whose
uploads fit a slot (:data:`mecsim.run.backends.actors.HOLD_UPLOADS_BYTES`). Anything else keeps
the object store. Part ``p`` of a round writes slot ``p % SLOTS``: the run loop submits
part ``p`` only after the server has folded part ``p - SLOTS`` (see
:data:`mecsim.run.backends.balance.STREAM_PARTS_IN_FLIGHT`), and a round's last part is folded
before the next round starts, so a slot is never written while it is read.

Clean-up: the files are named ``mecsim-uploads-<machine>-<driver pid>-<token>-<host>``
and reserve their memory before it is written (a full ``/dev/shm``, e.g. a container's
64 MB, makes the host fall back to the object store instead of crashing). The server
removes a file's name as soon as it has mapped it (the memory goes when the host and the
server processes are gone, however they end); for a file the server never mapped, the
executor removes its own when it closes or restarts its actors, and every new executor
removes this user's files of this machine whose driver process is gone (a driver killed
with SIGKILL). Those two see only the driver's machine: when the server runs on another
node of a cluster, a file its host made there is left behind only if the server died
between the host's first write and its own first read.
"""

from __future__ import annotations

import mmap
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
PREFIX = "mecsim-uploads-"
#: Slots per host file: as many as streamed parts may be in flight at once.
SLOTS = 2


def _machine() -> str:
    """This machine's name as it appears in file names (no ``-``)."""
    return socket.gethostname().replace("-", "_").replace("/", "_") or "host"


def executor_prefix(token: str) -> str:
    """The file-name prefix of one executor's hosts
    (``<PREFIX><machine>-<driver pid>-<token>-``): a driver's pid means something only on
    its own machine, so clean-up looks only at names of this machine."""
    return f"{PREFIX}{_machine()}-{os.getpid()}-{token}-"


def available() -> bool:
    """Whether this machine has a writable ``/dev/shm`` to put upload files in."""
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


class UploadArena:
    """A host's file of :data:`SLOTS` slots of ``slot_bytes`` each (created sparse: only
    the pages written take memory)."""

    def __init__(self, path: Path, slot_bytes: int) -> None:
        page = mmap.PAGESIZE
        self.path = path
        self.slot_bytes = -(-slot_bytes // page) * page
        self._reserved = [0] * SLOTS  # bytes of each slot given memory (posix_fallocate)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(self._fd, SLOTS * self.slot_bytes)
            self._map = mmap.mmap(self._fd, SLOTS * self.slot_bytes)
        except BaseException:
            os.close(self._fd)
            path.unlink(missing_ok=True)
            raise
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)

    def rows(self, slot: int, n_rows: int, row_elements: int) -> np.ndarray:
        """``n_rows`` float32 rows of ``row_elements`` in slot ``slot`` (writable).

        Their memory is reserved first (``posix_fallocate``): the file is sparse, and a
        write to a page a full ``/dev/shm`` cannot back would kill the process (SIGBUS);
        a reservation that does not fit raises :class:`OSError` (ENOSPC) instead."""
        if not 0 <= slot < SLOTS:
            raise ValueError(f"slot {slot} is not in 0..{SLOTS - 1}")
        nbytes = n_rows * row_elements * 4
        if nbytes > self.slot_bytes:
            raise ValueError(
                f"{n_rows} rows of {row_elements} floats do not fit a slot "
                f"of {self.slot_bytes} bytes"
            )
        start = slot * self.slot_bytes
        if nbytes > self._reserved[slot]:
            os.posix_fallocate(self._fd, start, nbytes)
            self._reserved[slot] = nbytes
        return self._bytes[start : start + nbytes].view(np.float32).reshape(n_rows, row_elements)

    def offset(self, slot: int) -> int:
        return slot * self.slot_bytes


@dataclass(frozen=True)
class SharedUploadRows:
    """A host call's uploads in its shared file: row ``i`` of the ``len(client_ids)`` rows
    of ``row_elements`` float32 at byte ``offset`` is the upload of ``client_ids[i]``
    (read like the ``{client_id: upload}`` dict a host otherwise hands over). The rows
    are read-only views, valid until the host writes that slot again."""

    path: str
    offset: int
    client_ids: list[int]
    row_elements: int

    def items(self):
        n = len(self.client_ids)
        data = mapped(self.path)
        count = n * self.row_elements
        rows = data[self.offset // 4 : self.offset // 4 + count].reshape(n, self.row_elements)
        return zip(self.client_ids, rows, strict=True)


_READERS: dict[str, np.ndarray] = {}  # path -> the whole file, mapped read-only


def mapped(path: str, remove_name: bool = True) -> np.ndarray:
    """The file at ``path`` as read-only float32, mapped once per process. An upload
    file's one reader (the central server) then removes the file's name
    (``remove_name``): its memory stays while the host and the server have it mapped and
    is freed when both are gone, on whichever node they run. The global model's board
    (:mod:`mecsim.run.backends.shared_model`) has several readers and keeps its name."""
    arr = _READERS.get(path)
    if arr is None:
        fd = os.open(path, os.O_RDONLY)
        try:
            mapping = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        if remove_name:
            Path(path).unlink(missing_ok=True)
        arr = _READERS[path] = np.frombuffer(mapping, dtype=np.float32)
    return arr


def remove(prefix: str) -> None:
    """Remove every upload file of ours whose name starts with ``prefix`` (mappings stay
    valid until their processes let go of them)."""
    for path in SHM_DIR.glob(f"{prefix}*"):
        _unlink_own(path)


def remove_stale() -> None:
    """Remove this user's upload files of drivers on this machine that are no longer
    running (another user's files, or another machine's, are left alone)."""
    mine = f"{PREFIX}{_machine()}-"
    for path in SHM_DIR.glob(f"{mine}*"):
        pid = path.name[len(mine) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _unlink_own(path)


def _unlink_own(path: Path) -> None:
    """Remove ``path`` if this user owns it; a file gone meanwhile, or one that cannot be
    removed, is not an error (clean-up never stops a run)."""
    try:
        if path.stat().st_uid == os.getuid():
            path.unlink()
    except OSError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
