"""What this machine's disk charges in CPU for an exchange cycle's file work, whatever the server around it.

floor: the contract's minimum per put as bare os calls — write a temp file, fsync it, rename it into place,
       fsync the folder (API.md: a 2xx means the body is on disk, file and folder) — and the commit's unlink.
disk:  the same cycle's file work through ``mainspring.exchange.files.Disk`` (10 puts into one of 100
       mailbox folders, then the commit's 10 deletes with their folder fsync), as the server does it.
one-folder: N threads putting into one mailbox folder at once through ``Disk`` (many producers, one
       mailbox): CPU and wall per put, and how many folder fsyncs they made.

    .venv/bin/python -m bench.exchange_floor floor --puts 1000
    .venv/bin/python -m bench.exchange_floor disk --cycles 300
    .venv/bin/python -m bench.exchange_floor one-folder --puts 2000 --threads 8
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mainspring.exchange import files

BODY = b"x" * 512


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _put(folder: str, name: str, sync: Callable[[int], None] | None, folder_sync: bool) -> None:
    temp = f"{folder}/.{name}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    os.write(fd, BODY)
    if sync is not None:
        sync(fd)
    os.close(fd)
    os.replace(temp, f"{folder}/{name}")
    if folder_sync:
        _fsync_folder(folder)


def _timed(label: str, count: int, step: Callable[[int], None]) -> None:
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(count):
        step(i)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"{label:44s} CPU {1000 * cpu / count:.3f} ms/op, wall {1000 * wall / count:.3f} ms/op", flush=True)


def floor(root: Path, count: int) -> None:
    folder = str(root)
    _timed("put: write+fsync+rename+folder fsync", count, lambda i: _put(folder, f"a{i}", os.fsync, True))
    _timed("put with fdatasync instead of fsync", count, lambda i: _put(folder, f"b{i}", os.fdatasync, True))
    _timed("put without the folder fsync", count, lambda i: _put(folder, f"c{i}", os.fsync, False))
    _timed("put without any fsync", count, lambda i: _put(folder, f"d{i}", None, False))
    os.sync()
    _timed("the commit's unlink (of an fsynced file)", count, lambda i: os.unlink(f"{folder}/a{i}"))
    _timed("a folder fsync alone", count, lambda i: _fsync_folder(folder))


def through_disk(root: Path, cycles: int) -> None:
    disk = files.Disk(root)
    for box in range(100):
        disk.write_atomic(files.mailbox_path(f"mobile-{box}", "erp", "warm"), b"x")

    def cycle(k: int) -> None:
        paths = [files.mailbox_path(f"mobile-{k % 100}", "erp", f"m{k}-{i}") for i in range(10)]
        for path in paths:
            disk.write_atomic(path, BODY)
        with disk.deferred_fsync():  # as the commit's batch of deletes (sync._apply_all)
            for i, path in enumerate(paths):
                disk.remove([path, path, files.unknown_path(f"p{k}", f"m{k}-{i}")])

    _timed("cycle's file work through Disk (10 + 10)", cycles, cycle)


def one_folder(root: Path, puts: int, threads: int) -> None:
    disk = files.Disk(root)
    disk.write_atomic(files.mailbox_path("erp", "db", "warm"), b"x")
    folder_fsyncs = [0]
    real_fsync = files._fsync

    def counting(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            folder_fsyncs[0] += 1
        real_fsync(fd)

    files._fsync = counting
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(lambda i: disk.write_atomic(files.mailbox_path("erp", "db", f"m{i}"), BODY), range(puts)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        files._fsync = real_fsync
    print(f"{puts} puts on {threads} threads into one folder: CPU {1000 * cpu / puts:.3f} ms/put, "
          f"wall {1000 * wall / puts:.3f} ms/put, {folder_fsyncs[0]} folder fsyncs", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("floor").add_argument("--puts", type=int, default=1000)
    sub.add_parser("disk").add_argument("--cycles", type=int, default=300)
    shared = sub.add_parser("one-folder")
    shared.add_argument("--puts", type=int, default=2000)
    shared.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-exchange-floor-"))
    try:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        if args.command == "floor":
            floor(root, args.puts)
        elif args.command == "disk":
            through_disk(root, args.cycles)
        else:
            one_folder(root, args.puts, args.threads)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
