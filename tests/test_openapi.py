"""docs/openapi.yaml against the code: the routes match, and schemathesis finds no 5xx and no
answer the document does not describe, on a real daemon.

Needs schemathesis 4 (``pip install 'schemathesis>=4.32,<5'``). The document is static, so
both schemas load at import, one per listener; the daemon (``python -m gate serve``) binds
port 0, so each call passes its listener's base URL, known once the module-scoped ``live``
fixture started it. (``schemathesis.pytest.from_fixture`` would load them in a fixture, but
its lazy schemas set ``request.node._nodeid``, which pytest 9.2 no longer has.)

Bounded: MAX_EXAMPLES generated cases per operation plus schemathesis's coverage phase
(boundaries, missing/mistyped fields, other methods), well under a minute.

The decision endpoint gets every generated case twice: as generated (its
``X-Draftcat-Signature`` is garbage or absent, so it must be refused 401, or 413 when too
large) and signed with the test secret over the exact bytes sent, so checks 5-14 run too.
Hooks aim some generated bodies at real pending approvals (their dispatched id, nonce and
hash, a configured approver), so decisions get recorded, resolve, supersede and conflict;
some create bodies name the configured pipeline, so approvals get created.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

schemathesis = pytest.importorskip("schemathesis", minversion="4.32")

import requests  # noqa: E402  (a schemathesis dependency)
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import CHECKS, load_all_checks  # noqa: E402

from gate.config import load_config, load_secrets  # noqa: E402
from gate.daemon.app import build_gate  # noqa: E402
from gate.protocol import (  # noqa: E402
    DECISIONS_PATH,
    MAX_DECISION_BYTES,
    SIGNATURE_HEADER,
    signing,
)
from gate.protocol.answer import build_answer  # noqa: E402
from tests.support import (  # noqa: E402
    API_TOKEN,
    ENV,
    IDENTITIES,
    ROOT,
    SECRET,
    CaptureRelay,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    wait_until,
    write_config,
)

SPEC_PATH = ROOT / "docs" / "openapi.yaml"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
CHECK_NAMES = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
)
# per operation in the fuzzing phase (the coverage phase adds its own cases); raise it for a
# deeper local run: HITL_OPENAPI_EXAMPLES=500 pytest tests/test_openapi.py
MAX_EXAMPLES = int(os.environ.get("HITL_OPENAPI_EXAMPLES", "20"))
STEPS = ("q1", "q2", "q3", "short")
# the live daemon's steps: the default ones plus a question step
LIVE_STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "q2", "quorum": 2, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "q3", "quorum": 3, "approvers": list(range(101, 121)), "timeout": "1h"},
    {"name": "short", "quorum": 1, "approvers": [101, 102], "timeout": "3s"},
    {"name": "ask", "type": "question", "approvers": [101, 102, 103], "timeout": "1h"},
]
QUESTION_BODIES = [
    {"text": "Which PO?", "response_type": "free_text"},
    {"text": "Which one?", "response_type": "single_choice", "options": ["acme", "globex"]},
    {"text": "Which ones?", "response_type": "multi_choice", "options": ["a", "b", "c"]},
    {
        "text": "Fill in",
        "response_type": "form",
        "schema": {
            "type": "object",
            "properties": {"amount": {"type": "integer", "minimum": 1, "maximum": 100}},
            "required": ["amount"],
        },
    },
]
# a value that fits each question body above, by response_type
GOOD_VALUES = {
    "free_text": "PO-1",
    "single_choice": "globex",
    "multi_choice": ["c", "a"],
    "form": {"amount": 42},
}
# decision approvers: three in every step's scope, one in q3 only, one defined but not allowed
APPROVERS = (*IDENTITIES[:3], IDENTITIES[10], "dave@example.com")
ADMIN_TOKEN = "test-admin-token-2f7c9e1a4b6d8035f2"


def load_spec() -> dict[str, Any]:
    with SPEC_PATH.open(encoding="utf-8") as fh:
        spec = yaml.safe_load(fh)
    assert isinstance(spec, dict)
    return spec


def checks() -> list[Any]:
    load_all_checks()
    return CHECKS.get_by_names(list(CHECK_NAMES))


# =========================================================================== plain checks


def test_openapi_yaml_parses_and_is_a_valid_openapi_document() -> None:
    spec = load_spec()
    assert spec["openapi"].startswith("3.")
    schema = schemathesis.openapi.from_dict(spec)
    schema.validate()  # the OpenAPI meta-schema
    operations = [result.ok() for result in schema.get_all_operations()]
    # 7 + 5 question operations + 4 admin and 3 passkey-enrolment
    # + the credentials channel
    assert len(operations) == 20


def _spec_routes(spec: dict[str, Any]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """Return ``(pipeline API operations, callback listener operations)`` as (METHOD, path);
    an operation belongs to the callback listener when its path item declares its own
    ``servers``."""
    api: set[tuple[str, str]] = set()
    callback: set[tuple[str, str]] = set()
    for path, item in spec["paths"].items():
        target = callback if "servers" in item else api
        target.update((method.upper(), path) for method in item if method in HTTP_METHODS)
    return api, callback


def _app_routes(app: Any) -> set[tuple[str, str]]:
    """(METHOD, path template) of every route; the HEAD aiohttp adds beside a GET is implied."""
    routes = {(route.method, route.resource.canonical) for route in app.router.routes()}
    return {
        (method, path)
        for method, path in routes
        if not (method == "HEAD" and ("GET", path) in routes)
    }


def test_every_registered_route_is_in_the_spec_and_vice_versa(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "http://127.0.0.1:9/relay"))
    secrets = load_secrets(config, ENV)
    gate = build_gate(config, secrets, writer_process=False)
    api_app, callback_app = gate.api_app, gate.callback_app

    spec_api, spec_callback = _spec_routes(load_spec())

    assert _app_routes(api_app) == spec_api
    assert _app_routes(callback_app) == spec_callback
    assert spec_callback == {
        ("POST", DECISIONS_PATH),
        ("GET", "/enrol/{token}"),
        ("POST", "/enrol/{token}"),
        ("GET", "/enrol/static/{name}"),
        ("POST", "/hitl/v0/credentials"),
    }


def test_spec_security_bearer_on_v1_and_metrics_and_decision_statuses_complete() -> None:
    spec = load_spec()
    assert spec["security"] == [{"bearerAuth": []}]
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {
        **spec["components"]["securitySchemes"]["bearerAuth"],
        "type": "http",
        "scheme": "bearer",
    }
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            secured = operation.get("security", spec["security"]) != []
            assert secured == (path.startswith("/v1/") or path == "/metrics"), (method, path)
            if secured:
                assert "401" in operation["responses"], (method, path)
    decision = spec["paths"][DECISIONS_PATH]["post"]
    assert {"200", "400", "401", "403", "404", "409", "410", "413", "422", "429"} <= set(
        decision["responses"]
    )
    header_names = {p["name"] for p in decision["parameters"] if p["in"] == "header"}
    assert header_names == {SIGNATURE_HEADER, "X-Hitl-Protocol"}


# =========================================================================== live daemon


@dataclass
class Live:
    """The running daemon and what the hooks draw from."""

    gate: GateProcess
    relay: CaptureRelay
    api_base: str
    callback_base: str
    api_ids: list[str] = field(default_factory=list)  # pending approvals for the API run
    decision_targets: list[dict[str, str]] = field(default_factory=list)  # dispatched facts
    question_ids: list[str] = field(default_factory=list)  # questions for the API run
    answer_targets: list[dict[str, Any]] = field(default_factory=list)  # dispatched questions


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A real ``hitl-gate serve`` with a capturing relay, and a few pending approvals."""
    relay = CaptureRelay().start()
    config = write_config(
        tmp_path_factory.mktemp("openapi"),
        relay.url,
        steps=LIVE_STEPS,
        relay={"questions": True, "credentials": True},
        api={"admin_token_env": "HITL_ADMIN_TOKEN"},
    )
    gate = GateProcess(config, env=gate_env(HITL_ADMIN_TOKEN=ADMIN_TOKEN)).start()
    try:
        assert gate.callback_url.endswith(DECISIONS_PATH)
        state = Live(gate, relay, gate.api_url, gate.callback_url[: -len(DECISIONS_PATH)])
        api = gate.api()
        state.api_ids = [
            api.create(step, body=f"api run {step}")["approval_id"] for step in ("q1", "q2", "q3")
        ]
        for n, step in enumerate(("q1", "q2", "q3", "q3", "q3")):
            created = api.create(step, body=f"decision run {n}")
            dispatch = relay.wait_dispatch(created["approval_id"])
            state.decision_targets.append(
                {
                    "approval_id": created["approval_id"],
                    "nonce": dispatch["callback"]["nonce"],
                    "payload_hash": dispatch["payload_hash"],
                }
            )
        for n, body in enumerate(QUESTION_BODIES * 2):
            status, created = api.call(
                "POST", "/v1/questions", {"pipeline": "p", "step": "ask", **body}
            )
            assert status == 201, created
            if n < len(QUESTION_BODIES):
                state.question_ids.append(created["question_id"])
                continue
            dispatch = wait_question_dispatch(relay, created["question_id"])
            state.answer_targets.append(
                {
                    "question_id": created["question_id"],
                    "nonce": dispatch["callback"]["nonce"],
                    "request_hash": dispatch["request_hash"],
                    "value": GOOD_VALUES[body["response_type"]],
                }
            )
        LIVE[:] = [state]
        yield state
    finally:
        LIVE.clear()
        if gate.proc is not None and gate.proc.poll() is None:
            gate.stop()
        relay.stop()


