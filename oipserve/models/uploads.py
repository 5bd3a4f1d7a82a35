"""Model files sent with a load (``file:<version>/<file>``), kept where the server owns them.

The model repository may be read-only (a Kubernetes volume) and is the operator's, so
uploaded files never go there. They go under one temporary directory per server,
``$TMPDIR/oipserve-<pid>-uploads-XXXX`` (mode 0700), one numbered directory per load
holding ``<model>/<version>/<file>`` as a repository would. ``ModelManager`` removes a
load's directory when its model is unloaded, replaced or fails to load, and the whole
directory at shutdown; directories left by a server that no longer runs (kill -9) are
removed when the next one first writes uploads.

Paths are checked before anything is written (``check_upload_path``): relative, no
``.``/``..`` components, no component longer than a file name may be.

All the per-file work happens in one thread, outside the lock that serialises
repository loads: base64 text (HTTP) is decoded there ``DECODE_STEP`` characters at a
time, straight into its file, so a large upload neither holds the event loop (it
releases the GIL between steps) nor keeps a decoded copy in memory, and other models'
loads do not wait for it (100,000 files took 6 s to write under the lock).
"""

from __future__ import annotations

import asyncio
import binascii
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import psutil

__all__ = ["NAME_MAX", "UploadArea", "UploadError", "UploadFiles", "check_upload_path"]

log = logging.getLogger("oipserve.uploads")

#: Longest file name component (bytes), as on Linux file systems.
NAME_MAX = 255
#: Longest relative path of one uploaded file (bytes).
PATH_MAX = 1024
_STALE = re.compile(r"^oipserve-(\d+)-uploads-")
#: Base64 characters decoded at a time (a multiple of 4): about 4 ms of one core.
DECODE_STEP = 1024 * 1024

#: The files of one load: bytes (gRPC), or base64 text (HTTP), decoded as it is written.
UploadFiles = Mapping[PurePosixPath, bytes | str]


class UploadError(ValueError):
    """A file parameter that cannot be written where it asks to be."""


def check_upload_path(relative: str) -> PurePosixPath:
    """The path of a ``file:`` parameter inside the model directory; UploadError if unsafe."""
    if not relative:
        raise UploadError("the path after 'file:' is empty")
    if "\0" in relative or "\\" in relative:
        raise UploadError("the path holds a NUL or a backslash")
    if relative.startswith("/"):
        raise UploadError("the path is absolute; it must be relative to the model directory")
    if len(relative.encode()) > PATH_MAX:
        raise UploadError(f"the path is longer than {PATH_MAX} bytes")
    parts = relative.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise UploadError(
                "the path must stay within the model directory (no empty, '.' or '..' parts)"
            )
        if len(part.encode()) > NAME_MAX:
            raise UploadError(f"the component '{part[:16]}...' is longer than {NAME_MAX} bytes")
    return PurePosixPath(*parts)


def check_layout(paths: list[PurePosixPath]) -> None:
    """UploadError if one file's path is a directory of another's (``1`` and ``1/model.onnx``)."""
    files = set(paths)
    for path in paths:
        for parent in path.parents:
            if parent in files:
                raise UploadError(
                    f"'{parent}' is given as a file and is also the directory of '{path}'"
                )


def _decode_into(out: BinaryIO, text: str, relative: PurePosixPath) -> None:
    """Write the bytes of base64 ``text`` to ``out``; UploadError if it is not base64.

    As strict as decoding it whole: padding only at the very end.
    """
    for start in range(0, len(text), DECODE_STEP):
        piece = text[start : start + DECODE_STEP]
        last = start + DECODE_STEP >= len(text)
        try:
            if not last and "=" in piece:
                raise binascii.Error("padding before the end")
            out.write(binascii.a2b_base64(piece, strict_mode=True))
        except ValueError:  # binascii.Error, or a character that is not ASCII
            raise UploadError(f"file parameter 'file:{relative}' is not valid base64") from None


def _write(target: Path, files: UploadFiles) -> None:
    target.mkdir(parents=True)
    for relative, data in files.items():
        path = target.joinpath(*relative.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as out:
            if isinstance(data, str):
                _decode_into(out, data, relative)
            else:
                out.write(data)


def _sweep_stale(base: Path) -> None:
    """Remove upload directories of servers that no longer run."""
    try:
        entries = os.listdir(base)
    except OSError:
        return
    for entry in entries:
        match = _STALE.match(entry)
        pid = int(match.group(1)) if match else 0
        if pid and pid != os.getpid() and not psutil.pid_exists(pid):
            shutil.rmtree(base / entry, ignore_errors=True)
            log.info("removed stale upload directory %s", base / entry)


class UploadArea:
    """The server's directory for uploaded model files, made on first use."""

    def __init__(self, base: Path | None = None) -> None:
        self.base = Path(base or tempfile.gettempdir())
        self.root: Path | None = None
        self._count = 0

    async def write(self, name: str, files: UploadFiles) -> Path:
        """Write ``files`` as model ``name``; returns the directory that holds ``name/``.

        The writing (and decoding) runs in a thread: the files may be large, and the
        event loop serves inference meanwhile. OSError (disk full, ...) passes through;
        UploadError for a file that is not valid base64. Nothing is left of a write that
        failed or was cancelled.
        """
        if self.root is None:
            # NOTE: in a thread too: a stale directory may hold many files.
            await asyncio.to_thread(_sweep_stale, self.base)
            if self.root is None:  # another load may have made it meanwhile
                prefix = f"oipserve-{os.getpid()}-uploads-"
                self.root = Path(tempfile.mkdtemp(prefix=prefix, dir=self.base))
        self._count += 1
        place = self.root / str(self._count)
        writing = asyncio.ensure_future(asyncio.to_thread(_write, place / name, files))
        try:
            await asyncio.shield(writing)
        except BaseException:
            # Removed once the thread is done: a cancelled load must not race its writer.
            writing.add_done_callback(lambda done: self._discard(done, place))
            raise
        return place

    def _discard(self, writing: asyncio.Future[None], place: Path) -> None:
        if not writing.cancelled():
            writing.exception()  # seen: the caller already answered with it
        self.remove(place)

    def remove(self, place: Path | None) -> None:
        """Remove one load's directory (None: nothing to remove)."""
        if place is not None:
            shutil.rmtree(place, ignore_errors=True)

    def close(self) -> None:
        """Remove everything uploaded (at shutdown)."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
