"""An agent-style script (no LLM needed) whose risky action waits for a person: hitl-gate's
Python SDK and its ``require_approval`` decorator.

The agent decides to send an invoice; ``send_invoice`` is gated, so each call is shown to an
approver as JSON and runs only once approved — with the approver's edit when they adjust it.

    export HITL_GATE_URL=http://127.0.0.1:8090 HITL_GATE_TOKEN=...   # the gate's pipeline API
    export HITL_RUN_ID=invoice-run-42      # optional: a restarted run joins its approval
    python examples/agent.py --pipeline invoice-due-diligence --step send-followup acme 120.50

Exit codes as ``hitl-gate request --wait``: 0 sent, 3 skipped (the reason is printed),
4 timed out, 5 cancelled, 1 the gate failed or refused, 6 the edit could not be applied;
2 when HITL_GATE_URL or HITL_GATE_TOKEN is not set (one line).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from gate.sdk import (
    AdjustNotApplicable,
    ApprovalCancelled,
    ApprovalDenied,
    ApprovalTimedOut,
    Gate,
    HitlGateError,
    require_approval,
)


def send_invoice(customer: str, amount: float, currency: str = "EUR") -> str:
    """The agent's one risky tool: the real-world action (an API call to the billing system
    would go here). Module-level, so the approver sees ``send_invoice``, not a nested name."""
    return f"sent invoice to {customer}: {amount:.2f} {currency}"


def gated(gate: Gate, pipeline: str, step: str) -> Callable[[str, float, str], str]:
    """``send_invoice`` gated: it runs only after a person approves the call."""
    return require_approval(gate, pipeline=pipeline, step=step)(send_invoice)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Send an invoice once a person approves it.")
    parser.add_argument("--pipeline", default="invoice-due-diligence")
    parser.add_argument("--step", default="send-followup")
    parser.add_argument("--currency", default="EUR")
    parser.add_argument("customer")
    parser.add_argument("amount", type=float)
    args = parser.parse_args(argv)

    try:
        gate = Gate.from_env()  # HITL_GATE_URL and HITL_GATE_TOKEN
    except ValueError as exc:  # a variable is not set: one line, no traceback
        print(f"agent.py: {exc}", file=sys.stderr)
        return 2
    invoice = gated(gate, args.pipeline, args.step)
    print(f"agent: asking to send {args.amount:.2f} {args.currency} to {args.customer}", flush=True)
    try:
        print(invoice(args.customer, args.amount, args.currency))
    except ApprovalDenied as exc:
        print(f"not sent: skipped by {', '.join(exc.skipped_by)}: {exc.reason or '-'}")
        return 3
    except ApprovalTimedOut:
        print("not sent: nobody decided in time")
        return 4
    except ApprovalCancelled:
        print("not sent: the approval was cancelled")
        return 5
    except AdjustNotApplicable as exc:
        print(f"not sent: {exc}")
        return 6
    except HitlGateError as exc:
        print(f"not sent: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