def wait_question_dispatch(
    relay: CaptureRelay, question_id: str, version: int = 1
) -> dict[str, Any]:
    """The acked dispatch of ``question_id`` at ``version`` (waits with a deadline)."""

    def find() -> dict[str, Any] | None:
        for env in relay.dispatches():
            if env.get("question_id") == question_id and env.get("version") == version:
                return env
        return None

    found: dict[str, Any] = wait_until(find, what=f"dispatch of question {question_id}")
    return found


def _config(**extra: Any) -> Any:
    return schemathesis.Config.from_dict(
        {
            "request-timeout": 20,
            "suppress-health-check": ["too_slow", "filter_too_much", "data_too_large"],
            "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
            "phases": {"stateful": {"enabled": False}},
            **extra,
        }
    )


# Both schemas load at import (see the module docstring); the hooks draw from ``LIVE``, set by
# the ``live`` fixture before any case is generated.
LIVE: list[Live] = []

API_SCHEMA = schemathesis.openapi.from_path(
    SPEC_PATH, config=_config(auth={"openapi": {"bearerAuth": {"bearer": API_TOKEN}}})
).include(path_regex=r"^/(v1/|healthz$|metrics$)")
DECISION_SCHEMA = schemathesis.openapi.from_path(SPEC_PATH, config=_config()).include(
    path=DECISIONS_PATH
)


