"""Layering rules of STYLE.md, checked by parsing the imports of every module under gate/.

- ``gate/protocol/*`` is pure: no asyncio, network, database, clock, and no upward imports
  (``gate.store``, ``gate.core``, ``gate.web``).
- ``gate/core/*`` holds the rules: no aiohttp (web or client), no SQL driver, no click.
- ``gate/web/*`` request handlers never reach the store: a web module that registers routes,
  and every gate.web module it imports, must not import ``gate.store``; ``web/`` never imports
  the daemon (``gate/daemon/app.py``, ``build_gate``, is the composition root that wires it).
- Handler and metrics code (``gate/web/*``, ``gate/metrics.py``) never touches an attribute
  named ``store``: health and scrape data come from ``GateService`` (``health()``,
  ``pending_summary()``, ``writer_unanswered_s``).
- One composition root: only ``gate/daemon/app.py`` (``build_gate``) constructs the
  GateService, the Metrics, the Dispatcher and the two apps.
- ``gate/core/requests/*`` (the lifecycle every kind shares) imports neither
  ``gate/core/approvals`` nor ``gate/core/questions``: kinds plug in through ``Kind``.
- ``gate/core/*`` imports neither the daemon nor prometheus; relays under ``gate/tools/`` use
  ``gate.protocol`` but never the core, store or daemon; ``gate/client/*`` (the pipeline side)
  never reaches the store, daemon or web.
- ``gate/relay/*`` (relay-side I/O: signed delivery, reading a signed POST) is used by the
  relays, the inbox and conformance: it imports ``gate.protocol`` and ``gate.errors``, never the
  core, store, daemon, web, config or the programs that use it.
- Only ``gate/store/*`` speaks SQL (imports sqlite3/aiosqlite), with ``gate/postgres/*`` (what
  the store and the inbox share of PostgreSQL) and the inbox's own database modules.
- ``gate/postgres/*`` imports the standard library, ``gate.errors`` and its own modules only
  (psycopg lazily, inside functions): never the store, core, inbox or anything above them.
- Of ``gate/core/``, the store imports only ``gate/model.py`` (the values it returns),
  and ``model.py`` imports nothing but the standard library.
- Of the ``gate/audit/*`` modules, only ``audit/verify.py`` imports the store; chain, entries,
  records and spans import no store, no sqlite3, no aiohttp (pure: the store's writer and
  readers depend on them, never the other way round).
- ``gate/sdk/*`` (imported by agents) uses the standard library, aiohttp and
  ``gate.protocol`` only; ``gate.config`` lazily (``from_config``), never at import.
- Every module under gate/ is at most MAX_MODULE_LINES lines: one split by job when it grows.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

GATE = Path(__file__).resolve().parent.parent / "gate"


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. gate.protocol.signing
    path: Path
    tree: ast.Module

    @property
    def rel(self) -> str:
        return self.path.relative_to(GATE.parent).as_posix()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(GATE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> list[Module]:
    return [
        Module(_module_name(p), p, ast.parse(p.read_text(encoding="utf-8"), str(p)))
        for p in sorted(GATE.rglob("*.py"))
    ]


MODULES = all_modules()


def imports_of(module: Module) -> set[str]:
    """Every module an ``import``/``from ... import`` names (relative imports resolved),
    including ``from pkg import sub`` as ``pkg.sub``; imports under TYPE_CHECKING count too."""
    out: set[str] = set()
    package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def hits(imported: set[str], forbidden: tuple[str, ...]) -> list[str]:
    """The imported names equal to, or inside, a forbidden module."""
    return sorted(
        name for name in imported for bad in forbidden if name == bad or name.startswith(bad + ".")
    )


def under(prefix: str) -> list[Module]:
    return [m for m in MODULES if m.name == prefix or m.name.startswith(prefix + ".")]


def ids(modules: list[Module]) -> list[str]:
    return [m.rel for m in modules]


PROTOCOL_FORBIDDEN = (
    "asyncio",
    "aiohttp",
    "aiosqlite",
    "sqlite3",
    "socket",
    "time",
    "gate.store",
    "gate.core",
    "gate.web",
    "gate.clock",
    "gate.daemon.dispatch",
)
CORE_FORBIDDEN = ("aiohttp", "sqlite3", "aiosqlite", "click")
SQL_DRIVERS = ("sqlite3", "aiosqlite")
CLOCK_READS = {"now", "utcnow", "today", "time", "time_ns", "monotonic", "perf_counter"}


# --------------------------------------------------------------------------- sanity


def test_layers_modules_found() -> None:
    names = {m.name for m in MODULES}
    for expected in (
        "gate.protocol.signing",
        "gate.protocol.envelope",
        "gate.protocol.canonical",
        "gate.core.approvals.rules",
        "gate.core.service",
        "gate.store.facade",
        "gate.web.callback",
        "gate.audit.chain",
    ):
        assert expected in names


def test_layers_import_scanner_sees_relative_and_from_imports() -> None:
    tree = ast.parse(
        "from . import store\nfrom ..store import db\nimport sqlite3 as s\n"
        "from gate import store as st\n"
    )
    fake = Module("gate.web.fake", GATE / "web" / "fake.py", tree)

    found = imports_of(fake)
    assert {"gate.web.store", "gate.store", "gate.store.db", "sqlite3"} <= found
    assert hits(found, ("gate.store",)) == ["gate.store", "gate.store.db"]
    assert hits(found, ("gate.stor",)) == []  # prefix match is per dotted component


# --------------------------------------------------------------------------- size

MAX_MODULE_LINES = 450


@pytest.mark.parametrize("module", MODULES, ids=ids(MODULES))
def test_layers_every_module_is_at_most_450_lines(module: Module) -> None:
    lines = len(module.path.read_text(encoding="utf-8").splitlines())

    assert lines <= MAX_MODULE_LINES, (
        f"{module.rel} has {lines} lines (at most {MAX_MODULE_LINES}): split it by job"
    )


# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize("module", under("gate.protocol"), ids=ids(under("gate.protocol")))
def test_layers_protocol_is_pure(module: Module) -> None:
    bad = hits(imports_of(module), PROTOCOL_FORBIDDEN)

    assert not bad, f"{module.rel} must stay pure (SPEC/STYLE protocol/), imports {bad}"


@pytest.mark.parametrize("module", under("gate.protocol"), ids=ids(under("gate.protocol")))
def test_layers_protocol_reads_no_clock(module: Module) -> None:
    calls = [
        f"{ast.unparse(node.func)} (line {node.lineno})"
        for node in ast.walk(module.tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCK_READS
    ]

    assert not calls, f"{module.rel} reads the clock; take `now` as an argument: {calls}"


@pytest.mark.parametrize("module", under("gate.core"), ids=ids(under("gate.core")))
def test_layers_core_has_no_http_sql_or_cli(module: Module) -> None:
    bad = hits(imports_of(module), CORE_FORBIDDEN)

    assert not bad, f"{module.rel}: core/ has no aiohttp, no SQL driver, no click; imports {bad}"


REQUESTS = under("gate.core.requests")
KIND_PACKAGES = ("gate.core.approvals", "gate.core.questions")


@pytest.mark.parametrize("module", REQUESTS, ids=ids(REQUESTS))
def test_layers_request_lifecycle_knows_no_kind(module: Module) -> None:
    """``core/requests`` is the lifecycle every kind shares: a kind plugs in only through
    ``gate.core.requests.kind.Kind``; the lifecycle imports neither ``core/approvals`` nor
    ``core/questions``."""
    bad = hits(imports_of(module), KIND_PACKAGES)

    assert not bad, f"{module.rel} is the shared lifecycle and imports a kind: {bad}"


def test_layers_request_lifecycle_rule_sees_its_modules() -> None:
    assert {m.name for m in REQUESTS} >= {
        "gate.core.requests.kind",
        "gate.core.requests.lifecycle_tx",
        "gate.core.requests.service",
    }
    assert {m.name for m in under("gate.core.approvals")} >= {"gate.core.approvals.kind"}
    assert {m.name for m in under("gate.core.questions")} >= {"gate.core.questions.kind"}


ROUTE_CALLS = {
    "add_get",
    "add_post",
    "add_put",
    "add_patch",
    "add_delete",
    "add_head",
    "add_route",
    "add_routes",
    "add_view",
}


def registers_routes(module: Module) -> bool:
    """True when the module adds routes (``router.add_*``) or builds a ``RouteTableDef``."""
    for node in ast.walk(module.tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ROUTE_CALLS
        ):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "RouteTableDef":
            return True
    return False


WEB = under("gate.web")
WEB_BY_NAME = {m.name: m for m in WEB}


def handler_modules() -> list[Module]:
    """Web modules holding request handling code: those that register routes, and every
    gate.web module they import (middlewares, body readers), transitively. The composition
    root (gate/daemon/app.py: builds the Store and the GateService, registers no routes) is
    outside gate/web/ altogether."""
    found = {m.name for m in WEB if registers_routes(m)}
    todo = list(found)
    while todo:
        for name in imports_of(WEB_BY_NAME[todo.pop()]):
            if name in WEB_BY_NAME and name not in found:
                found.add(name)
                todo.append(name)
    return [WEB_BY_NAME[name] for name in sorted(found)]


HANDLER_MODULES = handler_modules()


def test_layers_web_handler_modules_detected() -> None:
    names = {m.name for m in HANDLER_MODULES}

    assert {"gate.web.api", "gate.web.callback", "gate.web.common"} <= names


@pytest.mark.parametrize("module", HANDLER_MODULES, ids=ids(HANDLER_MODULES))
def test_layers_web_handlers_do_not_import_store(module: Module) -> None:
    bad = hits(imports_of(module), ("gate.store",) + SQL_DRIVERS)

    assert not bad, f"{module.rel} handles requests and imports {bad}; go through GateService"


NO_STORE_ATTRIBUTE = WEB + under("gate.metrics")


@pytest.mark.parametrize("module", NO_STORE_ATTRIBUTE, ids=ids(NO_STORE_ATTRIBUTE))
def test_layers_web_and_metrics_never_reach_the_store_through_the_service(module: Module) -> None:
    reached = [
        f"{ast.unparse(node)} (line {node.lineno})"
        for node in ast.walk(module.tree)
        if isinstance(node, ast.Attribute) and node.attr == "store"
    ]

    assert not reached, f"{module.rel} reaches the store; ask GateService instead: {reached}"


def test_layers_store_attribute_rule_sees_its_modules() -> None:
    assert {m.name for m in NO_STORE_ATTRIBUTE} >= {"gate.web.api", "gate.metrics"}


INBOX_SQL = {"gate.inbox.db", "gate.inbox.schema", "gate.inbox.pgschema", "gate.inbox.shortlived"}

COMPOSITION_ROOT = "gate.daemon.app"
WIRED_ONLY_THERE = {
    "GateService",
    "Metrics",
    "Dispatcher",
    "create_api_app",
    "create_callback_app",
    "Timers",
}


def constructions(module: Module) -> list[str]:
    """Calls in ``module`` of a name in ``WIRED_ONLY_THERE`` (``X(...)`` or ``mod.X(...)``)."""
    found = []
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in WIRED_ONLY_THERE:
            found.append(f"{name} (line {node.lineno})")
    return found


@pytest.mark.parametrize("module", MODULES, ids=ids(MODULES))
def test_layers_only_the_composition_root_wires_a_gate(module: Module) -> None:
    if module.name == COMPOSITION_ROOT:
        return

    built = constructions(module)

    assert not built, f"{module.rel} wires part of a gate by hand; use build_gate: {built}"


def test_layers_composition_root_rule_sees_the_root() -> None:
    (root,) = [m for m in MODULES if m.name == COMPOSITION_ROOT]

    assert {c.split()[0] for c in constructions(root)} == WIRED_ONLY_THERE


@pytest.mark.parametrize("module", MODULES, ids=ids(MODULES))
def test_layers_only_store_speaks_sql(module: Module) -> None:
    bad = hits(imports_of(module), SQL_DRIVERS)
    if module.name == "gate.store" or module.name.startswith("gate.store."):
        return
    if module.name in INBOX_SQL:  # the inbox's own file, not the gate's
        return
    if module.name == "gate.postgres" or module.name.startswith("gate.postgres."):
        return  # shared by the store and the inbox

    assert not bad, f"{module.rel} imports {bad}; only gate/store/ speaks SQL"


POSTGRES = under("gate.postgres")


@pytest.mark.parametrize("module", POSTGRES, ids=ids(POSTGRES))
def test_layers_postgres_is_neutral(module: Module) -> None:
    """gate/postgres is shared by the store and the inbox: of the project, it imports
    ``gate.errors`` and itself only; psycopg only inside functions (an optional extra)."""
    imported = imports_of(module)
    other = sorted(
        name
        for name in imported
        if (name == "gate" or name.startswith("gate."))
        and not any(
            name == ok or name.startswith(ok + ".") for ok in ("gate.errors", "gate.postgres")
        )
    )
    top = {
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for node in module.tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }

    assert not other, f"{module.rel} is shared by the store and the inbox and imports {other}"
    assert not hits(top, ("psycopg",)), f"{module.rel} imports psycopg at import time"


def test_layers_postgres_rule_sees_its_modules() -> None:
    assert {m.name for m in POSTGRES} >= {
        "gate.postgres.connection",
        "gate.postgres.target",
        "gate.postgres.migrate",
    }


# --------------------------------------------------------------------------- who runs what
# (the packages are grouped by who runs them; these rules keep the picture true)

RELAYS = under("gate.tools.reference_relay")
CLIENT = under("gate.client")


@pytest.mark.parametrize("module", under("gate.core"), ids=ids(under("gate.core")))
def test_layers_core_imports_neither_the_daemon_nor_prometheus(module: Module) -> None:
    bad = hits(
        imports_of(module),
        ("gate.daemon", "gate.web", "gate.cli", "prometheus_client", "gate.metrics"),
    )

    assert not bad, f"{module.rel}: core/ is the rules, run by the daemon, not part of it: {bad}"


@pytest.mark.parametrize("module", WEB, ids=ids(WEB))
def test_layers_web_does_not_import_the_daemon(module: Module) -> None:
    bad = hits(imports_of(module), ("gate.daemon", "gate.cli"))

    assert not bad, f"{module.rel}: web/ holds app factories and handlers; the daemon wires them"


@pytest.mark.parametrize("module", RELAYS, ids=ids(RELAYS))
def test_layers_relays_are_untrusted_peers(module: Module) -> None:
    """A relay (tools/reference_relay, and any relay added under tools/) speaks hitl/v0 to the
    gate: it may use gate.protocol, never the gate's rules, store or daemon."""
    bad = hits(
        imports_of(module),
        ("gate.core", "gate.store", "gate.daemon", "gate.web", "gate.audit", "gate.trust")
        + SQL_DRIVERS,
    )

    assert not bad, f"{module.rel} is a relay (an untrusted peer) and imports {bad}"


