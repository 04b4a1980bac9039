"""A real gate with the inbox as its relay, for the inbox's HTTP and browser tests.

``InboxWorld`` starts ``python -m gate serve`` (``relay.credentials: true``, notices and
questions on, ``webauthn.origins`` = the gate relay's origin and the inbox's, an admin token)
and ``hitl-gate inbox serve`` on fixed ports (the gate's ``relay.url`` and the relying
party's origins outlive a restart). ``enrol`` enrols an operator's passkey through
``hitl-gate approvers invite`` and the invite page's real POST; ``InboxClient`` is an HTTP
client with a cookie jar that signs in with a ``SoftAuthenticator``. Importable without
playwright (the browser tests reuse it)."""

from __future__ import annotations

import html
import http.client
import json
import re
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any, cast

import yaml

from tests.support import (
    CliProcess,
    GateProcess,
    gate_env,
    http_request,
    run_cli,
    wait_until,
    write_config,
)
from tests.webauthn_soft import SoftAuthenticator

ADMIN_TOKEN = "test-admin-token-inbox-3c9d1e7a52"
ENV = gate_env(HITL_ADMIN_TOKEN=ADMIN_TOKEN)
RP_ID = "localhost"
READY = r"event=inbox_ready url=(\S+) relay_url=(\S+)"
SIGNED = {"approver_signature": "required"}
STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h", **SIGNED},
    {"name": "q2", "quorum": 2, "approvers": [101, 102, 103], "timeout": "1h", **SIGNED},
    {"name": "skipr", "quorum": 1, "approvers": [101, 102], "timeout": "1h",
     "skip_reason": "required", **SIGNED},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
]  # fmt: skip


def rows(db: Path | str, sql: str, *args: Any) -> list[sqlite3.Row]:
    """Read an SQLite file as it is on disk (a read-only connection of the test's own), or
    the PostgreSQL database of URL ``db`` (``sql`` in SQLite's words, translated)."""
    if isinstance(db, str):
        import psycopg  # noqa: PLC0415 - only for an inbox on PostgreSQL

        from gate.postgres.connection import PgConnection  # noqa: PLC0415

        with psycopg.connect(db, autocommit=True) as driver:
            return cast(list[sqlite3.Row], PgConnection(driver).execute(sql, args).fetchall())
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