@API_SCHEMA.hook("flatmap_body")
def configured_pipeline(context: Any, body: Any) -> Any:
    """A generated pipeline/step is (almost) never configured: also send configured ones (and
    configured requesters), so 201/200/409/413/422 and the approval object are exercised."""
    op = context.operation
    if op is not None and isinstance(body, dict):
        route = (op.method.upper(), op.path)
        if route == ("POST", "/v1/questions"):
            question = st.builds(
                lambda fields: {**body, "pipeline": "p", "step": "ask", **fields},
                st.sampled_from(QUESTION_BODIES),
            )
            return st.one_of(st.just(body), question, question)
        if route == ("POST", "/v1/questions/{question_id}/revise"):
            revise = st.builds(lambda fields: {**body, **fields}, st.sampled_from(QUESTION_BODIES))
            return st.one_of(st.just(body), revise)
    if (
        op is None
        or (op.method.upper(), op.path) != ("POST", "/v1/approvals")
        or not isinstance(body, dict)
    ):
        return st.just(body)

    def configured(step: str, who: str | None) -> dict[str, Any]:
        out = {**body, "pipeline": "p", "step": step}
        if who is not None:
            out["requested_by"] = who
        return out

    requester = st.one_of(st.just(None), st.just(None), st.sampled_from(APPROVERS))
    configured_body = st.builds(configured, st.sampled_from(STEPS), requester)
    return st.one_of(st.just(body), configured_body, configured_body)