INBOX = under("gate.inbox")


@pytest.mark.parametrize("module", INBOX, ids=ids(INBOX))
def test_layers_inbox_is_an_untrusted_peer(module: Module) -> None:
    """The inbox is a separate program, a hitl/v0 relay: gate.protocol, the generic
    config helpers, logs and clock; never the gate's rules, store, daemon, web, audit, trust."""
    bad = hits(
        imports_of(module),
        ("gate.core", "gate.store", "gate.daemon", "gate.web", "gate.audit", "gate.trust"),
    )

    assert not bad, f"{module.rel} is the inbox (an untrusted peer) and imports {bad}"


def test_layers_inbox_render_is_pure() -> None:
    """What the approver sees is decided without I/O (gate/inbox/render.py)."""
    render = next(m for m in INBOX if m.name == "gate.inbox.render")
    bad = hits(imports_of(render), PROTOCOL_FORBIDDEN + ("aiohttp_jinja2", "jinja2"))

    assert not bad, f"{render.rel} imports {bad}"


@pytest.mark.parametrize("module", CLIENT, ids=ids(CLIENT))
def test_layers_client_speaks_only_the_pipeline_api(module: Module) -> None:
    bad = hits(
        imports_of(module), ("gate.store", "gate.daemon", "gate.web", "gate.tools") + SQL_DRIVERS
    )

    assert not bad, f"{module.rel} runs in a pipeline, not in the daemon, and imports {bad}"


