"""The approvers' public credentials as the gate serves them:
fetched over the credentials channel at start, refreshed every 60 s by
the sweep and on a sign-in or a session with an unknown credential id (unless that id was
looked up within 5 s; at most 2 such refreshes per second overall). Also says
whether the gate's relying party and the inbox's agree (else nobody can sign in)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from gate.inbox.config import RelyingParty
from gate.inbox.gate_client import GateRefused, GateUnreachable
from gate.protocol.credentials import CredentialsAnswer, ServedCredential
from gate.protocol.errors import ProtocolError
from gate.protocol.whitespace import identity_key

log = logging.getLogger(__name__)

REFRESH_EVERY_S = 60.0
UNKNOWN_EVERY_S = 5.0
UNKNOWN_PER_S = 2
NOT_YET = "the gate has not answered the inbox's request for passkeys yet"
PROBE_EVERY_S = 5.0
FETCH_FAILURES = (GateUnreachable, GateRefused, ProtocolError, OSError)
"""What a fetch of the credentials raises when the gate cannot be asked or answers wrong."""

Fetch = Callable[[], Awaitable[CredentialsAnswer]]


def rp_problem(answer: CredentialsAnswer, party: RelyingParty | None) -> str | None:
    """Why passkeys enrolled at the gate cannot sign in here, in words, or None when the
    gate's relying party (``answer.webauthn``) has the inbox's ``rp_id`` and lists one of
    the inbox's origins."""
    if party is None:
        return "the inbox has no passkey relying party (set webauthn.rp_id or public_url)"
    gate = answer.webauthn
    if gate is None:
        return "the gate has no passkey relying party (its webauthn section is off)"
    if gate.rp_id != party.rp_id:
        return f"the gate's passkeys are for {gate.rp_id!r}, the inbox is on {party.rp_id!r}"
    if not any(origin in gate.origins for origin in party.origins):
        return (
            f"the gate's webauthn.origins do not list the inbox's origin {party.origins[0]!r},"
            " so the gate would refuse its decisions"
        )
    return None


class CredentialsCache:
    """The credentials in force at the gate, keyed by credential id. ``fetch`` asks the gate
    (``gate_client.fetch_credentials`` bound to the config); ``now_s`` is a monotonic clock
    in seconds. Reads never do I/O; ``refresh``/``refresh_if_due``/``refresh_for_unknown``
    do, and never raise for an unreachable or refusing gate (they log and keep the old data)."""

    def __init__(
        self,
        fetch: Fetch,
        party: RelyingParty | None,
        now_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._party = party
        self._now_s = now_s
        self._by_id: dict[str, ServedCredential] = {}
        self._problem: str | None = NOT_YET
        self._fetched_at: float | None = None
        self._tried_at: float | None = None
        self._failure: tuple[str, str] | None = None
        self._unknown_ids: dict[str, float] = {}
        self._unknown_recent: list[float] = []

    @property
    def problem(self) -> str | None:
        """Why nobody can sign in, in words (rp mismatch, gate not answered yet), or None."""
        return self._problem

    @property
    def loaded(self) -> bool:
        """True once the gate answered at least once."""
        return self._fetched_at is not None

    def fetched_within(self, seconds: float) -> bool:
        """True when the gate last answered less than ``seconds`` seconds ago."""
        return self._fetched_at is not None and self._now_s() - self._fetched_at < seconds

    def lookup(self, credential_id: str) -> ServedCredential | None:
        """The credential in force with this base64url id, or None."""
        return self._by_id.get(credential_id)

    def of_identity(self, identity: str) -> list[ServedCredential]:
        """The credentials in force of ``identity`` (compared trimmed and casefolded)."""
        key = identity_key(identity)
        return [c for c in self._by_id.values() if identity_key(c.identity) == key]

    async def refresh(self) -> bool:
        """Ask the gate now; True when it answered (the data replaced). On failure the data
        is kept; an outage is logged once when it starts (WARNING
        ``event=credentials_unavailable``) and once when it ends (INFO
        ``event=credentials_available``), not at each retry; on an rp
        mismatch one ERROR ``event=inbox_rp_mismatch`` (only when the reason changes)."""
        self._tried_at = self._now_s()
        try:
            answer = await self._fetch()
        except FETCH_FAILURES as exc:
            if self._failure is None:
                log.warning(
                    'event=credentials_unavailable error=%s why="%s"', type(exc).__name__, exc
                )
            # a 5xx is no answer of the gate's (a balancer without a backend, a gate failing)
            unreachable = isinstance(exc, GateUnreachable | OSError) or (
                isinstance(exc, GateRefused) and exc.status >= 500
            )
            self._failure = ("gate_unreachable" if unreachable else "gate_refused", str(exc))
            return False
        if self._failure is not None:
            log.info("event=credentials_available")
        self._failure = None
        self._fetched_at = self._now_s()
        self._by_id = {c.credential_id: c for c in answer.credentials}
        problem = rp_problem(answer, self._party)
        if problem is not None and problem != self._problem:
            log.error('event=inbox_rp_mismatch why="%s"', problem)
        self._problem = problem
        return True

    async def refresh_if_due(self, every_s: float = REFRESH_EVERY_S) -> bool:
        """``refresh`` when never fetched or the data is older than ``every_s`` seconds;
        returns whether it asked the gate."""
        if self._fetched_at is not None and self._now_s() - self._fetched_at < every_s:
            return False
        await self.refresh()
        return True

    async def reachability(self, every_s: float = PROBE_EVERY_S) -> tuple[str, str] | None:
        """Why the gate cannot be asked now, as ``(reason, sentence)`` (``gate_unreachable``:
        no answer, or a 5xx; ``gate_refused``: another answer than the credentials), or None when it
        answered. Asks the gate again only when the last try (answered or not) is older than
        ``every_s`` seconds, so a health check polled often never floods the gate."""
        if self._tried_at is None or self._now_s() - self._tried_at >= every_s:
            await self.refresh()
        return self._failure

    async def refresh_for_unknown(self, credential_id: str) -> bool:
        """A sign-in or a session named an unknown credential id: ``refresh`` unless THIS id
        was looked up within the last 5 s, and at most 2 such refreshes per second overall (a
        passkey enrolled a moment after another sign-in signs in at once). Returns
        whether the gate answered."""
        now = self._now_s()
        self._unknown_ids = {
            k: at for k, at in self._unknown_ids.items() if now - at < UNKNOWN_EVERY_S
        }
        self._unknown_recent = [at for at in self._unknown_recent if now - at < 1.0]
        if credential_id in self._unknown_ids or len(self._unknown_recent) >= UNKNOWN_PER_S:
            return False
        self._unknown_ids[credential_id] = now
        self._unknown_recent.append(now)
        return await self.refresh()
