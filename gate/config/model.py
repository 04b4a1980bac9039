"""The frozen, typed pydantic models for the config file's sections (SPEC §5)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
)

from gate.config.followups import Delegation, EscalationLevel
from gate.config.policy import PolicyRule
from gate.config.storage import StorageConfig
from gate.config.values import (
    AbsolutePath,
    Duration,
    EnvName,
    HttpUrl,
    _check_listen,
    _check_name,
    _non_empty,
    _none_as_empty,
    check_bounded_number,
    check_tcp_addr,
)
from gate.config.webauthn import WebAuthnConfig
from gate.protocol.whitespace import identity_key

# the largest value SQLite's INTEGER holds: operator ids are stored with every decision
MAX_OPERATOR_ID = 2**63 - 1
# the longest max_skew accepted (s): a wider window all but switches SPEC §2 check 3 off
MAX_SKEW_S = 3600.0

_Int = Annotated[int, Field(strict=True, le=MAX_OPERATOR_ID)]
_OperatorId = Annotated[int, Field(strict=True, ge=1, le=MAX_OPERATOR_ID)]
_PositiveInt = Annotated[int, Field(strict=True, ge=1)]
_Amount = Annotated[
    float, BeforeValidator(check_bounded_number), Field(strict=True, ge=0, allow_inf_nan=False)
]
# pipeline and step names: what the pipeline API accepts (gate.core.requests.fields.MAX_NAME_CHARS)
_Name = Annotated[
    str, Field(strict=True, min_length=1, max_length=200), AfterValidator(_check_name)
]
_FROZEN = ConfigDict(extra="forbid", frozen=True)


def _none_as_list(value: object) -> object:
    return () if value is None else value


# --------------------------------------------------------------------------- models


class Operator(BaseModel):
    """A human approver (SPEC §5): numeric ``id`` (quorum, scope, audit) and wire ``identity``."""

    model_config = _FROZEN

    id: _OperatorId
    # the longest approver_id a decision may carry (gate.protocol.envelope.MAX_IDENTITY_CHARS)
    identity: Annotated[str, Field(strict=True, min_length=1, max_length=320)]

    @property
    def key(self) -> str:
        """The identity as compared on the wire: White_Space-trimmed and casefolded
        (``gate.protocol.whitespace.identity_key``, SPEC §2 check 11)."""
        return identity_key(self.identity)


class Security(BaseModel):
    """``relay.security``: who may decide and the decision-listener limits (SPEC §2, §5).

    ``allowed_users`` operator ids (non-empty); ``max_input_length`` adjust_text characters
    (default 500); ``rate_limit`` decisions per approver per minute (default 10);
    ``max_skew`` seconds of signature clock skew accepted (default 300).
    """

    model_config = _FROZEN

    allowed_users: Annotated[tuple[_Int, ...], AfterValidator(_non_empty)]
    max_input_length: _PositiveInt = 500
    rate_limit: _PositiveInt = 10
    max_skew: Duration = 300.0

    @field_validator("max_skew")
    @classmethod
    def _skew_bounded(cls, value: float) -> float:
        if value > MAX_SKEW_S:
            raise ValueError(f"must be at most {MAX_SKEW_S:g} seconds (1h), got {value:g} seconds")
        return value


class RelayConfig(BaseModel):
    """``relay``: where dispatches go, where decisions come back, who the operators are (SPEC §2).

    ``secret_env``/``previous_secret_env`` name environment variables (values via
    ``load_secrets``); ``callback_addr`` is the decision listener's ``host:port``;
    ``public_url`` (trailing ``/`` removed) is what relays call back, None = derive from the
    bound address; ``dispatch_timeout`` seconds (default 10); ``ca_file`` an optional PEM
    bundle of the CAs trusted for an https ``url`` instead of the system's (a private CA),
    resolved like storage.path and loaded at validation. Certificates are always verified.
    """

    model_config = _FROZEN

    url: HttpUrl
    secret_env: EnvName
    previous_secret_env: EnvName | None = None
    callback_addr: Annotated[str, Field(strict=True), AfterValidator(check_tcp_addr)]
    public_url: Annotated[HttpUrl, AfterValidator(lambda url: url.rstrip("/"))] | None = None
    dispatch_timeout: Duration = 10.0
    ca_file: AbsolutePath | None = None
    notices: Annotated[bool, Field(strict=True)] = False
    notice_url: HttpUrl | None = None
    questions: Annotated[bool, Field(strict=True)] = False
    question_url: HttpUrl | None = None
    # serve POST /hitl/v0/credentials (the approvers' public credentials) to a relay
    # that signs people in; off: that path answers 404
    credentials: Annotated[bool, Field(strict=True)] = False
    operators: Annotated[tuple[Operator, ...], AfterValidator(_non_empty)]
    security: Security

    @property
    def notice_target(self) -> str | None:
        """Where resolution notices go: ``notice_url``, else ``url`` when ``notices`` is on,
        else None (no notices)."""
        return self.notice_url or (self.url if self.notices else None)

    @property
    def question_target(self) -> str | None:
        """Where questions are dispatched: ``question_url``, else ``url`` when
        ``questions`` is on, else None (no relay declared question support)."""
        return self.question_url or (self.url if self.questions else None)

    @property
    def question_notice_target(self) -> str | None:
        """Where a question's resolution notice goes: with notices on
        (``notice_target`` set) and a question relay, ``question_url`` when set, else
        ``notice_target``; None otherwise (no question notices)."""
        if self.notice_target is None or self.question_target is None:
            return None
        return self.question_url or self.notice_target

    @field_validator("ca_file")
    @classmethod
    def _ca_bundle(cls, path: Path | None) -> Path | None:
        if path is None:
            return None
        try:
            ssl.create_default_context(cafile=str(path))
        except ssl.SSLError:  # (an OSError too)
            raise ValueError(f"{path} is not a PEM bundle of CA certificates") from None
        except OSError as exc:
            raise ValueError(f"cannot read CA bundle {path}: {exc.strerror or exc}") from None
        return path


class ApiConfig(BaseModel):
    """``api``: the local pipeline API (SPEC §3).

    ``listen`` is ``host:port`` or ``unix:/path.sock`` (default ``127.0.0.1:8090``);
    ``token_env`` names the bearer-token variable; ``max_draft_bytes`` (default 262144).
    ``admin_token_env`` (optional) names the admin bearer-token variable: only it
    opens ``/v1/admin/...`` (approver credentials); without it those routes answer 404.
    """

    model_config = _FROZEN

    listen: Annotated[str, Field(strict=True), AfterValidator(_check_listen)] = "127.0.0.1:8090"
    token_env: EnvName
    max_draft_bytes: _PositiveInt = 262144
    admin_token_env: EnvName | None = None


class HttpConfig(BaseModel):
    """``http`` (optional): limits of both listeners (decision callback and pipeline API).

    ``header_timeout``: a client must send a request's complete headers within this many
    seconds of connecting or of its previous answer; idle keep-alive connections are closed
    after it too (default 10). ``body_timeout``: once the headers arrived, the body must be
    complete within this many seconds, else 408 ``request_timeout`` (default 10).
    ``shutdown_timeout``: on SIGTERM/SIGINT, how long in-flight requests may take to finish
    before they are cut (default 10).
    """

    model_config = _FROZEN

    header_timeout: Duration = 10.0
    body_timeout: Duration = 10.0
    shutdown_timeout: Duration = 10.0


class ReceiptsConfig(BaseModel):
    """``receipts`` (SPEC §7): ``key_env`` names the HMAC receipt key variable (not the relay
    secret); ``previous_key_env`` (optional) the variable of the key the log was written
    with before a rotation of that key (``gate.audit.spans``; docs/auditing.md);
    ``signing_key_file`` is an optional Ed25519 private key (PEM) that signs every
    audit entry and execution permit; ``trusted_public_keys`` are PEM public key files also
    trusted when verifying (older keys after a rotation); ``permit_lifetime`` seconds a
    permit stays valid (default 15m). Paths resolve like storage.path."""

    model_config = _FROZEN

    key_env: EnvName
    previous_key_env: EnvName | None = None
    signing_key_file: AbsolutePath | None = None
    trusted_public_keys: tuple[AbsolutePath, ...] = ()
    permit_lifetime: Duration = 900.0


class BudgetConfig(BaseModel):
    """``budget`` (optional): currency ``unit`` (default EUR) and ``cap_today`` (>= 0 or None)."""

    model_config = _FROZEN

    unit: _Name = "EUR"
    cap_today: _Amount | None = None


def _off_is_false(value: object) -> object:
    """YAML 1.1 reads an unquoted ``off`` as boolean false: that is ``off``."""
    return "off" if value is False else value


class StepConfig(BaseModel):
    """One gated step (SPEC §5).

    ``quorum`` approvals needed (default 1); ``approvers`` operator ids (defaults to
    ``relay.security.allowed_users`` after ``load_config``); ``timeout`` seconds until the
    approval resolves ``timeout`` (default 4h); ``risk`` low|normal|high|critical;
    ``allow_self_approval``: may the operator named as ``requested_by`` decide (default false);
    ``allow_empty_draft``: may a draft be empty or only White_Space (default false: refused
    400 ``draft_empty``, and by ``hitl-gate request`` before it is sent).

    ``type: question`` makes it a question step: ``approvers`` may answer,
    ``max_options`` (default 50) bounds a choice question's options and
    ``max_answer_chars`` (default 2000) a free-text answer and each form string field;
    approval-only keys are refused there (``gate.config.questions``).

    ``approver_signature``: ``off`` (default: decisions as before), ``optional``
    (a valid ``approver_assertion`` is recorded, an invalid one refused) or ``required`` (a
    decision without a valid one is refused 403); frozen on each approval when it is created
    (``approvals.approver_signature``): a reload changes new approvals only.

    ``policy``: rules that approve or deny at creation, ``remember_approval``
    (seconds) a window in which a draft a person approved is approved again
    (``gate.config.policy``, ``gate.core.approvals.policy``).
    """

    model_config = _FROZEN

    name: _Name
    type: Literal["approval", "question"] = "approval"
    channel: Literal["relay"] = "relay"
    quorum: _PositiveInt = 1
    approvers: Annotated[tuple[_Int, ...], AfterValidator(_non_empty)] = ()
    timeout: Duration = 4 * 3600.0
    risk: Literal["low", "normal", "high", "critical"] = "normal"
    allow_self_approval: Annotated[bool, Field(strict=True)] = False
    allow_empty_draft: Annotated[bool, Field(strict=True)] = False
    skip_reason: Literal["required", "optional"] = "optional"
    approver_signature: Annotated[
        Literal["off", "optional", "required"], BeforeValidator(_off_is_false)
    ] = "off"
    remind_after: Duration | None = None
    remind_every: Duration | None = None
    escalate: tuple[EscalationLevel, ...] = ()
    max_options: Annotated[int, Field(strict=True, ge=1, le=1000)] = 50
    max_answer_chars: Annotated[int, Field(strict=True, ge=1, le=60_000)] = 2000
    policy: Annotated[tuple[PolicyRule, ...], BeforeValidator(_none_as_list)] = ()
    remember_approval: Duration | None = None  # gate.config.policy

    @property
    def is_question(self) -> bool:
        """True for a question step, False for an approval step."""
        return self.type == "question"

    @property
    def first_reminder_s(self) -> float | None:
        """Seconds from creation to the first reminder, or None when the step has none."""
        return self.remind_after if self.remind_after is not None else self.remind_every

    @property
    def reminder_interval_s(self) -> float | None:
        """Seconds between reminders after the first, or None for a single reminder."""
        return self.remind_every


class PipelineConfig(BaseModel):
    """A named pipeline with its optional ``budget_cap`` (>= 0) and non-empty ``steps``."""

    model_config = _FROZEN

    name: _Name
    budget_cap: _Amount | None = None
    steps: Annotated[tuple[StepConfig, ...], AfterValidator(_non_empty)]


class Config(BaseModel):
    """The whole validated configuration; ``source`` is the file it was loaded from (or None)."""

    model_config = _FROZEN

    relay: RelayConfig
    api: ApiConfig
    storage: StorageConfig
    receipts: ReceiptsConfig
    http: Annotated[HttpConfig, BeforeValidator(_none_as_empty)] = HttpConfig()
    budget: Annotated[BudgetConfig, BeforeValidator(_none_as_empty)] = BudgetConfig()
    pipelines: Annotated[tuple[PipelineConfig, ...], AfterValidator(_non_empty)]
    delegations: Annotated[tuple[Delegation, ...], BeforeValidator(_none_as_list)] = ()
    # passkeys' relying party (gate.config.webauthn)
    webauthn: Annotated[WebAuthnConfig, BeforeValidator(_none_as_empty)] = WebAuthnConfig()
    source: Path | None = None

    def find_step(self, pipeline: str, step: str) -> tuple[PipelineConfig, StepConfig] | None:
        """Return the named pipeline and step (exact names), or None if either is unknown."""
        pipe = next((p for p in self.pipelines if p.name == pipeline), None)
        found = next((s for s in pipe.steps if s.name == step), None) if pipe else None
        return None if pipe is None or found is None else (pipe, found)

    def scope(self, step: StepConfig) -> tuple[Operator, ...]:
        """Operators allowed to decide ``step``: allowed_users ∩ approvers, in approvers order
        (SPEC §2 check 11)."""
        by_id = {op.id: op for op in self.relay.operators}
        allowed = set(self.relay.security.allowed_users)
        # () only when approvers was omitted and the config did not come from load_config.
        ids = dict.fromkeys(step.approvers or self.relay.security.allowed_users)
        return tuple(by_id[op_id] for op_id in ids if op_id in allowed and op_id in by_id)

    def operator_by_identity(self, identity: str) -> Operator | None:
        """The operator whose identity equals ``identity`` after White_Space trim + casefold
        (``identity_key``), else None."""
        if not isinstance(identity, str):
            return None
        key = identity_key(identity)
        return next((op for op in self.relay.operators if op.key == key), None)
