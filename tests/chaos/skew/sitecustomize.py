"""Put on a chaos server's ``PYTHONPATH``: steps the process's wall clock by the seconds written in
``$MAINSPRING_CHAOS_CLOCK_FILE``, as NTP stepping the host's clock would. The monotonic clock, which the
event loop sleeps on, is left alone.

Why not libfaketime: version 0.9.10 (Debian 12) makes Python 3.11's ``time.sleep`` fail with EINVAL when only
the wall clock is faked, and hangs timed lock waits when the monotonic clock is faked too.
"""

import os
import time

_PATH = os.environ.get("MAINSPRING_CHAOS_CLOCK_FILE")

if _PATH:
    _real_time, _real_time_ns, _monotonic = time.time, time.time_ns, time.monotonic
    _read_at = [-1.0]
    _offset_ns = [0]

    def _current_offset_ns() -> int:
        now = _monotonic()
        if now - _read_at[0] >= 0.1:
            _read_at[0] = now
            try:
                with open(_PATH) as f:
                    _offset_ns[0] = int(float(f.read()) * 1e9)
            except (OSError, ValueError):
                pass  # mid-write or gone: keep the last offset
        return _offset_ns[0]

    def _stepped_time() -> float:
        return _real_time() + _current_offset_ns() / 1e9

    def _stepped_time_ns() -> int:
        return _real_time_ns() + _current_offset_ns()

    time.time = _stepped_time
    time.time_ns = _stepped_time_ns
