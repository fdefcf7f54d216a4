"""Request and response bodies of the exchange API (API.md §1)."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from mainspring.core.paging import TimeKeyCursor
from mainspring.core.types import MediaType, Name, Page, Text, check_exactly_one, exactly_one

# Standard base64 with its padding, of at least one byte: what ``b64decode(validate=True)`` reads.
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)$"

State = Literal["STARTED", "READY_TO_COMMIT", "CLEANUP", "DONE", "CANCELLED", "ABORTED", "IN_DOUBT"]
STATES: tuple[str, ...] = ("STARTED", "READY_TO_COMMIT", "CLEANUP", "DONE", "CANCELLED", "ABORTED", "IN_DOUBT")


class Message(BaseModel):
    id: str
    addressee: str
    database: str
    size: int
    sha256: str
    content_type: str
    sender: str | None
    created_at: str


class MessageList(BaseModel):
    messages: list[Message]
    busy: bool
    active_process_id: str | None
    next_cursor: str | None = None


class Process(BaseModel):
    id: str
    addressee: str
    database: str
    client_id: str
    message_ids: list[str]
    state: State
    started_at: str
    deadline: str | None
    updated_at: str
    error: str | None = None


class ProcessList(BaseModel):
    processes: list[Process]
    next_cursor: str | None = None


class StartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    client_id: Name
    message_ids: list[Name] = Field(min_length=1, max_length=10_000)


class Reply(BaseModel):
    """A message to publish when the process commits: ``body`` (text) or ``body_base64`` (bytes)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=exactly_one("body", "body_base64"))

    addressee: Name
    database: Name
    body: Annotated[str, Field(min_length=1)] | None = None
    body_base64: Annotated[str, Field(pattern=BASE64)] | None = None
    content_type: MediaType | None = None
    message_id: Name | None = None

    @model_validator(mode="after")
    def _one_body(self) -> Reply:
        check_exactly_one(self, "body", "body_base64")
        if self.body_base64 is not None:
            try:
                base64.b64decode(self.body_base64, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError("body_base64 is not valid base64") from exc
        if not self.data():
            raise ValueError("a reply needs a body (an empty message is refused as a stored one is)")
        return self

    def data(self) -> bytes:
        if self.body_base64 is not None:
            return base64.b64decode(self.body_base64, validate=True)
        return (self.body or "").encode()

    def media_type(self) -> str:
        if self.content_type:
            return self.content_type
        return "text/plain; charset=utf-8" if self.body is not None else "application/octet-stream"


class ReadyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replies: list[Reply] = Field(default_factory=list, max_length=10_000)


class ReadyResponse(BaseModel):
    status: Literal["OK"] = "OK"
    process: Process


class CommitFailedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error: Text | None = None


class ResolveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    committed: StrictBool


class MessagesQuery(Page):
    cursor: TimeKeyCursor | None = None


class ProcessesQuery(Page):
    cursor: TimeKeyCursor | None = None
    state: Literal["STARTED", "READY_TO_COMMIT", "CLEANUP", "DONE", "CANCELLED", "ABORTED", "IN_DOUBT"] | None = None
    addressee: Name | None = None
    """Processes of this addressee's mailboxes (without it the caller needs ``admin``)."""
    database: Name | None = None


class Mailbox(BaseModel):
    addressee: str
    database: str
    available: int
    active_process_id: str | None


class MailboxList(BaseModel):
    mailboxes: list[Mailbox]