AUDIT = under("gate.audit")
AUDIT_PURE = [m for m in AUDIT if m.name != "gate.audit.verify"]


@pytest.mark.parametrize("module", AUDIT_PURE, ids=ids(AUDIT_PURE))
def test_layers_audit_chain_entries_records_spans_are_pure(module: Module) -> None:
    bad = hits(imports_of(module), ("gate.store", "aiohttp") + SQL_DRIVERS)

    assert not bad, f"{module.rel}: of audit/, only audit/verify.py reads the store; imports {bad}"


def test_layers_audit_pure_modules_found() -> None:
    names = {m.name for m in AUDIT_PURE}

    assert names >= {
        "gate.audit.chain",
        "gate.audit.segments",
        "gate.audit.receipts",
        "gate.audit.export",
        "gate.audit.entries",
        "gate.audit.records",
        "gate.audit.record_checks",
        "gate.audit.approval_kind",
        "gate.audit.question_kind",
        "gate.audit.report",
        "gate.audit.spans",
    }


def test_layers_who_runs_what_rules_see_their_packages() -> None:
    assert {m.name for m in RELAYS} >= {"gate.tools.reference_relay.relay"}
    assert {m.name for m in CLIENT} >= {"gate.client.api", "gate.client.request"}


STORE = under("gate.store")
MODEL = "gate.model"


