"""``erlang:phash2/1`` of a binary: the hash Machinegun's Kafka sink picks a partition with (brod's ``hash``
partitioner: ``erlang:phash2(Key) rem PartitionCount``), so a machine's events land in the partition they
landed in under Machinegun and keep their order across a cutover.

No Python package computes it. This is the binary case of ``make_hash2`` in the Erlang runtime
(``erts/emulator/beam/utils.c``: Bob Jenkins' 1996 block hash seeded with ``HCONST * 13``), whose values
Erlang keeps stable across releases; ``tests/machines/test_machinegun_sink.py`` checks it against vectors
printed by a real ``erl`` (and against ``erl`` itself when it is installed).
"""

from __future__ import annotations

MASK = 0xFFFFFFFF
HCONST = 0x9E3779B9
"""The golden ratio, Jenkins' arbitrary value."""
BINARY_SEED = (HCONST * 13) & MASK
"""``HCONST_13``: make_hash2's seed for a binary."""
PHASH2_RANGE = 1 << 27
"""``phash2/1``'s range."""


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - b - c) & MASK ^ (c >> 13)
    b = (b - c - a) & MASK ^ ((a << 8) & MASK)
    c = (c - a - b) & MASK ^ (b >> 13)
    a = (a - b - c) & MASK ^ (c >> 12)
    b = (b - c - a) & MASK ^ ((a << 16) & MASK)
    c = (c - a - b) & MASK ^ (b >> 5)
    a = (a - b - c) & MASK ^ (c >> 3)
    b = (b - c - a) & MASK ^ ((a << 10) & MASK)
    c = (c - a - b) & MASK ^ (b >> 15)
    return a, b, c


def _block_hash(data: bytes, seed: int) -> int:
    a = b = HCONST
    c = seed
    whole = len(data) - len(data) % 12
    for at in range(0, whole, 12):
        a = (a + int.from_bytes(data[at : at + 4], "little")) & MASK
        b = (b + int.from_bytes(data[at + 4 : at + 8], "little")) & MASK
        c = (c + int.from_bytes(data[at + 8 : at + 12], "little")) & MASK
        a, b, c = _mix(a, b, c)
    tail = data[whole:]
    c = (c + len(data)) & MASK
    # The tail's bytes 0-3 go to a, 4-7 to b, 8-10 to c from its second byte up (its first holds the length).
    a = (a + int.from_bytes(tail[0:4], "little")) & MASK
    b = (b + int.from_bytes(tail[4:8], "little")) & MASK
    c = (c + (int.from_bytes(tail[8:11], "little") << 8)) & MASK
    return _mix(a, b, c)[2]


def phash2(data: bytes) -> int:
    """``erlang:phash2(Data)`` for a binary ``Data``: an integer in ``[0, 2**27)``."""
    hashed = BINARY_SEED if not data else _block_hash(data, BINARY_SEED)
    return hashed & (PHASH2_RANGE - 1)


def machinegun_partition(key: bytes, partitions: int) -> int:
    """The partition brod's ``hash`` partitioner gives ``key`` among ``partitions``."""
    return phash2(key) % partitions
