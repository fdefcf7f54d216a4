"""Schemathesis hooks: the project's own "no server error" check.

The contract answers 502/504 when a machine's processor fails or times out, so "no 5xx" means: never a
500 (an unhandled error) and never a 503 while the store is up.
"""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.check
def no_internal_error(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code in (500, 503):
        raise AssertionError(f"{response.status_code}: {response.text[:500]}")
    return None