@API_SCHEMA.hook("flatmap_path_parameters")
def known_approval(context: Any, params: Any) -> Any:
    """Also ask about (and cancel) approvals and questions that exist."""
    if isinstance(params, dict) and "question_id" in params and LIVE:
        return st.one_of(
            st.just(params),
            st.sampled_from(LIVE[0].question_ids).map(
                lambda question_id: {**params, "question_id": question_id}
            ),
        )
    if not isinstance(params, dict) or "approval_id" not in params or not LIVE:
        return st.just(params)
    return st.one_of(
        st.just(params),
        st.sampled_from(LIVE[0].api_ids).map(
            lambda approval_id: {**params, "approval_id": approval_id}
        ),
    )


@API_SCHEMA.hook("map_query")
def short_long_poll(context: Any, query: Any) -> Any:
    """A valid ``wait`` on a pending approval really waits: keep the run bounded."""
    if isinstance(query, dict):
        wait = query.get("wait")
        if (
            isinstance(wait, int | float)
            and not isinstance(wait, bool)
            and math.isfinite(wait)
            and 0.2 < wait <= 300
        ):
            query = {**query, "wait": 0.2}
    return query


@DECISION_SCHEMA.hook("flatmap_body")
def real_target(context: Any, body: Any) -> Any:
    """Point some decisions at a real pending approval (id, nonce, maybe its hash) and a
    configured approver, so the checks after 6 run and decisions get recorded."""
    if not isinstance(body, dict) or not LIVE:
        return st.just(body)

    def aimed(target: dict[str, str], who: str, keep_hash: bool) -> dict[str, Any]:
        approver = body.get("approver")
        out = {
            **body,
            "approval_id": target["approval_id"],
            "nonce": target["nonce"],
            "approver": {**(approver if isinstance(approver, dict) else {}), "id": who},
        }
        if not keep_hash:
            out["payload_hash"] = target["payload_hash"]
        return out

    if body.get("decision") == "answer":  # an answer envelope

        def aimed_answer(target: dict[str, Any], who: str, keep: bool) -> dict[str, Any]:
            approver = body.get("approver")
            out = {
                **body,
                "question_id": target["question_id"],
                "nonce": target["nonce"],
                "approver": {**(approver if isinstance(approver, dict) else {}), "id": who},
            }
            if not keep:  # the real hash and a value that fits: recorded, then conflicts
                out.update(request_hash=target["request_hash"], value=target["value"])
            return out

        answered = st.builds(
            aimed_answer,
            st.sampled_from(LIVE[0].answer_targets),
            st.sampled_from(APPROVERS),
            st.booleans(),
        )
        return st.one_of(st.just(body), answered, answered)
    aimed_body = st.builds(
        aimed, st.sampled_from(LIVE[0].decision_targets), st.sampled_from(APPROVERS), st.booleans()
    )
    return st.one_of(st.just(body), aimed_body, aimed_body)


@pytest.mark.e2e
@API_SCHEMA.parametrize()
def test_pipeline_api_conforms_to_openapi(case: Any, live: Live) -> None:
    case.call_and_validate(base_url=live.api_base, checks=checks())


def _raw_body(case: Any) -> bytes:
    """The exact bytes sent for the case's body (what gets signed)."""
    if not isinstance(case.body, dict | list | str | int | float | bool) and case.body is not None:
        return b""
    return json.dumps(case.body, ensure_ascii=False, allow_nan=False).encode("utf-8")


@pytest.mark.e2e
@DECISION_SCHEMA.parametrize()
def test_decision_endpoint_conforms_to_openapi(case: Any, live: Live) -> None:
    if case.method.upper() != case.operation.method.upper():
        # a coverage-phase probe with another method: the route does not exist for it
        response = case.call_and_validate(base_url=live.callback_base, checks=checks())
        assert response.status_code == 405, response.text
        return
    raw = _raw_body(case)
    # as generated: the signature header is absent or garbage, so never accepted
    unsigned = case.call_and_validate(base_url=live.callback_base, data=raw, checks=checks())
    expected = 413 if len(raw) > MAX_DECISION_BYTES else 401
    assert unsigned.status_code == expected, unsigned.text
    # signed with the test secret over the same bytes: checks 5-14 decide
    signed_headers = {SIGNATURE_HEADER: signing.sign(SECRET, int(time.time()), raw)}
    signed = case.call_and_validate(
        base_url=live.callback_base, headers=signed_headers, data=raw, checks=checks()
    )
    assert signed.status_code < 500, signed.text


