"""hitl/v0 envelopes: build the dispatch, parse a decision (SPEC §2 check 5). Pure."""

from __future__ import annotations

import functools
import json
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from gate.protocol import PROTOCOL
from gate.protocol.canonical import finite_float, no_duplicate_keys, reject_json_constant, whole_int
from gate.protocol.errors import ProtocolError, field_refused
from gate.protocol.times import _is_rfc3339, rfc3339
from gate.protocol.whitespace import is_blank

if TYPE_CHECKING:
    from gate.protocol.followup import FollowUp

VERBS = ("approve", "skip", "adjust")
ACTIONS: list[dict[str, str]] = [
    {"verb": "approve"},
    {"verb": "skip"},
    {"verb": "adjust", "accepts": "text"},
]
MAX_ID_CHARS = 128
MAX_IDENTITY_CHARS = 320
MAX_LABEL_CHARS = 256
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Decision:
    """A decision envelope that passed SPEC §2 check 5 (shape only; nothing about state)."""

    approval_id: str
    nonce: str
    decision: str
    payload_hash: str
    approver_id: str
    approver_display: str | None
    approver_channel: str | None
    adjust_text: str | None
    decided_at: str
    # additive: why, as the relay sent it (None: absent or null); check 12 judges
    # blank and length
    reason: str | None = None
    # additive: the ``approver_assertion`` JSON value as sent (None: absent or
    # null). Its shape is parsed where the step's ``approver_signature`` is known (``off``
    # ignores the field entirely): ``gate.core.approvals.approver_signature_check``
    approver_assertion: Any = None

    def __reduce__(self) -> tuple[type[Decision], tuple[Any, ...]]:
        # pickled to the writer process with every decision: fields by position, not the
        # slower generic state of a slotted dataclass
        return (Decision, _DECISION_FIELDS(self))


_DECISION_FIELDS = operator.attrgetter(*(field.name for field in fields(Decision)))


def _invalid(field: str, message: str) -> ProtocolError:
    return ProtocolError(
        f"invalid_{field}", message, status=400, kind="invalid", extra={"field": field}
    )


def decode_json(raw: bytes) -> Any:
    """Decode raw bytes as UTF-8 (a leading BOM allowed) JSON; duplicate keys, NaN and numbers
    too large to be finite (``1e999``) refused.

    The Content-Type and its charset are ignored (case H07). Raises ProtocolError 400
    ``invalid_json`` with a one-line message.
    """
    if raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM) :]
    try:
        text = raw.decode("utf-8")
        return json.loads(
            text,
            object_pairs_hook=no_duplicate_keys,
            parse_constant=reject_json_constant,
            parse_float=finite_float,
            parse_int=whole_int,
        )
    except UnicodeDecodeError:
        raise _invalid("json", "body is not valid UTF-8") from None
    except RecursionError:
        raise _invalid("json", "body nests too deeply") from None
    except ValueError as exc:
        raise _invalid("json", f"body is not valid JSON: {exc}") from None


