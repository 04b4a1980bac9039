"""``hitl-gate audit signatures``: list the approver-signed decisions an audit log holds, each
re-verified against the key its enrolment entry logged (proof that travels)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

import click

from gate.audit.chain import AuditRow
from gate.cli import fail, read_config
from gate.cli.audit import audit, database, log_source, one_database
from gate.cli.databases import database_options
from gate.errors import GateError

_COLUMNS = (
    "approval",
    "revision",
    "payload_hash",
    "decision",
    "operator",
    "credential",
    "type",
    "verified",
)


@audit.command("signatures")
@log_source("Read")
@database_options("Read")
@click.option("--approval", "approval_id", default=None, help="Only this approval's decisions.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per signed decision.")
def audit_signatures(
    config_path: str | None,
    export_file: str | None,
    db: str | None,
    password_env: str | None,
    approval_id: str | None,
    as_json: bool,
) -> None:
    """List every approver-signed decision in the log, each signature re-verified.

    A header line, then one line per signed decision, in aligned columns: approval,
    revision, payload_hash, decision, operator, credential, type, verified (yes, or no:
    why); --json for one object per line. The key is the one
    the credential's approver_credential_enrolled entry logged, so an export alone is
    enough. This does not check the chain itself: run `audit verify` on the same file
    first (with --public-key or --key-env), so the entries read here are the gate's.
    Exit 0 when every listed signature verifies, 1 when one does not or when --approval
    names an approval without a signed decision in this log, 2 usage.

    Example: hitl-gate audit signatures --file audit.jsonl --approval 01J...
    """
    from gate.audit import signature_checks
    from gate.audit.inputs import read_export
    from gate.audit.verify import read_database

    one_database(config_path, db, password_env, export_file)
    source = database(read_config(config_path) if config_path else None, db, password_env)
    try:
        rows: Iterable[AuditRow]
        if source is None:
            rows = read_export(Path(str(export_file)))
        else:
            rows = read_database(source)
        report = signature_checks.check(rows)
    except GateError as exc:
        fail(exc.message, 2)
    listed = [s for s in report.signed if approval_id is None or s.approval_id == approval_id]
    table: list[tuple[str, ...]] = [_COLUMNS]
    for item in listed:
        verified = "yes" if item.problem is None else f"no: {item.problem}"
        values = (
            item.approval_id,
            item.revision,
            item.payload_hash,
            item.decision,
            item.operator_id,
            item.credential_id,
            item.type,
            verified,
        )
        if as_json:
            obj = dict(zip(_COLUMNS, values, strict=True))
            obj["verified"] = item.problem is None
            obj["seq"] = item.seq
            if item.problem is not None:
                obj["problem"] = item.problem
            click.echo(json.dumps(obj, ensure_ascii=False))
        else:
            table.append(tuple("-" if v is None else str(v) for v in values))
    if len(table) > 1:
        for line in aligned(table):
            click.echo(line)
    if not listed and approval_id is not None:  # asked about one approval: not proven here
        click.echo(f"no signed decision for approval {approval_id} in this log", err=True)
        sys.exit(1)
    if not listed:
        click.echo("no signed decisions", err=True)
    sys.exit(1 if any(item.problem is not None for item in listed) else 0)


def aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """``rows`` (the first a header) as lines whose columns line up: each cell padded to its
    column's widest, two spaces between columns, no trailing spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
