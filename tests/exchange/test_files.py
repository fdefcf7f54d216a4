"""The message-file layer on its own: paths stay inside the exchange folder; concurrent writes share folder fsyncs."""

from __future__ import annotations

import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mainspring.exchange import files


@pytest.mark.parametrize("relative", ["../outside", "mailboxes/../../outside", "/etc/passwd", "", "."])
def test_a_path_that_leaves_the_exchange_folder_is_refused(tmp_path: Path, relative: str) -> None:
    disk = files.Disk(tmp_path / "exchange")
    with pytest.raises(ValueError, match="leaves the exchange folder"):
        disk.full(relative)


def test_a_path_inside_the_exchange_folder_is_the_folder_joined_with_it(tmp_path: Path) -> None:
    disk = files.Disk(tmp_path / "exchange")
    assert disk.full("mailboxes/mobile-a/db-1/m1") == (tmp_path / "exchange/mailboxes/mobile-a/db-1/m1").resolve()
    assert disk.full("unknown/p1/../p2/m1") == disk.root / "unknown/p2/m1"


def test_concurrent_writes_into_one_folder_share_its_fsyncs_and_each_returns_after_one_that_began_after_its_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = files.Disk(tmp_path / "exchange")
    disk.write_atomic("mailboxes/a/db/m0", b"first")  # the folder exists: only its fsyncs are counted below
    folder = disk.full("mailboxes/a/db")
    first_fsync_running, release = threading.Event(), threading.Event()
    folder_fsyncs: list[set[str]] = []  # the names in the folder when each of its fsyncs began
    real_fsync = files._fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            folder_fsyncs.append(set(os.listdir(folder)))
            if len(folder_fsyncs) == 1:
                first_fsync_running.set()
                release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(files, "_fsync", fsync)
    returned: dict[str, int] = {}

    def write(name: str) -> None:
        disk.write_atomic(f"mailboxes/a/db/{name}", name.encode())
        returned[name] = len(folder_fsyncs)

    with ThreadPoolExecutor(max_workers=9) as pool:
        first = pool.submit(write, "m1")
        assert first_fsync_running.wait(10)
        # Eight more renames while the first fsync runs: they wait for it, then share one more.
        rest = [pool.submit(write, f"m{i}") for i in range(2, 10)]
        while sum(1 for name in os.listdir(folder) if not name.startswith(".")) < 10:
            time.sleep(0.01)
        release.set()
        for future in [first, *rest]:
            future.result()
    assert len(folder_fsyncs) == 2, "one fsync for the eight writes that came while the first ran"
    assert {f"m{i}" for i in range(2, 10)} <= folder_fsyncs[1], "it began after their renames"
    assert all(returned[f"m{i}"] == 2 for i in range(2, 10)), "none returned before it"


def test_a_failed_folder_fsync_fails_every_write_that_waited_for_it_even_if_a_later_one_succeeds() -> None:
    shared = files.SharedFsync()
    running, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow_ok() -> None:
        calls.append("ok")
        running.set()
        release.wait(10)

    def failing() -> None:
        calls.append("failed")
        raise OSError(5, "Input/output error")

    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(shared.run, slow_ok)
        assert running.wait(10)
        waiting = [pool.submit(shared.run, failing) for _ in range(3)]
        time.sleep(0.1)  # all three have their tickets, waiting for the running fsync
        release.set()
        assert first.result() is None
        errors = [f.exception(10) for f in waiting]
    assert calls == ["ok", "failed"], "the three waiting writes shared one fsync"
    assert all(isinstance(e, OSError) and e.errno == 5 for e in errors)
    shared.run(lambda: calls.append("ok"))  # a later write gets a new fsync of its own
    assert calls == ["ok", "failed", "ok"]
