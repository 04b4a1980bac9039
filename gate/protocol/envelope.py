"""hitl/v0 envelopes: build the dispatch, parse a decision (SPEC §2 check 5). Pure."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gate.protocol import PROTOCOL
from gate.protocol.errors import ProtocolError
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


@functools.lru_cache(maxsize=256)
def _utc_seconds(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def rfc3339(ms: int) -> str:
    """Format unix milliseconds as RFC 3339 UTC with ``Z``; fraction only when non-zero (like Go's
    RFC3339Nano)."""
    base = _utc_seconds(ms // 1000)
    frac = ms % 1000
    return f"{base}.{frac:03d}".rstrip("0") + "Z" if frac else base + "Z"


def rfc3339_ms(ms: int) -> str:
    """Format unix milliseconds as RFC 3339 UTC with exactly three fraction digits and ``Z``
    (``2026-12-07T10:20:16.400Z``): fixed width, for what a person reads. The wire keeps
    ``rfc3339``."""
    return f"{_utc_seconds(ms // 1000)}.{ms % 1000:03d}Z"


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
    # ignores the field entirely): ``gate.core.approver_signature_check``
    approver_assertion: Any = None

    def __reduce__(self) -> tuple[type[Decision], tuple[Any, ...]]:
        # pickled to the writer process with every decision: fields by position, not the
        # slower generic state of a slotted dataclass
        return (
            Decision,
            (
                self.approval_id,
                self.nonce,
                self.decision,
                self.payload_hash,
                self.approver_id,
                self.approver_display,
                self.approver_channel,
                self.adjust_text,
                self.decided_at,
                self.reason,
                self.approver_assertion,
            ),
        )


def _invalid(field: str, message: str) -> ProtocolError:
    return ProtocolError(
        f"invalid_{field}", message, status=400, kind="invalid", extra={"field": field}
    )


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json``: raises ValueError naming a key that occurs twice
    (``duplicate key "to"``)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {json.dumps(key)}")
        out[key] = value
    return out


def reject_json_constant(name: str) -> Any:
    """``parse_constant`` hook for ``json``: NaN, Infinity and -Infinity are no JSON; raises
    ValueError naming the constant."""
    raise ValueError(f"{name} is not JSON")


def finite_float(text: str) -> float:
    """``parse_float`` hook for ``json``: a number whose value is not finite (``1e999`` would
    decode to infinity) is no JSON for the gate, like NaN; raises ValueError (the number is
    not quoted: it may be part of an answer's value)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number is too large to be finite")
    return value


MAX_INT_DIGITS = 4300  # Python's own limit for int() of text (sys.int_info)


def whole_int(text: str) -> int:
    """``parse_int`` hook for ``json``: an integer of more than ``MAX_INT_DIGITS`` digits is
    refused in the gate's words (ValueError), not Python's."""
    if len(text) - text.startswith("-") > MAX_INT_DIGITS:
        raise ValueError(f"a number has more than {MAX_INT_DIGITS} digits")
    return int(text)


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
    stack: list[tuple[str, Any]] = [("json", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not is_unicode(item):
                return path
        elif isinstance(item, dict):
            children: list[tuple[str, Any]] = []
            for key, child in item.items():
                if not is_unicode(key):
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
    (no UTF-8 text: it could be neither stored, hashed nor signed). Raises ProtocolError 400
    ``invalid_<path>`` with ``field`` the path of the first (``lone_surrogate_field``) and a
    ``message`` saying so; the reason leaves out list indices (``options[1]`` is
    ``invalid_options``), and inside a form ``schema`` it is ``invalid_schema``, as every
    other refusal of a schema."""
    field = lone_surrogate_field(value)
    if field is not None:
        message = f"{field} holds a lone surrogate (such as \\ud800): not valid Unicode text"
        reason = "schema" if field.startswith(("schema.", "schema[")) else _INDEX.sub("", field)
        raise ProtocolError(
            "invalid_" + reason,
            message,
            status=400,
            kind="invalid",
            extra={"field": field, "message": message},
        )


def decode_text_json(raw: bytes) -> Any:
    """``decode_json``, then ``check_unicode``: how every JSON request body is read, so a
    lone surrogate in any text field is refused 400 ``invalid_<field>`` before anything reads
    or writes it."""
    value = decode_json(raw)
    check_unicode(value)
    return value


def _string(obj: dict[str, Any], key: str, field: str, limit: int, *, required: bool) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise _invalid(field, f"{field} is required")
        return None
    if not isinstance(value, str):
        raise _invalid(field, f"{field} must be a string")
    if not is_unicode(value):
        raise _invalid(field, f"{field} is not valid Unicode (lone surrogate)")
    if required and is_blank(value):
        raise _invalid(field, f"{field} must not be empty")
    if len(value) > limit:
        raise _invalid(field, f"{field} is longer than {limit} characters")
    return value


# RFC 3339 §5.6 date-time: full date, "T" (or "t", or a space per its note), full time with
# seconds and an optional fraction, then "Z"/"z" or a numeric offset
_RFC3339 = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]+))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def _is_rfc3339(text: str) -> bool:
    """True when ``text`` is an RFC 3339 date-time of a real instant (``fromisoformat`` alone
    also takes a date, a time without seconds or offset, and ISO 8601's basic format)."""
    return rfc3339_to_ms(text) is not None


def rfc3339_to_ms(text: str) -> int | None:
    """The instant of the RFC 3339 date-time ``text`` as unix milliseconds (a finer fraction
    cut, not rounded); None when ``text`` is no RFC 3339 date-time of a real instant."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    day, clock, fraction, offset = match.groups()
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        when = datetime.fromisoformat(f"{day}T{clock}.{(fraction or '0')[:6]:0<6}{offset}")
    except ValueError:
        return None
    return int(when.replace(microsecond=0).timestamp()) * 1000 + when.microsecond // 1000


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


def decision_from_obj(obj: dict[str, Any]) -> Decision:
    """``parse_decision`` after decoding: check 5 on a decoded JSON object (the
    ``parse_callback`` decodes once, then routes here or to the answer parse)."""
    protocol = _string(obj, "protocol", "protocol", MAX_LABEL_CHARS, required=True)
    if protocol != PROTOCOL:
        raise _invalid("protocol", f"protocol must be {PROTOCOL!r}")
    approval_id = _string(obj, "approval_id", "approval_id", MAX_ID_CHARS, required=True)
    nonce = _string(obj, "nonce", "nonce", MAX_ID_CHARS, required=True)
    decision = _string(obj, "decision", "decision", MAX_LABEL_CHARS, required=True)
    if decision == "timeout":
        raise _invalid("decision", "a relay never sends timeout: expiry is the gate's call")
    if decision not in VERBS:
        raise _invalid("decision", "decision must be one of approve, skip, adjust")
    payload_hash = _string(obj, "payload_hash", "payload_hash", MAX_LABEL_CHARS, required=True)
    approver = obj.get("approver")
    if not isinstance(approver, dict):
        raise _invalid("approver", "approver must be an object with an id")
    approver_id = _string(approver, "id", "approver.id", MAX_IDENTITY_CHARS, required=True)
    display = _string(approver, "display", "approver.display", MAX_LABEL_CHARS, required=False)
    channel = _string(approver, "channel", "approver.channel", MAX_LABEL_CHARS, required=False)
    adjust_text = obj.get("adjust_text")
    if adjust_text is not None and not isinstance(adjust_text, str):
        raise _invalid("adjust_text", "adjust_text must be a string or null")
    if adjust_text is not None and not is_unicode(adjust_text):
        raise _invalid("adjust_text", "adjust_text is not valid Unicode (lone surrogate)")
    reason = obj.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise _invalid("reason", "reason must be a string or null")
    if reason is not None and not is_unicode(reason):
        raise _invalid("reason", "reason is not valid Unicode (lone surrogate)")
    decided_at = _string(obj, "decided_at", "decided_at", MAX_LABEL_CHARS, required=True)
    assert decided_at is not None
    if not _is_rfc3339(decided_at):
        raise _invalid("decided_at", "decided_at must be an RFC 3339 timestamp")
    assert approval_id and nonce and payload_hash and approver_id
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
        "run_id": run_id,
        "pipeline": pipeline,
        "step": step,
        "issued_at": rfc3339(issued_at_ms),
        "expires_at": rfc3339(expires_at_ms),
        "risk": risk,
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
