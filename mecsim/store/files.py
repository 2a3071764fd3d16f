"""Files of a run folder written atomically: a reader sees the old file or the new one,
never a part (a temporary name in the same folder, flushed, fsync'ed, renamed into place,
the folder fsync'ed)."""

from __future__ import annotations

import os
from pathlib import Path

from mecsim.run.interrupts import atomic_section


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with atomic_section():
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())
