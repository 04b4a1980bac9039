"""``hitl-gate doctor``'s question checks, run only for a config that asks
questions (a ``type: question`` step or a question relay), so a deployment without questions
gets the report it always got: the question relay reachable (``relay.question_url``, when it
is not ``relay.url``, which the relay check probes already) and every pending question's
dispatch acked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gate.config import Config
from gate.errors import GateError
from gate.store.audit_records import QUESTION_TABLES, undelivered_dispatches


def asks_questions(config: Config) -> bool:
    """The config has a question step or names a relay for questions."""
    return config.relay.question_target is not None or any(
        step.type == "question" for pipeline in config.pipelines for step in pipeline.steps
    )


def separate_question_url(config: Config) -> str | None:
    """``relay.question_url`` when it is set and not ``relay.url`` (else None: the relay
    check probed the one URL questions go to)."""
    url = config.relay.question_url
    return None if url is None or url == config.relay.url else str(url)


def check_question_dispatch(path: Path, hint: Callable[[str | None], str]) -> tuple[bool, str]:
    """``(ok, detail)``: pending questions whose current version the question relay never
    acked (attempted, refused or unreachable), with the latest error and ``hint(error)``
    (``doctor_relay.dispatch_hint``); a database not created yet has none to check."""
    if not path.exists():
        return True, "no database yet"
    try:
        count, error = undelivered_dispatches(path, QUESTION_TABLES)
    except GateError as exc:
        return False, exc.message
    if count == 0:
        return True, "every pending question's dispatch was acked"
    noun = "question" if count == 1 else "questions"
    why = hint(error)
    return False, (
        f"{count} pending {noun} not delivered to the question relay; latest error: {error}"
        + (f" ({why})" if why else "")
    )
