"""Domain errors: a stable machine ``code`` plus a human message; HTTP and CLI answers carry the
code."""

from __future__ import annotations


class GateError(Exception):
    """Base of every error the gate reports on purpose.

    ``code`` is the stable reason string (SPEC §2/§3 wire names such as
    ``payload_hash_mismatch``); ``status`` is the HTTP status an API answers
    with; ``message`` is one human line. ``extra`` holds additional JSON
    fields for the answer body (e.g. ``{"outcome": "approved"}``).
    """

    status: int = 400
    kind: str = "invalid"

    def __init__(
        self,
        code: str,
        message: str = "",
        *,
        status: int | None = None,
        kind: str | None = None,
        extra: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message or code)
        self.code = code
        self.message = message or code
        if status is not None:
            self.status = status
        if kind is not None:
            self.kind = kind
        self.extra = dict(extra or {})

    def body(self) -> dict[str, object]:
        """Return the JSON answer body: ``{"status": kind, "reason": code, ...extra}``."""
        out: dict[str, object] = {"status": self.kind, "reason": self.code}
        out.update(self.extra)
        return out


def refused(code: str, field: str, message: str) -> GateError:
    """400 ``code`` (kind ``invalid``) naming the request ``field`` at fault, with ``message``
    (one sentence saying what it must be) in the answer body too."""
    return GateError(code, message, extra={"field": field, "message": message})


class ConfigError(GateError):
    """The configuration is invalid. ``errors`` lists every problem as ``"<yaml.path>:
    <message>"``."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("config_invalid", "; ".join(errors), status=500, kind="error")
        self.errors = list(errors)


class NotFound(GateError):
    """A named approval, pipeline or step does not exist (HTTP 404)."""

    status = 404
    kind = "not_found"


class Conflict(GateError):
    """The request conflicts with the current state (HTTP 409)."""

    status = 409
    kind = "conflict"


class Unavailable(GateError):
    """The gate cannot serve the request right now, e.g. the database is not writable (HTTP 503)."""

    status = 503
    kind = "unavailable"


class Fenced(Unavailable):
    """This gate may write nothing more until it restarts (HTTP 503), e.g. another gate on
    its PostgreSQL database rotated the receipt key (``receipt_key_retired``): once a write
    was refused so, ``/healthz`` answers it too (``Store.check_writable``), so the balancer
    takes the gate out. Its sentence (nothing secret) is in the answer's ``message``."""