def is_unicode(value: str) -> bool:
    """False for a string holding a lone surrogate (a JSON ``\\ud800`` escape): not UTF-8.
    The one test of it for every text the gate, its relays and its clients take in."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# a key that may name a field in a reason code (``invalid_<field>``); under any other key a
# string is reported at the key's parent (``json`` at the top)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
_INDEX = re.compile(r"\[\d+\]")


def lone_surrogate_field(value: Any) -> str | None:
    """The JSON path of the first string (in document order) of decoded JSON ``value`` that
    holds a lone surrogate, or None when there is none: ``label``, ``draft.body``,
    ``options[1]``, ``json`` for a top-level string or array. A key holding one, or a key that
    is not a plain name (``[A-Za-z0-9_-]``, at most 64), is reported at its parent."""
    return _first_string(value, lambda text: not is_unicode(text))


def nul_field(value: Any) -> str | None:
    """The JSON path of the first string of decoded JSON ``value`` that holds U+0000 (NUL),
    or None when there is none; named as ``lone_surrogate_field`` names them."""
    return _first_string(value, lambda text: "\x00" in text)


def _first_string(value: Any, bad: Callable[[str], bool]) -> str | None:
    stack: list[tuple[str, Any]] = [("json", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if bad(item):
                return path
        elif isinstance(item, dict):
            children: list[tuple[str, Any]] = []
            for key, child in item.items():
                if bad(key):
                    children.append((path, key))  # checked (and refused) as a string
                    break
                named = _PLAIN_KEY.fullmatch(key) is not None
                inner = key if path == "json" else f"{path}.{key}"
                children.append((inner if named else path, child))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            paths = [path if path == "json" else f"{path}[{i}]" for i in range(len(item))]
            stack.extend(reversed(list(zip(paths, item, strict=True))))
    return None


def check_unicode(value: Any) -> None:
    """Refuse decoded JSON ``value`` when any of its strings or keys holds a lone surrogate
    (no UTF-8 text: it could be neither stored, hashed nor signed) or U+0000 (NUL: no text
    for PostgreSQL, and the end of a C string for whatever shows it to a human). Raises
    ProtocolError 400 ``invalid_<path>`` with ``field`` the path of the first
    (``lone_surrogate_field``, then ``nul_field``) and a ``message`` saying so; the reason
    leaves out list indices (``options[1]`` is ``invalid_options``), and inside a form
    ``schema`` it is ``invalid_schema``, as every other refusal of a schema."""
    field = lone_surrogate_field(value)
    problem = "holds a lone surrogate (such as \\ud800): not valid Unicode text"
    if field is None:
        field = nul_field(value)
        problem = "holds U+0000 (NUL): not allowed in text"
    if field is not None:
        reason = "schema" if field.startswith(("schema.", "schema[")) else _INDEX.sub("", field)
        raise field_refused("invalid_" + reason, field, f"{field} {problem}")


# what can put a lone surrogate or U+0000 into decoded JSON: only a ``\u`` escape of one
# (the UTF-8 decoder refuses encoded surrogates; the JSON decoder, a raw control character)
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


def decode_text_json(raw: bytes) -> Any:
    """``decode_json``, then ``check_unicode``: how every JSON request body is read, so a
    lone surrogate or U+0000 in any text field is refused 400 ``invalid_<field>`` before
    anything reads or writes it. The decoded value is walked only when ``raw`` holds an
    escape that could make one (a body without, most of them, is not walked twice)."""
    value = decode_json(raw)
    if _SUSPECT_ESCAPE.search(raw) is not None:
        check_unicode(value)
    return value


def string_or_none(
    obj: dict[str, Any],
    key: str,
    refuse: Callable[[str], ProtocolError],
    *,
    name: str,
    required: bool,
    what: str = "a string",
) -> str | None:
    """``obj[key]`` when it is a string; None when it is absent or null and not ``required``.
    Otherwise raises ``refuse(message)``: ``<name> is required`` or ``<name> must be <what>``
    (the first rule of every string field of check 5 and of an approver assertion)."""
    value = obj.get(key)
    if value is None:
        if required:
            raise refuse(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise refuse(f"{name} must be {what}")
    return value


_STR = "a string"  # what a field of check 5 must be, unless told otherwise


def _string(
    obj: dict[str, Any], key: str, field: str, limit: float, *, required: bool, what: str = _STR
) -> str | None:
    refuse = functools.partial(_invalid, field)
    value = string_or_none(obj, key, refuse, name=field, required=required, what=what)
    if value is None:
        return None
    if not is_unicode(value):
        raise _invalid(field, f"{field} is not valid Unicode (lone surrogate)")
    if required and is_blank(value):
        raise _invalid(field, f"{field} must not be empty")
    if len(value) > limit:
        raise _invalid(field, f"{field} is longer than {limit} characters")
    return value


def parse_decision(raw: bytes) -> Decision:
    """Parse a decision body (SPEC §2 check 5): JSON object, ``protocol`` hitl/v0, required
    fields with the right types, ``decision`` in approve|skip|adjust (a relay never sends
    ``timeout``). Unknown fields are ignored. ``reason`` (additive) is a string or
    null/absent. Raises ProtocolError 400 ``invalid_<field>``.
    """
    obj = decode_json(raw)
    if not isinstance(obj, dict):
        raise _invalid("json", "body must be a JSON object")
    return decision_from_obj(obj)


def _protocol(obj: dict[str, Any]) -> None:
    """Check 5's first field of a decision or an answer: ``protocol`` is hitl/v0."""
    if _string(obj, "protocol", "protocol", MAX_LABEL_CHARS, required=True) != PROTOCOL:
        raise _invalid("protocol", f"protocol must be {PROTOCOL!r}")


def _head(
    obj: dict[str, Any], id_key: str, hash_key: str, verb: Callable[[str], None]
) -> tuple[str, str, str, str]:
    """``(id, nonce, decision, hash)`` of a decision or an answer, required strings checked
    in wire order: the id (``approval_id`` or ``question_id``), ``nonce``, ``decision`` (then
    ``verb`` refuses one the kind does not take), the hash (``payload_hash`` or
    ``request_hash``)."""
    id_ = _string(obj, id_key, id_key, MAX_ID_CHARS, required=True)
    nonce = _string(obj, "nonce", "nonce", MAX_ID_CHARS, required=True)
    decision = _string(obj, "decision", "decision", MAX_LABEL_CHARS, required=True)
    assert id_ and nonce and decision
    verb(decision)
    hash_ = _string(obj, hash_key, hash_key, MAX_LABEL_CHARS, required=True)
    assert hash_
    return id_, nonce, decision, hash_


def _decision_verb(decision: str) -> None:
    if decision == "timeout":
        raise _invalid("decision", "a relay never sends timeout: expiry is the gate's call")
    if decision not in VERBS:
        raise _invalid("decision", "decision must be one of approve, skip, adjust")