@pytest.mark.parametrize("module", STORE, ids=ids(STORE))
def test_layers_store_imports_of_core_only_the_model(module: Module) -> None:
    bad = [name for name in hits(imports_of(module), ("gate.core",)) if name != MODEL]
    bad = [name for name in bad if not name.startswith(MODEL + ".")]

    assert not bad, f"{module.rel}: the store returns gate.model values, nothing more: {bad}"


def test_layers_model_imports_only_the_standard_library() -> None:
    (model,) = [m for m in MODULES if m.name == MODEL]
    outside = sorted(
        name
        for name in imports_of(model)
        if name.split(".")[0] not in sys.stdlib_module_names
        and name != "__future__"
        and not name.startswith("__future__.")
    )

    assert not outside, f"{model.rel} holds plain values; imports {outside}"


# --------------------------------------------------------------------------- relay-side I/O
# (one signed delivery and one receiver for every relay: the reference relay, the inbox)

RELAY_IO = under("gate.relay")
RELAY_IO_ALLOWED_GATE = ("gate.protocol", "gate.errors", "gate.relay")


@pytest.mark.parametrize("module", RELAY_IO, ids=ids(RELAY_IO))
def test_layers_relay_io_uses_only_the_protocol(module: Module) -> None:
    """gate/relay is shared by untrusted peers (the inbox, the reference relay) and
    conformance: it may use gate.protocol and gate.errors, nothing else of the gate."""
    imported = imports_of(module)
    other = sorted(
        name
        for name in imported
        if (name == "gate" or name.startswith("gate."))
        and not any(name == ok or name.startswith(ok + ".") for ok in RELAY_IO_ALLOWED_GATE)
    )

    assert not other and not hits(imported, SQL_DRIVERS), f"{module.rel} imports {other}"


