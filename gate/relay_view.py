"""What the reference relay shows a human: a dispatch in words, and what they may type. Pure."""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from typing import Any

RULE = "=" * 72
SEPARATOR = "-" * 72
# risks (docs: ``risk`` of a step) at which one key answers; any other, ``high``, ``critical``
# or one this relay does not know, needs the whole word
ONE_KEY_RISKS = frozenset({"low", "normal"})
KEYS = {"a": "approve", "s": "skip", "e": "adjust"}
# gate answers after which nobody needs to decide the approval any more
FINAL = frozenset({"already_resolved", "expired", "unknown_approval"})
WORDS = {"approve": "approve", "skip": "skip", "edit": "adjust", "adjust": "adjust"}

# Unicode categories a terminal does not show as themselves: controls (C0, DEL, C1: carriage
# return, escape sequences), format characters (bidi overrides, zero-width), line and paragraph
# separators, surrogates and unassigned code points. Newline and tab are shown as they are.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})


def visible(text: str) -> tuple[str, int]:
    """Return ``(text, count)``: ``text`` with every character a terminal would not show as
    itself (a control, format, line/paragraph-separator, surrogate or unassigned code point;
    newline and tab excepted) replaced by a visible ``<U+XXXX>`` mark, and how many were.

    A draft of ``"pay 12000 to X\\r\\x1b[2Kpay 12 to Y"`` would otherwise show as its second
    half only (security review); the human must see what the payload hash covers.
    """
    out: list[str] = []
    count = 0
    for char in text:
        if char not in "\n\t" and unicodedata.category(char) in _HIDDEN_CATEGORIES:
            out.append(f"<U+{ord(char):04X}>")
            count += 1
        else:
            out.append(char)
    return "".join(out), count


def shown(value: object) -> str:
    """``str(value)`` as ``visible`` shows it (for one-line fields of an envelope)."""
    return visible(str(value))[0]


def draft_lines(body: str) -> tuple[list[str], list[str]]:
    """Return ``(warnings, lines)`` for a draft: what to say above it, and what to print
    between the separators. The body is shown through ``visible``."""
    text, hidden = visible(body)
    warnings = []
    if hidden:
        warnings.append(f"warning: the draft holds {hidden} control or invisible characters, "
                        "shown as <U+XXXX>; the draft approved is exactly as sent, with them")
    return warnings, [text]


def render(envelope: dict[str, Any], identity: str) -> str:
    """The whole block shown for one approver: header (approval, pipeline/step, risk,
    revision; quorum, expiry, who answers; budget), then the draft between two separators."""
    draft = envelope.get("draft") or {}
    quorum = envelope.get("quorum") or {}
    warnings, body = draft_lines(str(draft.get("body", "")))
    lines = [
        "",
        RULE,
        f"Approval {shown(envelope.get('approval_id'))}  {shown(envelope.get('pipeline'))}/"
        f"{shown(envelope.get('step'))}  risk {shown(envelope.get('risk'))}  revision "
        f"{shown(envelope.get('revision', 1))}",
        f"quorum {shown(quorum.get('collected'))}/{shown(quorum.get('required'))}  expires "
        f"{shown(envelope.get('expires_at'))}  you are {shown(identity)}",
        *([f"budget: {shown(json.dumps(envelope['budget'], ensure_ascii=False))}"]
          if envelope.get("budget") else []),
        *warnings,
        SEPARATOR,
        *body,
        SEPARATOR,
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Choices:
    """What an approver may type at a prompt: at risk ``low`` or ``normal`` one key (``a``,
    ``s``, ``e``) or the word; at any other risk only the whole word (``approve``, ``skip``,
    ``edit``/``adjust``), so no stray key approves a high-risk action (issue 12 item 1)."""

    risk: str
    whole_words: bool

    @classmethod
    def for_risk(cls, risk: object) -> Choices:
        """The choices at ``risk`` (a dispatch's ``risk`` field; unknown counts as high)."""
        text = shown(risk)
        return cls(text, text not in ONE_KEY_RISKS)

    @property
    def prompt(self) -> str:
        """The question, ending where the answer is typed."""
        if self.whole_words:
            return f"Risk {self.risk}: type the whole word approve, skip or edit: "
        return "[a]pprove, [s]kip or [e]dit (adjust)? "

    @property
    def hint(self) -> str:
        """The line shown after an answer that is not taken."""
        if self.whole_words:
            return f"Not taken: at risk {self.risk} type the whole word approve, skip or edit."
        return "Not taken: type a, s or e (or approve, skip, edit)."

    def parse(self, answer: str) -> str | None:
        """The verb (approve|skip|adjust) ``answer`` means, or None when it is not taken."""
        word = answer.strip().lower()
        if word in WORDS:
            return WORDS[word]
        return None if self.whole_words else KEYS.get(word)


def verdict(verb: str, status: int, answer: Any) -> str:
    """One line telling the human at the terminal what the gate did with their answer."""
    if status == 200 and isinstance(answer, dict):
        if answer.get("resolved"):
            return f"Recorded: the approval is resolved {shown(answer.get('outcome'))}."
        return "Recorded; the quorum is not complete yet."
    reason = answer.get("reason") if isinstance(answer, dict) else None
    outcome = answer.get("outcome") if isinstance(answer, dict) else None
    tail = (f"; the approval is resolved {shown(outcome)} without it." if outcome else
            "; the approval timed out without it." if reason == "expired" else
            "; the approval is resolved without it." if reason in FINAL else ".")
    return (f"The gate did not record your {verb}: {shown(reason or 'refused')} "
            f"(HTTP {status}){tail}")