# =========================================================================== lone surrogates
# Every operation of the document, on both listeners, with a lone surrogate (a JSON ``\ud800``
# escape: no UTF-8 text) put into one generated string of each body: never a 5xx; on the
# pipeline and admin APIs a body that got past the token is refused 400 ``invalid_<field>``.
# Generated strings otherwise never hold one (hypothesis draws valid text). Query, path and
# header values cannot carry one over HTTP (a URL and a header are bytes; the gate reads what
# is not UTF-8 as U+FFFD, headers as before: ``BEYOND_GENERATION``). Deterministic (a fixed
# seed, derandomized) and bounded: SURROGATE_EXAMPLES per operation, no coverage phase.

SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff")
SURROGATE_EXAMPLES = int(os.environ.get("HITL_SURROGATE_EXAMPLES", "6"))
SURROGATE_SCHEMA = schemathesis.openapi.from_path(
    SPEC_PATH,
    config=schemathesis.Config.from_dict(
        {
            "request-timeout": 20,
            "seed": 20261207,
            "suppress-health-check": ["too_slow", "filter_too_much", "data_too_large"],
            "generation": {
                "max-examples": SURROGATE_EXAMPLES,
                "database": "none",
                "deterministic": True,
            },
            "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
        }
    ),
)
CALLBACK_PATHS = {path for path, item in load_spec()["paths"].items() if "servers" in item}


def _string_count(value: Any) -> int:
    if isinstance(value, str):
        return 1
    if isinstance(value, dict):
        return sum(_string_count(v) for v in value.values())
    if isinstance(value, list):
        return sum(_string_count(v) for v in value)
    return 0


def _with_surrogate(value: Any, target: int, char: str) -> tuple[Any, int]:
    """``value`` with ``char`` put into the middle of its ``target``-th string (document
    order); returns the copy and how many strings are left to skip."""
    if isinstance(value, str):
        if target == 0:
            middle = len(value) // 2
            return value[:middle] + char + value[middle:], -1
        return value, target - 1
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out[key], target = _with_surrogate(item, target, char)
        return out, target
    if isinstance(value, list):
        items = []
        for item in value:
            changed, target = _with_surrogate(item, target, char)
            items.append(changed)
        return items, target
    return value, target


@SURROGATE_SCHEMA.hook("flatmap_body")
def one_lone_surrogate(context: Any, body: Any) -> Any:
    """Put a lone surrogate into one of the body's strings (a body without strings as is)."""
    count = _string_count(body)
    if count == 0:
        return st.just(body)
    return st.builds(
        lambda target, char: _with_surrogate(body, target, char)[0],
        st.integers(0, count - 1),
        st.sampled_from(SURROGATES),
    )