def test_layers_relay_io_rule_sees_its_modules() -> None:
    assert {m.name for m in RELAY_IO} >= {"gate.relay.delivery", "gate.relay.inbound"}


# --------------------------------------------------------------------------- the inbox
# (a separate program, a hitl/v0 relay with its own database)

INBOX = under("gate.inbox")
INBOX_ALLOWED_GATE = (
    "gate.protocol",
    "gate.config.values",
    "gate.config.yamlfile",
    "gate.config.webauthn",
    "gate.config.messages",
    "gate.config.secrets",
    "gate.logs",
    "gate.clock",
    "gate.errors",
    "gate.relay",
    "gate.postgres",
    "gate.config.storage",
    "gate.inbox",
)


@pytest.mark.parametrize("module", INBOX, ids=ids(INBOX))
def test_layers_the_inbox_is_an_untrusted_peer(module: Module) -> None:
    """The inbox is a relay: gate.protocol and the generic config helpers, never the gate's
    rules, store, daemon, web, audit or trust; of its modules only db.py, schema.py and
    shortlived.py speak SQL."""
    imported = imports_of(module)
    bad = hits(
        imported,
        ("gate.core", "gate.store", "gate.daemon", "gate.web", "gate.audit", "gate.trust"),
    )
    other = sorted(
        name
        for name in imported
        if (name == "gate" or name.startswith("gate."))
        and not any(name == ok or name.startswith(ok + ".") for ok in INBOX_ALLOWED_GATE)
    )
    sql = hits(imported, SQL_DRIVERS) if module.name not in INBOX_SQL else []

    assert not bad and not other and not sql, (
        f"{module.rel} is the inbox and imports {bad + other + sql}"
    )