class InboxProcess:
    """``hitl-gate inbox serve`` on 127.0.0.1:``port`` (``http://localhost:<port>`` for
    approvers) with its database in ``folder`` (or on PostgreSQL: ``storage`` in ``extra``,
    ``pg_url`` its URL); the gate's relay listener at ``gate_callback``."""

    def __init__(self, folder: Path, port: int, gate_callback: str, **extra: Any) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.config = folder / "inbox.yaml"
        self.db = folder / "var" / "inbox.db"
        data = {
            "listen": f"127.0.0.1:{port}",
            "gate": {"secret_env": "HITL_RELAY_SECRET", "callback_url": gate_callback},
            **extra,
        }
        self.config.write_text(yaml.safe_dump(data), encoding="utf-8")
        storage = extra.get("storage")
        self.pg_url: str | None = storage["url"] if storage else None
        self.port = port
        self.origin = f"http://localhost:{port}"
        self.base = f"http://127.0.0.1:{port}"
        self.relay_url = f"{self.base}/hitl/v0/relay"
        self.proc: CliProcess | None = None

    def start(self) -> InboxProcess:
        """Start and wait for ``event=inbox_ready``."""
        self.proc = CliProcess("inbox", "serve", "-c", str(self.config), env=ENV)
        self.proc.wait_for_line(READY)
        return self

    def stop(self) -> int:
        """SIGTERM; the exit code (0 when it stopped cleanly)."""
        if self.proc is None or self.proc.proc.poll() is not None:
            return 0
        return self.proc.stop()

    def kill9(self) -> None:
        """SIGKILL and reap: no clean stop."""
        assert self.proc is not None
        self.proc.proc.kill()
        self.proc.proc.wait(20)

    def log(self) -> str:
        """What the inbox wrote on stderr so far."""
        return self.proc.log() if self.proc is not None else ""

    def rows(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        """Rows of the inbox's own database."""
        return rows(self.pg_url or self.db, sql, *args)

    def wait_item(
        self, approval_id: str, check: Callable[[sqlite3.Row], bool] = lambda r: True
    ) -> sqlite3.Row:
        """Wait (with a deadline) until the inbox keeps ``approval_id`` and ``check`` holds."""

        def ready() -> sqlite3.Row | None:
            if self.pg_url is None and not self.db.exists():
                return None
            found = self.rows("SELECT * FROM items WHERE approval_id = ?", approval_id)
            return found[0] if found and check(found[0]) else None

        return wait_until(ready, what=f"inbox row of {approval_id}")


@dataclass
class InboxWorld:
    """A gate and its inbox in ``folder`` on ``gate_port`` and ``inbox_port``; ``passkeys``
    maps an operator id to its enrolled ``SoftAuthenticator``."""

    folder: Path
    gate_port: int
    inbox_port: int
    steps: list[dict[str, Any]] = field(default_factory=lambda: list(STEPS))
    origins: list[str] | None = None  # the gate's webauthn.origins (default: both)
    delegations: list[dict[str, Any]] | None = None  # the gate's delegations section
    inbox_config: dict[str, Any] = field(default_factory=dict)  # more keys of the inbox's YAML
    security: dict[str, Any] | None = None  # the gate's relay.security keys (rate_limit)
    gate: GateProcess | None = None
    inbox: InboxProcess | None = None
    passkeys: dict[int, SoftAuthenticator] = field(default_factory=dict)

    @property
    def gate_origin(self) -> str:
        """Where the gate's enrol pages open."""
        return f"http://localhost:{self.gate_port}"

    @property
    def inbox_origin(self) -> str:
        """Where approvers open the inbox."""
        return f"http://localhost:{self.inbox_port}"

    def gate_config(self) -> Path:
        """Write the gate's config (relay.url: the inbox; credentials, notices, questions
        on; the relying party ``localhost`` with both origins; an admin token)."""
        folder = self.folder / "gate"
        folder.mkdir(parents=True, exist_ok=True)
        relay = {
            "notices": True,
            "questions": True,
            "credentials": True,
            "callback_addr": f"127.0.0.1:{self.gate_port}",
            "public_url": f"http://127.0.0.1:{self.gate_port}",
        }
        path = write_config(
            folder,
            f"http://127.0.0.1:{self.inbox_port}/hitl/v0/relay",
            steps=self.steps,
            relay=relay,
            security=self.security,
            api={"admin_token_env": "HITL_ADMIN_TOKEN"},
        )
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        origins = self.origins or [self.gate_origin, self.inbox_origin]
        data["webauthn"] = {"rp_id": RP_ID, "origins": origins}
        if self.delegations:
            data["delegations"] = self.delegations
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return path

    def start_gate(self) -> GateProcess:
        """Start the gate (its config written first)."""
        self.gate = GateProcess(self.gate_config(), env=ENV).start()
        return self.gate

    def start_inbox(self, **extra: Any) -> InboxProcess:
        """Start (or restart) the inbox on its fixed port with its database kept."""
        self.inbox = InboxProcess(
            self.folder / "inbox",
            self.inbox_port,
            f"http://127.0.0.1:{self.gate_port}/",
            **{**self.inbox_config, **extra},
        ).start()
        return self.inbox

    def enrol(self, operator_id: int) -> SoftAuthenticator:
        """Enrol a passkey for ``operator_id``: ``hitl-gate approvers invite``, then the
        invite page's options answered by a fresh SoftAuthenticator and POSTed back."""
        assert self.gate is not None
        gate = self.gate
        proc = run_cli(
            "approvers", "invite", "-c", str(gate.config), "--api-url", gate.api_url,
            str(operator_id), env=ENV,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        url = proc.stdout.decode().strip()
        status, _, raw = http_request(url)
        assert status == 200, raw
        found = re.search(
            rb'<script type="application/json" id="options">(.*?)</script>', raw, re.S
        )
        assert found, raw
        options = json.loads(found.group(1))
        passkey = SoftAuthenticator()
        body = passkey.register(options["challenge"], options["rp"]["id"], self.gate_origin)
        headers = {"Content-Type": "application/json", "Origin": self.gate_origin}
        status, _, answer = http_request(url, "POST", json.dumps(body).encode(), headers)
        assert status == 200, answer
        self.passkeys[operator_id] = passkey
        return passkey

    def gate_rows(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        """Rows of the gate's own SQLite file."""
        return rows(self.folder / "gate" / "gate.db", sql, *args)

    def revoke(self, credential_id: str) -> None:
        """``hitl-gate approvers revoke CREDENTIAL_ID`` (exit 0), then a sign-in with a passkey
        the inbox does not know, which makes it ask the gate for the credentials at once."""
        assert self.gate is not None
        revoked = run_cli(
            "approvers", "revoke", "-c", str(self.gate.config), "--api-url", self.gate.api_url,
            "--", credential_id, env=ENV,
        )  # fmt: skip
        assert revoked.returncode == 0, revoked.stderr
        assert self.client().signin(SoftAuthenticator()).status == 401

    def client(self) -> InboxClient:
        """A fresh HTTP client (empty cookie jar) of the inbox."""
        return InboxClient(f"http://127.0.0.1:{self.inbox_port}", self.inbox_origin)

    def stop(self) -> None:
        """Stop the inbox and the gate (whatever still runs)."""
        if self.inbox is not None:
            self.inbox.stop()
        if self.gate is not None and self.gate.proc is not None and self.gate.proc.poll() is None:
            self.gate.stop()


@dataclass
class Answer:
    """One HTTP answer: ``status``, ``headers`` (name lowercased → every value), ``body``."""

    status: int
    headers: dict[str, list[str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name``, or None."""
        values = self.headers.get(name.lower())
        return values[0] if values else None

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)

    @property
    def text(self) -> str:
        """The body as text."""
        return self.body.decode("utf-8", "replace")


def field_value(page: str, name: str) -> str:
    """The value of the first ``<input name=NAME value=…>`` of a page."""
    found = re.search(rf'name="{re.escape(name)}" value="([^"]*)"', page)
    assert found, f"no field {name} in the page"
    return html.unescape(found.group(1))


class InboxClient:
    """A browser-like HTTP client of the inbox: a cookie jar, ``Origin`` on POSTs; with
    ``source`` (a loopback address such as ``127.0.0.12``) its connections come from there
    (the inbox counts sign-in tries per client address)."""

    def __init__(self, base: str, origin: str, source: str | None = None) -> None:
        self.base = base
        self.origin = origin
        self.source = source
        self.cookies: dict[str, str] = {}
        self.rp_id = RP_ID

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        cookies: bool = True,
    ) -> Answer:
        """One request to ``path``; cookies sent (unless ``cookies`` is False) and kept."""
        parts = urllib.parse.urlsplit(self.base)
        source = None if self.source is None else (self.source, 0)
        conn = http.client.HTTPConnection(
            parts.hostname, parts.port, timeout=30, source_address=source
        )
        sent = dict(headers or {})
        if cookies and self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        try:
            conn.request(method, path, body=body, headers=sent)
            resp = conn.getresponse()
            got: dict[str, list[str]] = {}
            for name, value in resp.getheaders():
                got.setdefault(name.lower(), []).append(value)
            answer = Answer(resp.status, got, resp.read())
        finally:
            conn.close()
        for line in answer.headers.get("set-cookie", []):
            jar: SimpleCookie = SimpleCookie()
            jar.load(line)
            for name, morsel in jar.items():
                if morsel["max-age"] == "0" or not morsel.value:
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return answer

    def get(self, path: str, headers: dict[str, str] | None = None) -> Answer:
        """GET ``path``."""
        return self.request("GET", path, headers=headers)

    def post_json(
        self, path: str, body: dict[str, Any], csrf: str | None = None, **headers: str
    ) -> Answer:
        """POST JSON as inbox.js does (``Origin``, ``X-CSRF-Token`` = ``csrf``, default the
        body's ``csrf``); ``headers`` override (``Origin=None`` is not possible: use
        ``request``)."""
        sent = {"Content-Type": "application/json", "Origin": self.origin}
        token = csrf if csrf is not None else body.get("csrf")
        if isinstance(token, str):
            sent["X-CSRF-Token"] = token
        sent.update(headers)
        return self.request("POST", path, json.dumps(body).encode(), sent)

    def post_form(self, path: str, fields: dict[str, str], **headers: str) -> Answer:
        """POST a plain HTML form (form-urlencoded, ``Origin``)."""
        sent = {"Content-Type": "application/x-www-form-urlencoded", "Origin": self.origin}
        sent.update(headers)
        return self.request("POST", path, urllib.parse.urlencode(fields).encode(), sent)

    def signin(
        self, passkey: SoftAuthenticator, next_path: str | None = None, **assertion: Any
    ) -> Answer:
        """GET /signin, sign its challenge with ``passkey`` (``assertion`` overrides
        ``rp_id``/``origin``), POST it; the answer (200 ``{"location"}`` when signed in)."""
        page = self.get("/signin" + (f"?next={next_path}" if next_path else ""))
        challenge = re.search(r'data-challenge="([^"]+)"', page.text)
        assert challenge, page.text
        csrf = field_value(page.text, "csrf")
        signed = passkey.assert_(
            challenge.group(1), assertion.get("rp_id", self.rp_id),
            assertion.get("origin", self.origin),
        )  # fmt: skip
        return self.post_json("/signin", {"csrf": csrf, "assertion": signed})

    def item_form(self, approval_id: str) -> tuple[str, str]:
        """(csrf, revision) as the item's page shows them."""
        page = self.get(f"/items/{urllib.parse.quote(approval_id, safe='')}")
        assert page.status == 200, (page.status, page.text)
        return field_value(page.text, "csrf"), field_value(page.text, "revision")

    def decide(
        self,
        approval_id: str,
        passkey: SoftAuthenticator,
        verb: str = "approve",
        *,
        reason: str | None = None,
        adjust_text: str | None = None,
        revision: str | None = None,
    ) -> Answer:
        """Decide as the item page's script does: the form's fields to ``/challenge``, the
        challenge signed by ``passkey``, the fields + assertion to ``/decide``."""
        csrf, shown = self.item_form(approval_id)
        fields = {"csrf": csrf, "decision": verb, "revision": revision or shown}
        if reason is not None:
            fields["reason"] = reason
        if adjust_text is not None:
            fields["adjust_text"] = adjust_text
        base = f"/items/{urllib.parse.quote(approval_id, safe='')}"
        got = self.post_json(base + "/challenge", fields)
        if got.status != 200:
            return got
        signed = passkey.assert_(got.json()["challenge"], self.rp_id, self.origin)
        return self.post_json(base + "/decide", {**fields, "assertion": signed})


def start_world(folder: Path, enrol: tuple[int, ...] = (101, 102), **kw: Any) -> InboxWorld:
    """A running gate with passkeys enrolled for ``enrol`` (before the inbox starts, so its
    first fetch has them) and a running inbox; stop it with ``world.stop()``."""
    from tests.support import free_port  # noqa: PLC0415

    world = InboxWorld(folder, free_port(), free_port(), **kw)
    try:
        world.start_gate()
        for operator in enrol:
            world.enrol(operator)
        world.start_inbox()
    except BaseException:
        world.stop()
        raise
    return world


# a quorum-2 step the gate reminds about every second, for progress and /live tests
REMINDED_STEP = {"name": "q2r", "quorum": 2, "approvers": [101, 102, 103], "timeout": "1h",
                 "remind_every": "1s", **SIGNED}  # fmt: skip


def reminded_world(tmp_path_factory: Any, name: str) -> Iterator[InboxWorld]:
    """A module's world (gate + inbox, alice, bob and carol enrolled) with ``REMINDED_STEP``
    besides ``STEPS``; stopped after the module. Use as ``yield from`` in a fixture."""
    started = start_world(
        tmp_path_factory.mktemp(name), enrol=(101, 102, 103), steps=[*STEPS, REMINDED_STEP]
    )
    yield started
    started.stop()
