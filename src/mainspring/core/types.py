"""Validated field types shared by every face's models."""

from __future__ import annotations

import codecs
import math
import re
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

T = TypeVar("T")

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"

# Names in paths and client-chosen ids. Message files are named from them, so the pattern also keeps
# every path trick ("..", "/", NUL) out.
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]

MAX_JSON_DEPTH = 64
MAX_JSON_CONTAINERS = 50_000
"""Arrays and objects in one stored value: a 1 MiB body holds 340,000 empty arrays, and every later step
(events, storing, reading back) pays for each; no real payload needs that many."""


def _check_scalar(value: object) -> None:
    # PostgreSQL cannot store NUL, lone surrogates or NaN in text or jsonb; refusing them here keeps
    # both engines equal and turns what would be a 500 into a 422.
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("NaN and Infinity are not JSON")
    elif isinstance(value, str):
        if "\x00" in value:
            raise ValueError("NUL characters are not allowed")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError("strings must be valid Unicode (no lone surrogates)") from exc


def _check_json(value: T) -> T:
    if not isinstance(value, (dict, list)):
        _check_scalar(value)
        return value
    # Each array or object is counted as it is met, so a refusal costs no more than the limit.
    containers = 1
    pending: list[tuple[dict[object, object] | list[object], int]] = [(value, 0)]
    while pending:
        container, depth = pending.pop()
        for child in (part for pair in container.items() for part in pair) if isinstance(container, dict) else container:
            if depth >= MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(child, (dict, list)):
                containers += 1
                if containers > MAX_JSON_CONTAINERS:
                    raise ValueError(f"more than {MAX_JSON_CONTAINERS} arrays and objects in one value")
                pending.append((child, depth + 1))
            else:
                _check_scalar(child)
    return value


# A JSON value of whatever shape a client stores (data, args, results): free shape, but storable on both engines.
JsonValue = Annotated[Any, AfterValidator(_check_json)]

# Free text a client stores (errors, details, worker names).
Text = Annotated[str, StringConstraints(max_length=10_000), AfterValidator(_check_json)]
ShortText = Annotated[str, StringConstraints(max_length=400), AfterValidator(_check_json)]
# Longer text a client sends: a handler's traceback (``error_detail``), kept to its last 16,000 characters.
LongText = Annotated[str, StringConstraints(max_length=20_000), AfterValidator(_check_json)]

# RFC 9110 §8.3.1: type "/" subtype *( OWS ";" OWS parameter ), parameter values a token or a quoted string.
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[\t !#-\[\]-~]|\\[\t -~])*"'
_MEDIA_TYPE = re.compile(rf"({_TOKEN})/({_TOKEN})((?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))*)")
_PARAMETER = re.compile(rf"({_TOKEN})=({_TOKEN}|{_QUOTED})")


def check_media_type(value: str) -> str:
    """A ``Content-Type`` that can go out as a header and be read back: a media type by RFC 9110's grammar
    (so no CR, LF or other control character), and a ``charset``, when named, that Python can decode."""
    found = _MEDIA_TYPE.fullmatch(value)
    if found is None:
        raise ValueError("not a media type (type/subtype, then ; name=value parameters, in ASCII)")
    for name, raw in _PARAMETER.findall(found.group(3)):
        if name.lower() == "charset":
            try:
                codecs.lookup(raw.strip('"'))
            except LookupError:
                raise ValueError(f"unknown charset {raw[:40]!r}") from None
    return value


MediaType = Annotated[str, StringConstraints(max_length=255), AfterValidator(check_media_type),
                      Field(json_schema_extra={"pattern": f"^{_MEDIA_TYPE.pattern}$"})]

# Durations in milliseconds: non-negative, at most about 10 years.
DurationMs = Annotated[int, Field(ge=0, le=315_360_000_000)]
PositiveMs = Annotated[int, Field(ge=1, le=315_360_000_000)]
Limit = Annotated[int, Field(ge=1, le=1000)]


class Query(BaseModel):
    """A query string's parameters, validated (each operation declares its own; unknown ones are ignored)."""

    model_config = ConfigDict(extra="ignore")


class Page(Query):
    """The paging parameters every list takes."""

    limit: Limit = 100
    cursor: str | None = Field(None, max_length=500)
    """The ``next_cursor`` of the previous page."""