@pytest.mark.parametrize("module", INBOX, ids=ids(INBOX))
def test_layers_the_inbox_imports_no_private_name_of_the_gate(module: Module) -> None:
    """What the inbox shares with the gate (config helpers) is public and documented: a
    refactor of a private name can never break it silently."""
    private = sorted(
        f"{node.module}.{alias.name}"
        for node in ast.walk(module.tree)
        if isinstance(node, ast.ImportFrom)
        and node.module is not None
        and node.module.startswith("gate.")
        and not node.module.startswith("gate.inbox")
        for alias in node.names
        if alias.name.startswith("_")
    )

    assert not private, f"{module.rel} imports private names {private}"


def test_layers_inbox_rules_see_its_modules() -> None:
    assert {m.name for m in INBOX} >= {"gate.inbox.db", "gate.inbox.relay", "gate.inbox.config"}
    assert {m.name for m in INBOX} >= {
        f"gate.inbox.{name}" for name in ("app", "auth", "credentials_cache", "decide", "signin")
    }


def _runtime_imports(module: Module) -> set[str]:
    """``imports_of`` without the imports under ``if TYPE_CHECKING:`` (annotations only)."""
    tree = ast.Module(
        body=[
            node
            for node in module.tree.body
            if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
        ],
        type_ignores=[],
    )
    return imports_of(Module(module.name, module.path, tree))


def test_layers_inbox_has_no_import_loops() -> None:
    """No module of gate/inbox imports, through others, itself (the shared state lives in
    ``state.py``, below the route modules; an import under TYPE_CHECKING does not count)."""
    names = {m.name for m in INBOX}
    graph = {m.name: {n for n in _runtime_imports(m) if n in names and n != m.name} for m in INBOX}
    loops = []
    for start in sorted(graph):
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            if name == start:
                loops.append(start)
                break
            if name not in seen:
                seen.add(name)
                todo.extend(graph[name])

    assert not loops, f"gate/inbox modules that import themselves through others: {loops}"


# --------------------------------------------------------------------------- the SDK
# (gate/sdk runs inside an agent's process; the CLI's ApiClient is built on it)

SDK = under("gate.sdk")
# gate.config only inside a function (AsyncGate.from_config reads a gate config file)
SDK_ALLOWED_GATE = ("gate.protocol", "gate.sdk", "gate.config")
SDK_ALLOWED_THIRD_PARTY = ("aiohttp",)


def _top_level_imports(module: Module) -> set[str]:
    """The names imported when the module is imported (not inside functions or classes);
    imports under ``if TYPE_CHECKING:`` are left out (they run only for the type checker)."""
    deferred = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    top = ast.Module(
        body=[
            n
            for n in module.tree.body
            if not isinstance(n, deferred)
            and not (isinstance(n, ast.If) and ast.unparse(n.test).endswith("TYPE_CHECKING"))
        ],
        type_ignores=[],
    )
    return imports_of(Module(module.name, module.path, top))


