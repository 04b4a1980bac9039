"""The Python SDK, imported by agents: the clients (client: AsyncGate; sync: Gate)
on the one HTTP client of the pipeline API (transport, the CLI's too) and the one retry and
long-poll loop (waiting, the CLI's too), what they return (models), one exception per
outcome (errors) and the require_approval decorator (decorator).

``AsyncGate``/``Gate`` speak the pipeline API (SPEC §3); ``require_approval`` gates a
function; ``Approval.raise_for_outcome()`` turns an outcome into a return or one exception.
Imports only the standard library, aiohttp and gate.protocol (gate.config lazily, for
``from_config``): see tests/test_layers.py.
"""

from __future__ import annotations

from gate.sdk.client import AsyncGate
from gate.sdk.decorator import JsonRenderer, Renderer, require_approval
from gate.sdk.errors import (
    AdjustNotApplicable,
    ApprovalCancelled,
    ApprovalDenied,
    ApprovalNotGranted,
    ApprovalPending,
    ApprovalTimedOut,
    ArgumentsChanged,
    GateRequestError,
    GateUnavailable,
    HitlGateError,
    QuestionNotAnswered,
)
from gate.sdk.models import Approval, Question
from gate.sdk.sync import Gate

__all__ = [
    "AdjustNotApplicable",
    "Approval",
    "ApprovalCancelled",
    "ApprovalDenied",
    "ApprovalNotGranted",
    "ApprovalPending",
    "ApprovalTimedOut",
    "ArgumentsChanged",
    "AsyncGate",
    "Gate",
    "GateRequestError",
    "GateUnavailable",
    "HitlGateError",
    "JsonRenderer",
    "Question",
    "QuestionNotAnswered",
    "Renderer",
    "require_approval",
]
