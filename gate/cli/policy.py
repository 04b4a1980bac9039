"""``hitl-gate policy test``: which of a step's policy rules would decide a
draft, evaluated offline from the config (``gate.core.approvals.policy``); nothing is
created, no gate is asked, no database read."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gate.cli import CONFIG_OPTION, fail, input_name, main, read_config, read_input
from gate.cli.common import spend_type

if TYPE_CHECKING:
    from gate.config import Config


@main.group("policy")
def policy_group() -> None:
    """Policy rules of approval steps: see which rule would decide a draft.

    Example: hitl-gate policy test -c config.yaml --pipeline p --step s --draft-file d.json
    """


@policy_group.command("test")
@CONFIG_OPTION
@click.option("--pipeline", required=True, help="The pipeline's name.")
@click.option("--step", required=True, help="The approval step's name.")
@click.option("--draft-file", required=True, help="The draft's body (UTF-8), - for stdin.")
@click.option("--content-type", default="text/plain", show_default=True, help="The draft's.")
@click.option("--spend", type=spend_type(), default=None, help="The request's spend (budget.unit).")
def policy_test(
    config_path: str,
    pipeline: str,
    step: str,
    draft_file: str,
    content_type: str,
    spend: float | None,
) -> None:
    """Show which rule of the step's policy would decide this draft, creating nothing.

    Prints "policy:<id> would approve" (or "would deny", with the reason), naming the
    rule's YAML path, or "no rule: a person decides"; then each rule, in order, with
    "matches" or why not: its first condition that failed and the values compared (e.g.
    "small-invoices: no match: spend 400 > max_spend 100"), and a deny that matched only
    because it could not check a condition says which; a step with remember_approval adds
    that a draft a person approved there within the window is approved (policy:remembered);
    with --spend and a budget cap, what the cap does (the gate leaves an approve to a person
    when the spend takes the day's spending over a cap).
    Exit 0; 2 for bad input (an unknown pipeline or step, a question step, a draft that is
    no UTF-8, a negative spend), one line.

    Example: hitl-gate policy test -c config.yaml --pipeline agent-tools --step send-invoice
    --draft-file invoice.json --content-type application/json --spend 40
    """
    from gate.core.approvals.policy import Facts, judge_rules, verdict
    from gate.protocol.canonical import payload_hash
    from gate.protocol.display import hanging_indent, marked

    config = read_config(config_path)
    found = config.find_step(pipeline, step)
    if found is None:
        known = any(p.name == pipeline for p in config.pipelines)
        what = f"step {step!r} is not configured in {pipeline!r}" if known else (
            f"pipeline {pipeline!r} is not configured"
        )  # fmt: skip
        fail(f"{config_path}: {what}", 2)
    step_cfg = found[1]
    if step_cfg.is_question:
        fail(f"--step: {step!r} is a question step: policy decides approval steps only", 2)
    raw = read_input("--draft-file", draft_file)
    try:
        body = raw.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"--draft-file: {input_name(draft_file)} is not UTF-8 text", 2)
    at = _where(config, pipeline, step)
    results = judge_rules(
        step_cfg.policy, Facts(content_type, body, spend), step_cfg.risk, step_cfg.quorum
    )
    decided = verdict(results)
    click.echo(f"payload_hash {payload_hash(body)}")
    if decided is None:
        click.echo("no rule: a person decides")
    else:
        index = next(k for k, r in enumerate(step_cfg.policy) if r.id == decided.rule_id)
        line = f"{decided.by} would {decided.decide} ({at}.policy[{index}])"
        if decided.reason is not None:
            line += f"; reason: {hanging_indent(marked(decided.reason))}"
        click.echo(line)
    for result in results:
        click.echo(f"  {result.explain()}")
    if (decided is None or decided.decide == "approve") and spend is not None:
        for line in _cap_lines(config, pipeline, spend):
            click.echo(line)
    if decided is None and step_cfg.remember_approval is not None:
        from gate.config.followups import format_duration

        click.echo(
            "unless a person approved this same draft on this step within "
            f"{format_duration(step_cfg.remember_approval)}: then policy:remembered approves it"
        )


def _cap_lines(config: Config, pipeline: str, spend: float) -> list[str]:
    """What the budget caps do to an approve of ``spend`` (review L2): the gate drops an
    approve whose spend takes the day's spending over ``budget.cap_today`` or the pipeline's
    ``budget_cap`` at creation; offline only a spend over a cap on its own is certain."""
    found = next(p for p in config.pipelines if p.name == pipeline)
    caps = [
        (name, cap)
        for name, cap in (
            ("budget.cap_today", config.budget.cap_today),
            ("the pipeline's budget_cap", found.budget_cap),
        )
        if cap is not None
    ]
    over = [(name, cap) for name, cap in caps if spend > cap]
    if over:
        return [
            f"but spend {spend:g} is over {name} {cap:g}: the gate leaves it to a person"
            for name, cap in over
        ]
    return [
        f"unless the day's spending with spend {spend:g} passes {name} {cap:g} at creation:"
        " then a person decides"
        for name, cap in caps
    ]


def _where(config: Config, pipeline: str, step: str) -> str:
    """The YAML path of ``pipeline``/``step``: ``pipelines[i].steps[j]``."""
    for i, pipe in enumerate(config.pipelines):
        for j, candidate in enumerate(pipe.steps):
            if pipe.name == pipeline and candidate.name == step:
                return f"pipelines[{i}].steps[{j}]"
    return "?"