@pytest.mark.parametrize("module", SDK, ids=ids(SDK))
def test_layers_sdk_imports_the_standard_library_aiohttp_and_the_protocol(module: Module) -> None:
    """An agent imports gate.sdk: it must not pull in the daemon's rules, store, web, audit,
    trust, inbox or CLI (nor click, nor a SQL driver); gate.config only lazily."""
    imported = imports_of(module)
    gate_names = [n for n in imported if n == "gate" or n.startswith("gate.")]
    bad = sorted(
        n
        for n in gate_names
        if not any(n == ok or n.startswith(ok + ".") for ok in SDK_ALLOWED_GATE)
    )
    foreign = sorted(
        n
        for n in imported - set(gate_names)
        if n.split(".")[0] not in sys.stdlib_module_names
        and n.split(".")[0] not in SDK_ALLOWED_THIRD_PARTY
        and n.split(".")[0] != "__future__"
    )
    eager_config = hits(_top_level_imports(module), ("gate.config",))

    assert not bad and not foreign and not eager_config, (
        f"{module.rel} is the SDK and imports {bad + foreign} (eagerly: {eager_config})"
    )


def test_layers_sdk_rules_see_its_modules() -> None:
    assert {m.name for m in SDK} >= {"gate.sdk", "gate.sdk.transport", "gate.sdk.client"}


# --------------------------------------------------------------------------- the MCP server
# (a client of the pipeline API through the SDK, like any agent)

MCP = under("gate.mcp")
MCP_ALLOWED_GATE = ("gate.sdk", "gate.mcp", "gate.logs", "gate.errors")


@pytest.mark.parametrize("module", MCP, ids=ids(MCP))
def test_layers_the_mcp_server_is_a_client_of_the_pipeline_api(module: Module) -> None:
    """``hitl-gate mcp`` reaches the gate only through gate.sdk (the pipeline API): never
    the rules, store, daemon, web, audit, trust, the inbox or the CLI; no SQL."""
    imported = imports_of(module)
    other = sorted(
        name
        for name in imported
        if (name == "gate" or name.startswith("gate."))
        and name not in ("gate", "gate.__version__")  # the version, nothing else
        and not any(name == ok or name.startswith(ok + ".") for ok in MCP_ALLOWED_GATE)
    )
    sql = hits(imported, SQL_DRIVERS)

    assert not other and not sql, f"{module.rel} is the MCP server and imports {other + sql}"


def test_layers_mcp_rules_see_its_modules() -> None:
    assert {m.name for m in MCP} >= {"gate.mcp.server", "gate.mcp.tools", "gate.mcp.auth"}


# --------------------------------------------------------------------------- outbox channels

# the channel adapters of the one delivery loop (gate/daemon/delivery.py, docs/design.md
# "One sender"): each knows its own outbox only
CHANNEL_MODULES = (
    "gate.daemon.approval_dispatch",
    "gate.daemon.followups",
    "gate.daemon.question_sender",
    "gate.daemon.question_notices",
)
CHANNELS = [m for m in MODULES if m.name in CHANNEL_MODULES]


@pytest.mark.parametrize("module", CHANNELS, ids=ids(CHANNELS))
def test_layers_outbox_channels_do_not_import_each_other(module: Module) -> None:
    """A channel adapter uses the delivery loop and the dispatcher's settings, never another
    channel: what two channels share belongs in the loop (``gate.daemon.delivery``)."""
    others = tuple(name for name in CHANNEL_MODULES if name != module.name)
    bad = hits(imports_of(module), others)
    assert not bad, f"{module.rel} is an outbox channel and imports another one: {bad}"


def test_layers_outbox_channel_rule_sees_every_channel() -> None:
    assert {m.name for m in CHANNELS} == set(CHANNEL_MODULES)
