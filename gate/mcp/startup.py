"""What ``hitl-gate mcp`` checks before it serves: that the gate accepts its
pipeline API token, with one cheap authenticated call. A refused token stops the start (the
CLI exits 2); a gate that is down does not (an agent host starts this server early): a
WARNING, and the tools say "unreachable" until it is up. Tokens are never logged."""

from __future__ import annotations

import asyncio
import logging

from gate.sdk import GateRequestError, GateUnavailable
from gate.sdk.transport import APPROVALS, Transport

log = logging.getLogger(__name__)

PROBE_S = 10.0
"""The longest the start-up check waits for the gate, in seconds."""


async def refused_status(url: str, token: str) -> int | None:
    """GET /v1/approvals?state=pending&limit=1 at ``url`` with ``token`` (SPEC §3): the HTTP
    status (401 or 403) when the gate refuses the token, else None. When the gate cannot be
    reached within ``PROBE_S`` or fails otherwise, logs one WARNING
    (``event=mcp_gate_unreachable``) and returns None. Never raises for the gate's state."""
    transport = Transport(url, token)
    try:
        await asyncio.wait_for(transport.list_in(APPROVALS, "pending", None, 1, None), PROBE_S)
    except GateRequestError as exc:
        if exc.status in (401, 403):
            return exc.status
        log.warning("event=mcp_gate_unreachable url=%s status=%d: going on", url, exc.status)
    except (GateUnavailable, TimeoutError):
        log.warning(
            "event=mcp_gate_unreachable url=%s: the gate is not up yet; going on (tools "
            "answer that it is unreachable until it is)",
            url,
        )
    finally:
        await transport.close()
    return None
