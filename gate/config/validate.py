"""Checks across fields (SPEC §5), run once the schema validated: ids, names, scopes, quorums."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from gate.config.followups import check_delegations, check_step_followups
from gate.config.model import Config, RelayConfig, StepConfig
from gate.config.policy import check_step_policy
from gate.config.questions import check_question_step
from gate.config.secrets import _secret_vars
from gate.config.values import TcpListen, check_ids, first_seen, identity_problem, parse_listen
from gate.config.webauthn import check_webauthn
from gate.protocol import DECISIONS_PATH
from gate.protocol.whitespace import is_blank

MAX_INPUT_LENGTH_LIMIT = 60_000  # an adjust_text must fit a 64 KiB decision body


def _check_listeners(config: Config) -> list[str]:
    """The two listeners must differ; public_url is a base URL (no query, no decisions path)."""
    errors: list[str] = []
    relay = config.relay
    callback = parse_listen(relay.callback_addr)
    api = parse_listen(config.api.listen)
    if (
        isinstance(api, TcpListen)
        and isinstance(callback, TcpListen)
        and api.port == callback.port != 0
        and (api.host == callback.host or "0.0.0.0" in (api.host, callback.host))
    ):
        errors.append(
            f"api.listen: {config.api.listen} is the same address as "
            f"relay.callback_addr ({relay.callback_addr}); use two ports"
        )
    if relay.public_url is not None:
        parts = urlsplit(relay.public_url)
        if parts.query or parts.fragment:
            errors.append(
                "relay.public_url: must not have a query or fragment (it is a base "
                "URL; /hitl/v0/decisions is appended)"
            )
        if parts.path.rstrip("/").endswith(DECISIONS_PATH):
            errors.append(
                f"relay.public_url: give the base URL without {DECISIONS_PATH} "
                "(the gate appends it)"
            )
    if relay.security.max_input_length > MAX_INPUT_LENGTH_LIMIT:
        errors.append(
            f"relay.security.max_input_length: at most {MAX_INPUT_LENGTH_LIMIT} "
            "(a decision body is limited to 64 KiB)"
        )
    return errors


def _cross_check(config: Config) -> list[str]:
    """Checks across fields (SPEC §5), run after the schema validated; returns every error."""
    errors, defined = _check_operators(config.relay)
    allowed = config.relay.security.allowed_users
    errors += check_ids("relay.security.allowed_users", allowed, defined, None)

    errors += _check_listeners(config)
    errors += check_webauthn(config)  # passkeys
    env_names = _secret_vars(config)
    for j, (where, name) in enumerate(env_names):
        for other, other_name in env_names[:j]:
            if name == other_name:
                errors.append(f"{where}: must differ from {other} ({name} is used for both)")
                break
    errors += _check_pipelines(config, defined)
    errors += check_delegations(config.delegations, config)
    return errors


def _check_operators(relay: RelayConfig) -> tuple[list[str], set[int]]:
    """``relay.operators``' errors (ids and identities unique, identities well formed) and
    the operator ids defined."""
    errors: list[str] = []
    first_id: dict[int, int] = {}
    first_key: dict[str, int] = {}
    for i, op in enumerate(relay.operators):
        where = f"relay.operators[{i}]"
        first = first_seen(first_id, op.id, i)
        if first is not None:
            errors.append(
                f"{where}.id: duplicate operator id {op.id} (also relay.operators[{first}])"
            )
        problem = identity_problem(op.identity)
        if problem is not None:
            errors.append(f"{where}.identity: {problem}")
        elif op.key in first_key:
            errors.append(
                f"{where}.identity: duplicate identity {op.identity!r} (same as"
                f" relay.operators[{first_key[op.key]}] after trim and casefold)"
            )
        if not is_blank(op.identity) and op.key not in first_key:
            first_key[op.key] = i
    return errors, set(first_id)


def _check_pipelines(config: Config, defined: set[int]) -> list[str]:
    """``pipelines``' errors: names unique, each step's approvers defined and allowed, its
    quorum reachable, and the checks of its kind (questions, follow-ups, policy)."""
    errors: list[str] = []
    allowed = config.relay.security.allowed_users
    allowed_set = set(allowed)
    first_pipe: dict[str, int] = {}
    for p, pipe in enumerate(config.pipelines):
        first = first_seen(first_pipe, pipe.name, p)
        if first is not None:
            errors.append(
                f"pipelines[{p}].name: duplicate pipeline name {pipe.name!r}"
                f" (also pipelines[{first}])"
            )
        first_step: dict[str, int] = {}
        for s, step in enumerate(pipe.steps):
            where = f"pipelines[{p}].steps[{s}]"
            first = first_seen(first_step, step.name, s)
            if first is not None:
                errors.append(
                    f"{where}.name: duplicate step name {step.name!r}"
                    f" (also pipelines[{p}].steps[{first}])"
                )
            if "approvers" in step.model_fields_set:
                errors += check_ids(f"{where}.approvers", step.approvers, defined, allowed_set)
                candidates: Sequence[int] = step.approvers
            else:
                candidates = allowed
            in_scope = {i for i in candidates if i in allowed_set and i in defined}
            # a question step's quorum other than 1 is its own error (check_question_step)
            quorum_checked = not step.is_question or step.quorum == 1
            if quorum_checked and step.quorum > len(in_scope):
                noun = "operator" if len(in_scope) == 1 else "operators"
                errors.append(
                    f"{where}.quorum: quorum {step.quorum} is larger than the {len(in_scope)}"
                    f" {noun} in scope"
                )
            elif quorum_checked and _self_approval_unreachable(step, len(in_scope)):
                errors.append(
                    f"{where}.quorum: quorum {step.quorum} cannot be met without the requester"
                    f" ({len(in_scope)} in scope, and with allow_self_approval: false a"
                    " requester's own decisions do not count)"
                )
            errors += check_question_step(where, step, config)
            if not step.is_question:
                errors += check_step_followups(where, step, in_scope, config)
                errors += check_step_policy(where, step)
    return errors


def _self_approval_unreachable(step: StepConfig, in_scope: int) -> bool:
    """True when a step that explicitly refuses self-approval needs every operator in scope.

    Requests that name an in-scope ``requested_by`` could then never reach quorum. Steps
    that leave ``allow_self_approval`` unset are not rejected (configs from before the key
    existed stay valid); such a request is refused at creation instead (422
    ``quorum_unreachable``).
    """
    return (
        "allow_self_approval" in step.model_fields_set
        and not step.allow_self_approval
        and step.quorum > in_scope - 1
    )


def signing_warnings(config: Config) -> list[str]:
    """A step with ``approver_signature`` optional/required while
    ``api.admin_token_env`` is unset: no credential can be enrolled (the admin API is off),
    so on a ``required`` step every approval times out. One line per step, its YAML path
    first; a warning, not an error (credentials enrolled before stay in the database)."""
    if config.api.admin_token_env is not None:
        return []
    return [
        f"pipelines[{i}].steps[{j}].approver_signature: {step.approver_signature}, but"
        " api.admin_token_env is not set: no approver credential can be enrolled"
        " (hitl-gate approvers needs the admin API)"
        for i, pipeline in enumerate(config.pipelines)
        for j, step in enumerate(pipeline.steps)
        if step.approver_signature != "off"
    ]
