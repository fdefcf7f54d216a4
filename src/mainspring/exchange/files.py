"""Message bodies on disk under ``<data_dir>/exchange/``.

Layout: ``mailboxes/<addressee>/<database>/<message_id>``, ``backup/<addressee>/<database>/<message_id>``,
``unknown/<process_id>/<message_id>``. Every name in a path is a validated ``Name`` or an id this server made,
so no path leaves the root.

Writes are atomic (temp file, fsync, rename, fsync the folder). Moves and deletes are idempotent: ``place``
and ``remove`` look at where the file is now and do only what is left, so re-running the same step after a
crash (or on another server) ends in the same state.

The module-level ``_replace``, ``_unlink``, ``_fsync``, ``_syncfs`` and ``_write`` are the only calls that change
the disk; tests replace them to simulate a failing disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import sys
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_replace = os.replace
_unlink = os.unlink
_fsync = os.fsync

WHOLE_FILESYSTEM_AFTER = 64
"""A batch of moves that touched at least this many folders is made durable by one ``syncfs`` per filesystem
instead of one fsync per folder: on ext4 every folder fsync is a journal commit of its own (measured 1.9 ms
each for 2,000 folders, against 29 ms for one syncfs after all of them), and start-up recovery of an
IN_DOUBT process touches two folders of its own. Smaller batches keep the per-folder fsyncs: a syncfs also
writes back whatever else is dirty on that filesystem."""

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _syncfs(fd: int) -> None:
    """Make everything on the filesystem that holds ``fd`` durable (Linux ``syncfs``, which reports write-back
    errors since 5.8)."""
    if _libc is None or _libc.syncfs(fd) != 0:
        code = ctypes.get_errno() if _libc is not None else errno.ENOSYS
        raise OSError(code, os.strerror(code))


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def mailbox_path(addressee: str, database: str, message_id: str) -> str:
    return f"mailboxes/{addressee}/{database}/{message_id}"


def backup_path(addressee: str, database: str, message_id: str) -> str:
    return f"backup/{addressee}/{database}/{message_id}"


def unknown_path(process_id: str, message_id: str) -> str:
    return f"unknown/{process_id}/{message_id}"


class Disk:
    """The exchange folder of one data dir."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._inside = str(self.root) + os.sep
        self._local = threading.local()

    @contextlib.contextmanager
    def deferred_fsync(self) -> Iterator[set[Path]]:
        """Collect the folder fsyncs of the moves in this block and do them at the end, once per folder (in
        parallel, or as one ``syncfs`` when there are many). Yields the collecting set, so that other threads
        can add their moves to it (``deferring_into``). Raises OSError if any fails: then nothing in the block
        counts."""
        pending: set[Path] = set()
        with self.deferring_into(pending):
            yield pending
        self._flush(pending)

    @contextlib.contextmanager
    def deferring_into(self, pending: set[Path]) -> Iterator[None]:
        """In this thread, add the folders to fsync to ``pending`` (another thread's ``deferred_fsync``)."""
        previous = getattr(self._local, "pending", None)
        self._local.pending = pending
        try:
            yield
        finally:
            self._local.pending = previous

    def _flush(self, pending: set[Path]) -> None:
        folders = [f for f in pending if f.exists()]
        if len(folders) >= WHOLE_FILESYSTEM_AFTER and _libc is not None:
            self._sync_filesystems(folders)
            return
        if len(folders) <= 1:
            for folder in folders:
                self._fsync_now(folder)
            return
        with ThreadPoolExecutor(max_workers=min(16, len(folders))) as pool:
            list(pool.map(self._fsync_now, folders))

    def _sync_filesystems(self, folders: list[Path]) -> None:
        # A folder of the exchange may be another filesystem's mount point (backup/ on its own disk): one
        # syncfs per filesystem the folders are on.
        by_device: dict[int, Path] = {}
        for folder in folders:
            by_device.setdefault(folder.stat().st_dev, folder)
        for folder in by_device.values():
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                _syncfs(fd)
            finally:
                os.close(fd)

    def full(self, relative: str) -> Path:
        # Checked on the path's text, not by resolving it: resolving asks the disk about every folder on the
        # way (it was a quarter of the file threads' time, holding the GIL), and the names in a path are
        # validated anyway; this keeps ``..`` and absolute paths out.
        path = os.path.normpath(os.path.join(self.root, relative))
        if not path.startswith(self._inside):
            raise ValueError(f"path {relative!r} leaves the exchange folder")
        return Path(path)

    def _fsync_dir(self, folder: Path) -> None:
        pending = getattr(self._local, "pending", None)
        if pending is not None:
            pending.add(folder)
            return
        self._fsync_now(folder)

    def _fsync_now(self, folder: Path) -> None:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            _fsync(fd)
        finally:
            os.close(fd)

    def _make_dirs(self, folder: Path) -> None:
        # A folder created here is fsynced into its parent, else a crash could drop it with the file in it.
        missing = []
        current = folder
        while not current.exists():
            missing.append(current)
            current = current.parent
        if not missing:
            # The usual case (a mailbox's folder): no mkdir, which would fail with EEXIST and stat again.
            return
        folder.mkdir(parents=True, exist_ok=True)
        for created in reversed(missing):
            self._fsync_dir(created.parent)

    def _make_missing_dir(self, folder: Path) -> None:
        """``_make_dirs`` for a folder that is likely missing: one mkdir when its parent is there."""
        try:
            folder.mkdir()
        except FileExistsError:
            return
        except FileNotFoundError:
            self._make_dirs(folder)
            return
        self._fsync_dir(folder.parent)

    def write_atomic(self, relative: str, data: bytes) -> None:
        """Write ``data`` to ``relative`` so that after a crash it is either whole or absent."""
        target = self.full(relative)
        self._make_dirs(target.parent)
        temp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        try:
            try:
                _write(fd, data)
                _fsync(fd)
            finally:
                os.close(fd)
            _replace(temp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        self._fsync_dir(target.parent)

    def read(self, candidates: Iterable[str | None]) -> bytes | None:
        """The bytes of the first candidate path that exists, or None."""
        for relative in candidates:
            if relative is None:
                continue
            try:
                return self.full(relative).read_bytes()
            except FileNotFoundError:
                continue
        return None

    def find_quarantined(self, message_id: str) -> bytes | None:
        """The bytes of a message left in some ``unknown/<process_id>/`` after interrupted moves."""
        for path in sorted((self.root / "unknown").glob(f"*/{message_id}")):
            try:
                return path.read_bytes()
            except FileNotFoundError:
                continue
        return None

    def quarantined_paths(self, message_id: str) -> list[str]:
        return [str(p.relative_to(self.root)) for p in sorted((self.root / "unknown").glob(f"*/{message_id}"))]

    def mailbox_files(self) -> Iterator[str]:
        """The relative path of every file under ``mailboxes/<addressee>/<database>/``, temp files included."""
        base = self.root / "mailboxes"
        for addressee in _folders(base):
            for database in _folders(Path(addressee.path)):
                with contextlib.suppress(FileNotFoundError), os.scandir(database.path) as entries:
                    for entry in entries:
                        if entry.is_file(follow_symlinks=False):
                            yield f"mailboxes/{addressee.name}/{database.name}/{entry.name}"

    def exists(self, relative: str) -> bool:
        return self.full(relative).exists()

    def place(self, target: str, candidates: Iterable[str | None]) -> bool:
        """Make the file be at ``target``, moving it from the first candidate that has it.

        Answers False when the file is nowhere, the target included, after every place was looked at (a
        message lost outside Mainspring); raises OSError when the disk refuses.
        """
        destination = self.full(target)
        if destination.exists():
            return True
        for relative in candidates:
            if relative is None or relative == target:
                continue
            source = self.full(relative)
            # The rename is tried first: it fails only when the source is not there or the target's folder
            # is not made yet (a new unknown/<process_id>/). Each file call here is also a wait for the GIL
            # when the event loop is busy (start-up recovery records batches meanwhile): fewer calls, shorter.
            try:
                _replace(source, destination)
            except FileNotFoundError:
                if not source.exists():
                    continue
                self._make_missing_dir(destination.parent)
                try:
                    _replace(source, destination)
                except FileNotFoundError:
                    # Another server moved it first.
                    if destination.exists():
                        return True
                    continue
            self._fsync_dir(destination.parent)
            if source.parent != destination.parent:
                self._fsync_dir(source.parent)
            return True
        # Last resort, after interrupted moves through several quarantines: any unknown/*/<name>.
        strays = [p for p in self.quarantined_paths(destination.name) if p != target]
        if strays:
            return self.place(target, strays)
        # Another server (or recovery beside the watchdog) may have made the same move between our first
        # look at the target and our look at the candidates: the file is missing only if it is not here either.
        return destination.exists()

    def remove(self, candidates: Iterable[str | None]) -> None:
        """Delete the file wherever it may be; deleting what is already gone succeeds."""
        # A place named twice (a file's last path is often its mailbox path too) is tried once.
        for relative in dict.fromkeys(candidates):
            if relative is None:
                continue
            path = self.full(relative)
            try:
                _unlink(path)
            except FileNotFoundError:
                continue
            self._fsync_dir(path.parent)
            self._prune(path.parent)

    def discard(self, relative: str) -> None:
        """Best-effort delete of a file nothing refers to (a store that lost its race)."""
        with contextlib.suppress(OSError):
            self.remove([relative])

    def _prune(self, folder: Path) -> None:
        # Empty unknown/<process_id>/ folders would pile up; mailbox folders stay.
        if folder.parent.name == "unknown" and folder.parent.parent == self.root:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _folders(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as entries:
            return [e for e in entries if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