@pytest.mark.e2e
@SURROGATE_SCHEMA.parametrize()
def test_every_operation_with_a_lone_surrogate_answers_without_a_5xx(case: Any, live: Live) -> None:
    path = case.operation.path
    base = live.callback_base if path in CALLBACK_PATHS else live.api_base
    token = ADMIN_TOKEN if path.startswith("/v1/admin/") else API_TOKEN
    response = case.call(base_url=base, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code < 500, (case.method, path, response.text)
    carried = _string_count(case.body) > 0 and isinstance(case.body, dict | list | str)
    if carried and path.startswith("/v1/") and response.status_code not in (401, 404, 413):
        answer = response.json()
        assert (response.status_code, answer["reason"][:8]) == (400, "invalid_"), answer
        assert "lone surrogate" in answer["message"], answer


@pytest.mark.e2e
@pytest.mark.parametrize(
    "requested_by", [["x", "a\x00b"], [["x", "a\x00b"]], {"id": "a\x00b"}, "a\x00b"]
)
def test_a_nul_nested_in_a_create_answers_a_documented_refusal(
    live: Live, requested_by: Any
) -> None:
    """U+0000 inside a value of the wrong shape is refused at its JSON path
    (``requested_by[0][1]``): the 400 matches the document (a generated case found the path
    outside the field list once)."""
    response = requests.post(
        live.api_base + "/v1/approvals",
        json={"pipeline": "p", "step": "q1", "draft": {"body": "x"}, "requested_by": requested_by},
        timeout=20,
        headers={"Authorization": f"Bearer {API_TOKEN}"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["reason"].startswith("invalid_requested_by")
    API_SCHEMA["/v1/approvals"]["POST"].validate_response(response)


@pytest.mark.e2e
def test_approval_objects_through_their_lifecycle_match_the_schema(live: Live) -> None:
    """The generated runs rarely GET an approval that has decisions, revisions, a receipt:
    drive a few through real decisions and validate every answer against the document."""

    def api(method: str, path: str, body: Any = None) -> Any:
        response = requests.request(
            method,
            live.api_base + path,
            json=body,
            timeout=20,
            headers={"Authorization": f"Bearer {API_TOKEN}"},
        )
        route = path.partition("?")[0]
        template = (
            route
            if route == "/v1/approvals"
            else (
                "/v1/approvals/{approval_id}/cancel"
                if route.endswith("/cancel")
                else "/v1/approvals/{approval_id}"
            )
        )
        API_SCHEMA[template][method].validate_response(response)
        return response.json()

    def decide(dispatch: dict[str, Any], who: str, verb: str, **extra: Any) -> dict[str, Any]:
        status, answer, _ = post_decision(
            live.gate.callback_url, decision_body(dispatch, who, verb, **extra)
        )
        assert status == 200, answer
        return answer

    def create(step: str, body: str) -> tuple[str, dict[str, Any]]:
        created = api(
            "POST", "/v1/approvals", {"pipeline": "p", "step": step, "draft": {"body": body}}
        )
        return created["approval_id"], live.relay.wait_dispatch(created["approval_id"])

    approved, dispatch = create("q1", "approve me")
    decide(dispatch, "alice@example.com", "approve")
    view = api("GET", f"/v1/approvals/{approved}?wait=5")
    assert (view["outcome"], len(view["decisions"]), view["final_body"]) == (
        "approved",
        1,
        "approve me",
    )
    assert view["receipt"] is not None

    adjusted, dispatch = create("q2", "adjust me")
    decide(dispatch, "alice@example.com", "adjust", adjust_text="adjusted")
    second = live.relay.wait_dispatch(adjusted, revision=2)
    decide(second, "bob@example.com", "approve")
    view = api("GET", f"/v1/approvals/{adjusted}?wait=5")
    assert (view["outcome"], view["revision"], view["final_body"]) == ("adjusted", 2, "adjusted")

    skipped, dispatch = create("q3", "skip me")
    decide(dispatch, "carol@example.com", "approve")
    decide(dispatch, "bob@example.com", "skip")
    assert api("GET", f"/v1/approvals/{skipped}")["outcome"] == "skipped"

    cancelled, _ = create("q1", "cancel me")
    assert api("POST", f"/v1/approvals/{cancelled}/cancel")["outcome"] == "cancelled"

    page = api("GET", "/v1/approvals?state=resolved&limit=2")
    assert len(page["items"]) == 2 and page["next_cursor"] is not None


@pytest.mark.e2e
def test_question_objects_through_their_lifecycle_match_the_schema(live: Live) -> None:
    """Questions created, revised, answered with every type, cancelled, listed:
    every answer validated against the document, the answers' 200 and 409 bodies too."""

    def api(method: str, path: str, body: Any = None) -> Any:
        response = requests.request(
            method,
            live.api_base + path,
            json=body,
            timeout=20,
            headers={"Authorization": f"Bearer {API_TOKEN}"},
        )
        route = path.partition("?")[0]
        template = "/v1/questions"
        if route != template:
            action = route.rsplit("/", 1)[1]
            template = "/v1/questions/{question_id}" + (
                f"/{action}" if action in ("cancel", "revise") else ""
            )
        API_SCHEMA[template][method].validate_response(response)
        return response.json()

    def answer(dispatch: dict[str, Any], value: Any) -> requests.Response:
        body = build_answer(
            question_id=dispatch["question_id"],
            nonce=dispatch["callback"]["nonce"],
            request_hash=dispatch["request_hash"],
            value=value,
            approver_id="alice@example.com",
            decided_at_ms=int(time.time() * 1000),
        )
        raw = json.dumps(body).encode("utf-8")
        response = requests.post(
            live.gate.callback_url,
            data=raw,
            timeout=20,
            headers={
                "Content-Type": "application/json",
                SIGNATURE_HEADER: signing.sign(SECRET, int(time.time()), raw),
            },
        )
        DECISION_SCHEMA[DECISIONS_PATH]["POST"].validate_response(response)
        return response

    for fields in QUESTION_BODIES:
        created = api("POST", "/v1/questions", {"pipeline": "p", "step": "ask", **fields})
        dispatch = wait_question_dispatch(live.relay, created["question_id"])
        value = GOOD_VALUES[fields["response_type"]]
        assert answer(dispatch, value).status_code == 200
        view = api("GET", f"/v1/questions/{created['question_id']}?wait=5")
        assert (view["outcome"], view["answer"]["value"]) == ("answered", value)
        assert view["receipt"] is not None
        assert answer(dispatch, value).json()["reason"] == "duplicate"

    revised = api("POST", "/v1/questions", {"pipeline": "p", "step": "ask", **QUESTION_BODIES[0]})
    first = wait_question_dispatch(live.relay, revised["question_id"])
    second = api(
        "POST", f"/v1/questions/{revised['question_id']}/revise", {"text": "Which PO, really?"}
    )
    assert second["version"] == 2
    assert answer(first, "PO-1").json()["reason"] == "superseded"
    # check 9 (superseded) comes before check 12 (the value)
    assert answer(first, "").json()["reason"] == "superseded"
    bad = answer(wait_question_dispatch(live.relay, revised["question_id"], 2), "  ")
    assert (bad.status_code, bad.json()["reason"]) == (422, "invalid_value")

    assert api("POST", f"/v1/questions/{revised['question_id']}/cancel")["outcome"] == "cancelled"
    again = api("POST", f"/v1/questions/{revised['question_id']}/cancel")
    assert again["reason"] == "already_resolved"
    page = api("GET", "/v1/questions?state=resolved&limit=2")
    assert len(page["items"]) == 2 and page["next_cursor"] is not None


# =========================================================================== beyond generation
# Inputs schemathesis does not generate (it sends valid UTF-8 text and JSON numbers of modest
# size): raw bytes in headers, lone surrogates, invalid UTF-8, huge integers, deep nesting.
# Each must get the documented 4xx, with a body the document describes.

_CREATE = b'{"pipeline":"p","step":"q1","draft":{"body":"x"}'
_ENVELOPE = (
    '{"protocol":"hitl/v0","approval_id":%s,"nonce":"n","decision":"approve",'
    '"payload_hash":"sha256:00","approver":{"id":%s},"decided_at":"2026-08-02T09:31:05Z"}'
)
_UNSIGNED: dict[str, Any] = {SIGNATURE_HEADER: None}


def _envelope(
    approval_id: str = '"01J9ZQ3V6W8X2Y4A5B7C9D1E3F"', approver: str = '"alice@example.com"'
) -> bytes:
    """A decision body (for an approval that does not exist); latin-1, so a ``\\xff`` in an
    argument stays one raw byte (invalid UTF-8)."""
    return (_ENVELOPE % (approval_id, approver)).encode("latin-1")


BEYOND_GENERATION = [
    pytest.param(
        "api",
        "GET",
        {"Authorization": b"Bearer \xff"},
        b"",
        401,
        "token_invalid",
        id="api-bearer-token-not-utf8",
    ),
    pytest.param(
        "api",
        "POST",
        {"Idempotency-Key": b"\xff\xfe"},
        _CREATE + b"}",
        400,
        "invalid_idempotency_key",
        id="api-idempotency-key-not-utf8",
    ),
    pytest.param(
        "api",
        "POST",
        {},
        _CREATE + b',"spend":1' + b"0" * 400 + b"}",
        400,
        "invalid_spend",
        id="api-spend-huge-integer",
    ),
    pytest.param(
        "api",
        "POST",
        {},
        b'{"pipeline":"p","step":"q1","draft":{"body":"x","content_type":"\\udfff"}}',
        400,
        "invalid_draft.content_type",
        id="api-content-type-lone-surrogate",
    ),
    # new-user review 2026-11-30: stored with the CRLF, then sent to relays (header injection
    # for a relay that puts it in a header)
    pytest.param(
        "api",
        "POST",
        {},
        b'{"pipeline":"p","step":"q1","draft":{"body":"x",'
        b'"content_type":"text/plain\\r\\nX-Injected: 1"}}',
        400,
        "invalid_draft.content_type",
        id="api-content-type-control-characters",
    ),
    pytest.param(
        "api",
        "POST",
        {},
        _CREATE + b',"run_id":"\\ud800"}',
        400,
        "invalid_run_id",
        id="api-run-id-lone-surrogate",
    ),
    pytest.param(
        "api",
        "POST",
        {},
        b'{"pipeline":"p","step":"q1","draft":{"body":"\\udc00"}}',
        400,
        "invalid_draft.body",
        id="api-draft-body-lone-surrogate",
    ),
    pytest.param(
        "api",
        "POST",
        {},
        b'{"pipeline":"p","step":"q1","draft":{"body":"\xff"}}',
        400,
        "invalid_json",
        id="api-body-not-utf8",
    ),
    pytest.param(
        "api",
        "POST",
        {},
        b"[" * 100_000 + b"]" * 100_000,
        400,
        "invalid_json",
        id="api-body-deeply-nested",
    ),
    pytest.param(
        "callback",
        "POST",
        {},
        _envelope(approval_id='"\\ud800"'),
        400,
        "invalid_approval_id",
        id="decision-approval-id-lone-surrogate",
    ),
    pytest.param(
        "callback",
        "POST",
        {},
        _envelope(approver='"\\udfff"'),
        400,
        "invalid_approver.id",
        id="decision-approver-lone-surrogate",
    ),
    pytest.param(
        "callback",
        "POST",
        {"X-Hitl-Protocol": b"\xff"},
        _envelope(),
        400,
        "invalid_protocol",
        id="decision-protocol-header-not-utf8",
    ),
    pytest.param(
        "callback",
        "POST",
        {SIGNATURE_HEADER: b"t=1,v1=\xff"},
        _envelope(),
        401,
        "signature_malformed",
        id="decision-signature-not-utf8",
    ),
    pytest.param(
        "callback",
        "POST",
        {},
        _envelope(approver='"\xff"'),
        400,
        "invalid_json",
        id="decision-body-not-utf8",
    ),
    pytest.param(
        "callback",
        "POST",
        {},
        b"[" * 30_000 + b"]" * 30_000,
        400,
        "invalid_json",
        id="decision-body-deeply-nested",
    ),
    pytest.param(
        "callback",
        "POST",
        {},
        _envelope()[:-1] + b',"nonce":"again"}',
        400,
        "invalid_json",
        id="decision-duplicate-key",
    ),
    pytest.param(
        "callback",
        "POST",
        _UNSIGNED,
        b" " * (MAX_DECISION_BYTES + 1),
        413,
        "body_too_large",
        id="decision-unsigned-over-64k",
    ),
]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("listener", "method", "headers", "body", "status", "reason"), BEYOND_GENERATION
)
def test_inputs_beyond_generation_get_documented_answers(
    live: Live,
    listener: str,
    method: str,
    headers: dict[str, Any],
    body: bytes,
    status: int,
    reason: str,
) -> None:
    sent = {"Content-Type": "application/json", **headers}
    if listener == "api":
        base, path, schema = live.api_base, "/v1/approvals", API_SCHEMA
        sent.setdefault("Authorization", f"Bearer {API_TOKEN}")
    else:
        base, path, schema = live.callback_base, DECISIONS_PATH, DECISION_SCHEMA
        sent.setdefault(SIGNATURE_HEADER, signing.sign(SECRET, int(time.time()), body))
    sent = {name: value for name, value in sent.items() if value is not None}

    response = requests.request(method, base + path, headers=sent, data=body, timeout=20)

    assert (response.status_code, response.json().get("reason")) == (status, reason), response.text
    operation = schema[path][method]
    assert str(status) in operation.responses.status_codes
    operation.validate_response(response)
