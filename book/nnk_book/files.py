"""Writing files so that a crash, Ctrl-C or a full disk never leaves half a file behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, fsync, rename.

    Readers see either the old file or the complete new one, never a truncated mix; on
    any error (a full disk) the temporary file is removed and the old file is intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates the file readable by its owner only; give it the mode a plain
        # open() would (the existing file's, else 0o666 less the umask)
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def _mode_for(path: Path) -> int:
    """The permission bits ``path`` has now, or those a new file gets under the umask."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """:func:`atomic_write_bytes` for text."""
    return atomic_write_bytes(path, text.encode(encoding))


def write_record_json(path: str | os.PathLike, record: Any) -> Path:
    """Write a recorded run or sweep (``book/runs/``) as indented JSON, atomically, creating its
    folder: the one writer of the ``book/tools/record_*.py`` scripts."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(record, indent=1) + "\n")
