"""The pipeline API's query parameters, read one way for approvals and questions (SPEC §3):
``?wait=`` of a long-poll and ``state``/``pipeline``/``limit``/``cursor`` of a
list. Each bad value is 400 ``invalid_<name>`` naming the parameter in ``field``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gate.errors import GateError
from gate.protocol.numbers import INTEGER_TEXT, NUMBER_TEXT
from gate.web.common import ULID_RE

MAX_WAIT_S = 300.0
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
STATES = ("pending", "resolved", "all")


def bad_query(name: str, message: str) -> GateError:
    """400 ``invalid_<name>`` with ``field`` = ``name``."""
    return GateError(f"invalid_{name}", message, extra={"field": name})


def wait_seconds(query: Mapping[str, str]) -> float | None:
    """``?wait=SECONDS`` as a float in [0, MAX_WAIT_S], or None when absent. Raises
    GateError 400 ``invalid_wait``."""
    wait = query.get("wait")
    if wait is None:
        return None
    if not NUMBER_TEXT.fullmatch(wait):
        raise bad_query("wait", "wait must be a number of seconds")
    seconds = float(wait)
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_WAIT_S:
        raise bad_query("wait", f"wait must be between 0 and {MAX_WAIT_S:g} seconds")
    return seconds


@dataclass(frozen=True, slots=True)
class ListQuery:
    """A list's parameters: ``state`` (pending|resolved|all, default all), ``pipeline``
    (None: every pipeline), ``limit`` (1..MAX_LIMIT, default DEFAULT_LIMIT) and ``cursor``
    (the ``next_cursor`` of a previous page, a ULID, or None)."""

    state: str
    pipeline: str | None
    limit: int
    cursor: str | None


def list_query(query: Mapping[str, str], cursor_names: str) -> ListQuery:
    """Read a list's parameters; ``cursor_names`` says what a cursor is in the message (e.g.
    ``"an approval_id"``). Raises GateError 400 ``invalid_state``/``invalid_limit``/
    ``invalid_cursor``."""
    state = query.get("state", "all")
    if state not in STATES:
        raise bad_query("state", "state must be pending, resolved or all")
    text = query.get("limit", str(DEFAULT_LIMIT))
    if not INTEGER_TEXT.fullmatch(text):
        raise bad_query("limit", "limit must be an integer")
    limit = int(text)
    if not 1 <= limit <= MAX_LIMIT:
        raise bad_query("limit", f"limit must be between 1 and {MAX_LIMIT}")
    cursor = query.get("cursor") or None
    if cursor is not None and not ULID_RE.fullmatch(cursor):
        raise bad_query(
            "cursor", f"cursor must be the next_cursor of a previous page ({cursor_names})"
        )
    return ListQuery(state, query.get("pipeline") or None, limit, cursor)
