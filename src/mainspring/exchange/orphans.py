"""Message files nobody was told about: a body is written (atomically) before its row commits, so a server
killed between the two — or a commit that failed while the disk refused to delete the body — leaves a file
under ``mailboxes/`` that no message refers to. It was never acknowledged, so it is deleted once it is older
than ``exchange.orphan_grace_ms`` (by the creation time in its id, on the store's clock)."""

from __future__ import annotations

import asyncio
import logging
import re

from mainspring.core.runtime import Context, run_loop
from mainspring.exchange import data, files
from mainspring.exchange.messages import disk_of

log = logging.getLogger("mainspring.exchange")

SWEEP_CHANNEL = "exchange:orphans"

# ``m`` + 12 hex digits of epoch ms (then sequence and random): the name of a message file, or the temp file
# ``.<name>.<random>.tmp`` it is written through.
_MESSAGE_FILE = re.compile(r"^\.?(m(?P<ms>[0-9a-f]{12})[0-9a-f]{18})(\.[0-9a-f]+\.tmp)?$")


def message_id_in(file_name: str) -> tuple[str, int] | None:
    """(message id, creation epoch ms) named by a message or temp file name; None for anything else."""
    match = _MESSAGE_FILE.match(file_name)
    return (match.group(1), int(match.group("ms"), 16)) if match else None


async def sweep_orphan_files(ctx: Context) -> int:
    """Delete the message files under ``mailboxes/`` that no message row knows and that are older than the
    grace period; answers how many."""
    disk = disk_of(ctx)
    cutoff = ctx.now_ms() - ctx.settings.exchange.orphan_grace_ms
    old: dict[str, list[str]] = {}
    for relative in await asyncio.to_thread(lambda: list(disk.mailbox_files())):
        named = message_id_in(relative.rsplit("/", 1)[1])
        if named is not None and named[1] < cutoff:
            old.setdefault(named[0], []).append(relative)
    ids = sorted(old)
    removed = 0
    for start in range(0, len(ids), ctx.settings.exchange.batch_size):
        chunk = ids[start:start + ctx.settings.exchange.batch_size]
        async with ctx.store.read() as conn:
            known = await data.known_message_ids(conn, chunk)
        orphans = [relative for message_id in chunk if message_id not in known for relative in old[message_id]]
        removed += await asyncio.to_thread(_remove_all, disk, orphans)
    if removed:
        log.warning("removed %d orphan message files (written, never recorded: nobody was told they were stored)", removed)
    return removed


def _remove_all(disk: files.Disk, relatives: list[str]) -> int:
    with disk.deferred_fsync():
        for relative in relatives:
            disk.remove([relative])
    return len(relatives)


async def orphan_sweeper(ctx: Context) -> None:
    """Sweep now and then; start-up recovery sweeps too."""
    interval = ctx.settings.exchange.orphan_sweep_interval_ms

    async def sweep() -> int:
        await sweep_orphan_files(ctx)
        return ctx.now_ms() + interval

    await run_loop(ctx, "exchange-orphan-sweeper", sweep, channel=SWEEP_CHANNEL, poll_ms=interval)
