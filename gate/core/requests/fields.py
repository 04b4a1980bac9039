"""Fields every kind of request parses the same way (SPEC §3 POST /v1/approvals and
/v1/questions): names, ``requested_by``, the ``Idempotency-Key`` header."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from gate.errors import GateError, refused
from gate.protocol.display import marked
from gate.protocol.envelope import is_unicode
from gate.protocol.whitespace import is_blank

MAX_NAME_CHARS = 200
# the longest Idempotency-Key accepted, in characters (docs/openapi.yaml IdempotencyKey)
MAX_IDEMPOTENCY_KEY_CHARS = 200


def invalid(code: str, field: str, message: str, status: int = 400) -> GateError:
    """``status`` (400) ``code`` of kind ``invalid``, naming the request ``field`` at fault
    (its JSON path), with ``message``."""
    return GateError(code, message, status=status, kind="invalid", extra={"field": field})


def bad_field(field: str, message: str) -> GateError:
    """400 ``invalid_<field>`` (``field`` the JSON path) with ``message``."""
    return invalid(f"invalid_{field}", field, message)


def has_control_characters(text: str) -> bool:
    """True when ``text`` holds a C0 control character (U+0000-U+001F) or DEL (U+007F):
    text a relay may put in a header or a card (CR/LF would inject a header)."""
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def idempotency_key_fits(key: str) -> bool:
    """The shape every ``Idempotency-Key`` must have (SPEC §3, docs/openapi.yaml): 1 to
    ``MAX_IDEMPOTENCY_KEY_CHARS`` characters, not blank (not only White_Space). ``hitl-gate
    request --idempotency-key`` applies it too, and also refuses control characters."""
    return not is_blank(key) and len(key) <= MAX_IDEMPOTENCY_KEY_CHARS


def check_idempotency_key(key: str | None) -> str | None:
    """Return the API's ``Idempotency-Key`` header (None when absent) once it fits
    (``idempotency_key_fits``) and is valid UTF-8 (aiohttp keeps header bytes that are not
    UTF-8 as lone surrogates, which SQLite cannot bind). Raises GateError 400
    ``invalid_idempotency_key`` (field ``idempotency_key``)."""
    if key is not None and not (idempotency_key_fits(key) and is_unicode(key)):
        raise bad_field(
            "idempotency_key",
            f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} UTF-8 characters",
        )
    return key


def not_an_operator(given: str, operators: Sequence[tuple[int, str]]) -> GateError:
    """400 ``invalid_requested_by`` for a ``requested_by`` that names none of ``operators``
    (``(id, identity)`` pairs), echoing ``given`` (``_echoed``) and saying what it must be:
    for an operator's numeric id, that operator's identity; else the configured identity
    closest to ``given`` (a typo, or the part before ``@``) when one is close, else the
    first identity as an example."""
    identities = [identity for _, identity in operators]
    by_id = {str(op_id): identity for op_id, identity in operators}
    key = given.strip().casefold()
    if key in by_id:
        message = (
            f"{key} is an operator id; requested_by takes the operator's identity: {by_id[key]}"
        )
        return refused("invalid_requested_by", "requested_by", message)
    folded = {identity.casefold(): identity for identity in identities}
    local = {identity.casefold().split("@")[0]: identity for identity in identities}
    close = difflib.get_close_matches(key, folded, n=1, cutoff=0.85)
    near = folded[close[0]] if close else None
    if near is None:
        close = difflib.get_close_matches(key, local, n=1, cutoff=0.85)
        near = local[close[0]] if close else None
    said = f'requested_by "{_echoed(given, identities)}" is not the identity of an operator'
    said += " in relay.operators"
    message = f"{said}; did you mean {near}?" if near else f"{said}, e.g. {identities[0]}"
    return refused("invalid_requested_by", "requested_by", message)


def _echoed(given: str, identities: Sequence[str]) -> str:
    """``given`` (an identity that matched none of ``identities``) as an error message echoes
    it: on one line, each hidden character and each non-ASCII one that no configured identity
    has (a Cyrillic ``о`` in a Latin address) shown as ``<U+XXXX>``."""
    known = {c for identity in identities for c in identity}
    suspect = {c for c in given if not c.isascii() and c not in known}
    return marked(given, keep="", suspect=suspect)


def opened(obj: Any) -> tuple[dict[str, Any], str, str, str | None, str | None]:
    """What every create body opens with: ``obj`` (decoded JSON) as an object, its
    ``pipeline`` and ``step`` (required), ``run_id`` and ``requested_by`` (optional), each a
    name (``name_field``), checked in that order. Raises GateError 400 ``invalid_json``,
    ``invalid_<field>``."""
    if not isinstance(obj, dict):
        raise bad_field("json", "body must be a JSON object")
    pipeline = name_field(obj, "pipeline", required=True)
    step = name_field(obj, "step", required=True)
    run_id = name_field(obj, "run_id", required=False)
    requested_by = name_field(obj, "requested_by", required=False)
    assert pipeline is not None and step is not None
    return obj, pipeline, step, run_id, requested_by


def name_field(obj: dict[str, Any], key: str, *, required: bool) -> str | None:
    """``obj[key]``: a non-blank string of at most ``MAX_NAME_CHARS`` characters, valid
    Unicode (None when absent and not ``required``). Raises 400 ``invalid_<key>``."""
    value = obj.get(key)
    if value is None:
        if required:
            raise bad_field(key, f"{key} is required")
        return None
    if not isinstance(value, str) or is_blank(value):
        raise bad_field(key, f"{key} must be a non-empty string")
    if len(value) > MAX_NAME_CHARS:
        raise bad_field(key, f"{key} is longer than {MAX_NAME_CHARS} characters")
    if not is_unicode(value):
        raise bad_field(key, f"{key} is not valid Unicode (lone surrogate)")
    return value
