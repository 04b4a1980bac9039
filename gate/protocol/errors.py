"""The one exception type of the protocol layer."""

from __future__ import annotations

from gate.errors import GateError


class ProtocolError(GateError):
    """A hitl/v0 envelope or header was refused.

    ``code`` is the SPEC §2 reason (``signature_missing``, ``timestamp_out_of_window``,
    ``missing_field:nonce`` ...); ``status``/``kind`` are the HTTP status and the
    ``status`` string of the answer body (``unauthorized``, ``invalid``).
    """