def _approver(obj: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """``(id, display, channel)`` of the ``approver`` object of a decision or an answer:
    ``id`` required, the other two optional strings (check 5)."""
    approver = obj.get("approver")
    if not isinstance(approver, dict):
        raise _invalid("approver", "approver must be an object with an id")
    approver_id = _string(approver, "id", "approver.id", MAX_IDENTITY_CHARS, required=True)
    display = _string(approver, "display", "approver.display", MAX_LABEL_CHARS, required=False)
    channel = _string(approver, "channel", "approver.channel", MAX_LABEL_CHARS, required=False)
    assert approver_id
    return approver_id, display, channel


def _decided_at(obj: dict[str, Any]) -> str:
    """The required ``decided_at`` of a decision or an answer, an RFC 3339 date-time."""
    decided_at = _string(obj, "decided_at", "decided_at", MAX_LABEL_CHARS, required=True)
    if decided_at is None or not _is_rfc3339(decided_at):
        raise _invalid("decided_at", "decided_at must be an RFC 3339 timestamp")
    return decided_at


def decision_from_obj(obj: dict[str, Any]) -> Decision:
    """``parse_decision`` after decoding: check 5 on a decoded JSON object (the
    ``parse_callback`` decodes once, then routes here or to the answer parse)."""
    _protocol(obj)
    approval_id, nonce, decision, payload_hash = _head(
        obj, "approval_id", "payload_hash", _decision_verb
    )
    approver_id, display, channel = _approver(obj)
    # optional texts of any length (check 12 judges a reason's), a string or null
    adjust_text, reason = (
        _string(obj, key, key, math.inf, required=False, what="a string or null")
        for key in ("adjust_text", "reason")
    )
    decided_at = _decided_at(obj)
    return Decision(
        approval_id=approval_id,
        nonce=nonce,
        decision=decision,
        payload_hash=payload_hash,
        approver_id=approver_id,
        approver_display=display,
        approver_channel=channel,
        adjust_text=adjust_text if decision == "adjust" else None,
        decided_at=decided_at,
        reason=reason,
        approver_assertion=obj.get("approver_assertion"),
    )


def routing(
    run_id: str, pipeline: str, step: str, issued_at_ms: int, expires_at_ms: int, risk: str
) -> dict[str, Any]:
    """The fields every dispatch carries after its id, approval or question alike, in wire
    order: ``run_id``, ``pipeline``, ``step``, ``issued_at``, ``expires_at`` (RFC 3339),
    ``risk``."""
    return {
        "run_id": run_id,
        "pipeline": pipeline,
        "step": step,
        "issued_at": rfc3339(issued_at_ms),
        "expires_at": rfc3339(expires_at_ms),
        "risk": risk,
    }


def build_dispatch(
    *,
    approval_id: str,
    run_id: str,
    pipeline: str,
    step: str,
    issued_at_ms: int,
    expires_at_ms: int,
    risk: str,
    quorum_required: int,
    quorum_collected: int,
    approvers: Sequence[str],
    payload_hash: str,
    content_type: str,
    body: str,
    callback_url: str,
    nonce: str,
    revision: int,
    budget: dict[str, Any] | None = None,
    followup: FollowUp | None = None,
    requested_by: str | None = None,
) -> dict[str, Any]:
    """Return the dispatch envelope (SPEC §2 "Dispatch") as a dict ready for ``wire_json``.

    ``budget`` is included only when a cap is configured. ``revision`` is an additive
    field (v0 ignores unknown fields) telling relays which revision the nonce is for.
    ``requested_by`` (additive: the identity of the operator who asked) is included only
    when given; no hash covers it.
    ``followup`` adds the additive fields (reminder, escalation, delegates, a
    required skip reason); without it, or with an empty one, the envelope is unchanged.
    """
    envelope: dict[str, Any] = {
        "protocol": PROTOCOL,
        "approval_id": approval_id,
        **routing(run_id, pipeline, step, issued_at_ms, expires_at_ms, risk),
        "quorum": {"required": quorum_required, "collected": quorum_collected},
        "approvers": list(approvers),
        "payload_hash": payload_hash,
        "draft": {"content_type": content_type, "body": body},
        "actions": [dict(action) for action in ACTIONS],
        "callback": {"url": callback_url, "nonce": nonce},
        "revision": revision,
    }
    if budget is not None:
        envelope["budget"] = budget
    if requested_by is not None:
        envelope["requested_by"] = requested_by
    if followup is not None:
        followup.apply(envelope)
    return envelope


def build_decision(
    *,
    approval_id: str,
    nonce: str,
    decision: str,
    payload_hash: str,
    approver_id: str,
    decided_at_ms: int,
    display: str | None = None,
    channel: str | None = None,
    adjust_text: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """Return a decision envelope (SPEC §2 "Decision") as a dict; used by relays and tests.
    ``reason`` is included only when given."""
    envelope = {
        "protocol": PROTOCOL,
        "approval_id": approval_id,
        "nonce": nonce,
        "decision": decision,
        "payload_hash": payload_hash,
        "approver": {"id": approver_id, "display": display, "channel": channel},
        "adjust_text": adjust_text,
        "decided_at": rfc3339(decided_at_ms),
    }
    if reason is not None:
        envelope["reason"] = reason
    return envelope
