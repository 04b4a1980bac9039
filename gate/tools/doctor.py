"""``hitl-gate doctor``: health checks of a deployment, one PASS/WARN/FAIL/SKIP line each.

Checks, in order: the config, its secret variables, its Ed25519 key files, the database
(``PRAGMA integrity_check``, schema version), the audit chain (hashes, receipts, signatures),
the relay URL (reachable: any HTTP answer to HEAD or OPTIONS), the dispatches, for a config
that asks questions a separate question relay URL and the questions' dispatches,
and the clock (after this release's date, and close to the relay's ``Date`` header).
Nothing is written: the database is opened read-only and nothing is dispatched.
On PostgreSQL (``storage.url``) the audit chain, the dispatches and the passkeys are read
from the database, and the gates sharing it are checked (``doctor_cluster``: live gates,
one config, clocks); the database's pages are the server's to check.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gate.config import Config, read_receipt_key, read_storage_password
from gate.config.fingerprint import config_hash
from gate.tools.doctor_audit import check_audit, check_database
from gate.tools.doctor_check import Check, skip
from gate.tools.doctor_cluster import check_cluster
from gate.tools.doctor_config import (
    asks_questions,
    check_config,
    check_keys,
    check_secrets,
    followups_summary,
    separate_question_url,
)
from gate.tools.doctor_passkeys import check_passkeys
from gate.tools.doctor_relay import (
    RelayProbe,
    check_clock,
    check_dispatch,
    check_relay,
    probe_relay,
    safe_url,
)
from gate.trust.keys import ReceiptKeys

if TYPE_CHECKING:
    from gate.store.readonly import Database

# the checks after the config's, in report order: SKIP (not ok) without a valid config
NEED_CONFIG = "followups secrets keys database audit relay dispatch passkeys clock".split()


async def run_checks(
    config_path: str, environ: Mapping[str, str], now: Callable[[], float] = time.time
) -> list[Check]:
    """Run every check against the config at ``config_path`` and the secrets in ``environ``;
    return them in report order. Checks needing a valid config are SKIP (not ok) without one."""
    config_check, config = check_config(config_path)
    if config is None:
        return [config_check] + [
            skip(name, "needs a valid config", ok=False) for name in NEED_CONFIG
        ]
    secrets_check = check_secrets(config, environ)
    keys_check, keys = check_keys(config)
    if config.storage.url is not None:
        first = (config_check, secrets_check, keys_check, keys)
        return await _postgres_checks(config, environ, now, first)
    path = config.storage.sqlite_file()
    database_check = await asyncio.to_thread(check_database, path)
    # the receipt keys are read on their own: other secrets missing do not hide them
    receipt_key = read_receipt_key(config, environ)
    previous_key = read_receipt_key(config, environ, previous=True)
    audit_check = await asyncio.to_thread(
        check_audit, path, receipt_key, keys, previous_key, config.receipts
    )
    relay = config.relay
    probe = await probe_relay(relay.url, relay.dispatch_timeout, relay.ca_file, now)
    return [
        config_check,
        Check("followups", True, followups_summary(config, int(now() * 1000), safe_url)),
        secrets_check,
        keys_check,
        database_check,
        audit_check,
        *await _delivery_checks(config, path, probe, now),
        check_clock(now(), probe, relay.security.max_skew),
    ]


async def _delivery_checks(
    config: Config, path: Database, probe: RelayProbe, now: Callable[[], float]
) -> list[Check]:
    """The relay (``probe``: what it answered), the dispatches, for a config that asks
    questions its question relay and their dispatches, and the passkeys: read from the
    database ``path`` (a SQLite file or a ``PgTarget``)."""
    relay = config.relay
    now_ms = int(now() * 1000)
    asked: list[Check] = []  # only for a config that asks questions
    if asks_questions(config):
        url = separate_question_url(config)
        if url is not None:
            probed = await probe_relay(url, relay.dispatch_timeout, relay.ca_file, now)
            asked.append(check_relay(url, probed, "question relay"))
        asked.append(await asyncio.to_thread(check_dispatch, path, "question"))
    return [
        check_relay(relay.url, probe),
        await asyncio.to_thread(check_dispatch, path, "approval", now_ms),
        *asked,
        *await asyncio.to_thread(check_passkeys, config, path, now_ms),
    ]


async def _postgres_checks(
    config: Config,
    environ: Mapping[str, str],
    now: Callable[[], float],
    first: tuple[Check, Check, Check, ReceiptKeys | None],
) -> list[Check]:
    """The report for a config on PostgreSQL (``storage.url``): the config's checks
    (``first``: config, secrets, keys, and the keys read), the follow-ups line, the audit
    chain (``check_audit`` on the database), the gates on the database (``check_cluster``),
    the relay, the dispatches and the passkeys read from the database, and the clock; the
    database line names its schema and counts (its pages are the server's to check)."""
    from gate.postgres.target import PgTarget  # not for a SQLite config

    config_check, secrets_check, keys_check, keys = first
    assert config.storage.url is not None
    # the password as the gate reads it (a variable or a credentials file), on its own: other
    # secrets missing are the secrets line's to say, not the database's
    password = read_storage_password(config, environ)
    cluster = await check_cluster(config.storage.url, password, config_hash(config))
    target = PgTarget(config.storage.url, password, "doctor")
    audit_check = await asyncio.to_thread(
        check_audit,
        target,
        read_receipt_key(config, environ),
        keys,
        read_receipt_key(config, environ, previous=True),
        config.receipts,
    )
    relay = config.relay
    probe = await probe_relay(relay.url, relay.dispatch_timeout, relay.ca_file, now)
    return [
        config_check,
        Check("followups", True, followups_summary(config, int(now() * 1000), safe_url)),
        secrets_check,
        keys_check,
        await asyncio.to_thread(check_database, target),
        audit_check,
        cluster,
        *await _delivery_checks(config, target, probe, now),
        check_clock(now(), probe, relay.security.max_skew),
    ]
