"""The one exception type of the protocol layer."""

from __future__ import annotations

from gate.errors import GateError


class ProtocolError(GateError):
    """A hitl/v0 envelope or header was refused.

    ``code`` is the SPEC §2 reason (``signature_missing``, ``timestamp_out_of_window``,
    ``missing_field:nonce`` ...); ``status``/``kind`` are the HTTP status and the
    ``status`` string of the answer body (``unauthorized``, ``invalid``).
    """


def field_refused(code: str, field: str, message: str, *, status: int = 400) -> ProtocolError:
    """``status`` (400 unless given) ``code``, kind ``invalid``, naming the ``field`` at fault
    (a path such as ``options[2]`` or ``schema.properties.to``) with ``message`` in the answer
    body too: what ``gate.errors.refused`` is for the layers above."""
    return ProtocolError(
        code, message, status=status, kind="invalid", extra={"field": field, "message": message}
    )
