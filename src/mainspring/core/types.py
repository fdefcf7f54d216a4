"""Validated field types shared by every face's models."""

from __future__ import annotations

import codecs
import math
import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    RootModel,
    StringConstraints,
)
from pydantic.config import JsonDict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

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


NO_NUL = r"^[^\x00]*$"
"""Text without NUL (which PostgreSQL cannot store), as a JSON Schema pattern."""
_NoNul = Field(json_schema_extra={"pattern": NO_NUL})


class KeysMatch:
    """For ``Annotated[dict[K, V], KeysMatch()]`` with a pattern on ``K``: the JSON schema says that every key
    matches it (``propertyNames``) — pydantic's ``patternProperties`` only constrains the keys that do, and
    lets any other through."""

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core_schema)
        ((pattern, value),) = schema.pop("patternProperties").items()
        return {**schema, "additionalProperties": value, "propertyNames": {"pattern": pattern}}


_NoNulText = Annotated[str, Field(pattern=NO_NUL)]


# The shape of ``JsonValue`` in the API description (a recursive schema); never used to validate.
class StoredJson(RootModel[None | bool | int | float | _NoNulText | list["StoredJson"]
                          | Annotated[dict[_NoNulText, "StoredJson"], KeysMatch()]]):
    """A JSON value the server stores as it is given: no string or key holds NUL (which PostgreSQL cannot
    store); at most 64 levels deep and 50,000 arrays and objects."""


class _DescribedAsJson:
    """Validation stays ``_check_json`` on any value (one pass, no union to try); the API description shows
    the same rule as a schema — any JSON whose strings and keys hold no NUL — so a client (or a fuzzer)
    sees what is accepted."""

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return handler(StoredJson.__pydantic_core_schema__)


# A JSON value a client stores (data, args, results): free shape, but storable on both engines.
JsonValue = Annotated[Any, AfterValidator(_check_json), _DescribedAsJson()]

# Free text a client stores (errors, details, worker names).
Text = Annotated[str, StringConstraints(max_length=10_000), AfterValidator(_check_json), _NoNul]
ShortText = Annotated[str, StringConstraints(max_length=400), AfterValidator(_check_json), _NoNul]
# Longer text a client sends: a handler's traceback (``error_detail``), kept to its last 16,000 characters.
LongText = Annotated[str, StringConstraints(max_length=20_000), AfterValidator(_check_json), _NoNul]

# Rules between fields, for a model's ``json_schema_extra``: what its ``model_validator`` checks, said in the
# API description too, so that a request the description allows is one the server takes.

def given(name: str) -> JsonDict:
    """The field is present and not null."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


def _not_null(schema: JsonDict) -> JsonDict:
    schema = {k: v for k, v in schema.items() if k != "default"}
    options = schema.pop("anyOf", None)
    if isinstance(options, list):
        kept = [o for o in options if o != {"type": "null"}]
        schema.update(kept[0] if len(kept) == 1 else {"anyOf": kept})  # type: ignore[arg-type]
    return schema


def exactly_one(*names: str) -> Callable[[JsonDict], None]:
    """The object has exactly one of ``names``, not null (``check_exactly_one`` refuses the rest), described as
    one object shape per name: each with that field required and the others absent. A shape per name, not a
    ``oneOf`` of "this one is not null" rules beside the fields: a client (or a fuzzer) building a body field by
    field from the description then builds one the server takes."""

    def rewrite(schema: JsonDict) -> None:
        properties = schema.pop("properties")
        assert isinstance(properties, dict)
        required = [r for r in schema.pop("required", []) or [] if isinstance(r, str)]  # type: ignore[union-attr]
        common = {k: v for k, v in properties.items() if k not in names}
        schema["oneOf"] = [
            {"type": "object", "properties": {**common, name: _not_null(properties[name])},  # type: ignore[arg-type]
             "required": [*required, name], "additionalProperties": False}
            for name in names
        ]
        schema.pop("additionalProperties", None)
        schema.pop("type", None)

    return rewrite


def check_exactly_one(model: BaseModel, *names: str) -> None:
    """ValueError unless exactly one of ``names`` was given, and not as null (``exactly_one``'s rule)."""
    # One set operation (this runs for each outcome of a 1,000-entry release batch).
    given_names = model.model_fields_set.intersection(names)
    if len(given_names) != 1 or getattr(model, next(iter(given_names))) is None:
        raise ValueError(f"give exactly one of {', '.join(names)}, not null")


def not_all(*conditions: JsonDict) -> JsonDict:
    return {"not": {"allOf": list(conditions)}}


def all_of(*rules: JsonDict) -> JsonDict:
    return {"allOf": list(rules)}


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
    """The paging parameter every list takes; each list adds its ``cursor`` (the ``next_cursor`` of the previous
    page), of the shape its sort key has (``core.paging``)."""

    limit: Limit = 100
