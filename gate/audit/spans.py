"""Receipt-key spans of the audit log: which HMAC receipt key each entry must verify with.

A gate started with ``receipts.previous_key_env`` on a log whose newest entry is receipted
with that previous key writes a ``receipt_key_rotated`` entry, receipted with the new key
(``GateService.settle_receipt_key``). The log is so cut into spans: entry 1 up to the first
rotation entry, each rotation entry up to the next. Every entry of a span is receipted with
one key, and a rotation always switches to a key that no earlier span used. ``Spans``
checks exactly that, entry by entry, with the keys a verifier holds (in any order): a key
retired by a rotation (which may have leaked since) cannot vouch for an entry after it,
neither as an ordinary entry nor as a forged rotation back to it. Pure: no I/O.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

ROTATED = "receipt_key_rotated"
RECEIPT_MISMATCH = "receipt does not match (changed, or a different receipt key)"
OLD_KEY = (
    "a receipt_key_rotated entry receipted with a receipt key an earlier span of this "
    "log used (a rotation is always to a new key: forged with a retired key?)"
)


def matches(key: bytes, entry_hash: str, receipt_hex: str) -> bool:
    """True when ``receipt_hex`` is HMAC-SHA256(``key``, ``entry_hash`` as ASCII), in hex
    (constant time; a receipt that is not ASCII never matches)."""
    return receipt_hex.isascii() and hmac.compare_digest(
        hmac.digest(key, entry_hash.encode("ascii"), "sha256").hex(), receipt_hex
    )


def no_match(count: int) -> str:
    """The start of every wrong-key reason, for ``count`` keys given."""
    return (
        "the key given does not match this log"
        if count == 1
        else "the keys given do not match this log"
    )


def first_mismatch(count: int) -> str:
    """Why entry 1's receipt verifies with no key given (a wrong key, not tampering)."""
    return (
        f"{no_match(count)}: entry 1's receipt does not verify with "
        f"{'it' if count == 1 else 'any of them'} (a wrong key is the likely cause: a "
        "typo, another gate's log, or a log whose receipt key was rotated, which needs "
        "every key it used; with the right key, entry 1's receipt was changed)"
    )


def rotation_mismatch(count: int, seq: int) -> str:
    """Why the rotation entry ``seq`` verifies with no key given that is new to the log."""
    return (
        f"{no_match(count)} from entry {seq} on: that entry starts a new receipt key "
        "(receipt_key_rotated) and verifies with no key given that the entries before it "
        "did not use; give the key the gate used from there (its receipts.key_env after "
        "the rotation)"
    )


def no_span(count: int) -> str:
    """Why no span at all verified (``Spans(leading_unknown=True)`` at the end of a log)."""
    return (
        f"{no_match(count)}: neither entry 1 nor any receipt_key_rotated entry verifies "
        f"with {'it' if count == 1 else 'any of them'}"
    )


class Spans:
    """The span state of one pass over consecutive entries (``gate.audit.chain.verify``, or one
    run of ``gate.audit.segments.verify_segment``).

    ``keys``: the HMAC receipt keys given, distinct, any order (empty: receipts are not
    checked). ``check`` is called once per entry, in ascending seq, after its hash verified.
    ``starts`` lists ``(first seq, key index)`` of every span begun here (at entry 1 or at a
    rotation entry); ``initial`` is the key index of the first entry checked (for a run that
    begins inside a span, the key ``stitch`` compares with the run before); ``current`` the
    key index of the span now open. With ``leading_unknown`` (``doctor``: the configured keys
    may not include those retired long ago), entries before the first span whose key was
    given are not receipt-checked; the entries from there on are, and at least one span
    must be found (``finish``).
    """

    __slots__ = ("keys", "leading_unknown", "current", "initial", "used", "starts")

    def __init__(self, keys: Sequence[bytes], *, leading_unknown: bool = False) -> None:
        self.keys = tuple(keys)
        self.leading_unknown = leading_unknown
        self.current: int | None = None
        self.initial: int | None = None
        self.used: set[int] = set()
        self.starts: list[tuple[int, int]] = []

    def check(
        self, seq: int, kind: str, entry_hash: str, receipt_hex: str
    ) -> tuple[str, bool] | None:
        """None when the entry's receipt verifies with the key of its span, else ``(reason,
        wrong_key)``: ``wrong_key`` when no key given can be the right one for the first
        entry of a span (entry 1, or a rotation), which is far likelier a wrong key than
        tampering; False for tampering (an entry not receipted with its span's key, or a
        rotation back to a key an earlier span used)."""
        if not self.keys:
            return None
        if self.current is not None:
            if kind != ROTATED:
                if matches(self.keys[self.current], entry_hash, receipt_hex):
                    return None
                return RECEIPT_MISMATCH, False
            return self._rotate(seq, entry_hash, receipt_hex)
        if self.leading_unknown and seq != 1 and kind != ROTATED:
            return None  # inside a span whose key was not given
        found = self._which(entry_hash, receipt_hex)
        if found is None:
            if self.leading_unknown:
                return None
            if seq == 1:
                return first_mismatch(len(self.keys)), True
            if kind == ROTATED:
                return rotation_mismatch(len(self.keys), seq), True
            return RECEIPT_MISMATCH, False  # a run's first entry: not its span's key either
        self.initial = found
        self.current = found
        if seq == 1 or kind == ROTATED:
            self._begin(seq, found)
        return None

    def finish(self, last_seq: int | None) -> tuple[int, str] | None:
        """After the last entry: ``(seq, reason)`` when ``leading_unknown`` found no span at
        all in a non-empty log (nothing was receipt-checked), else None."""
        if self.keys and self.leading_unknown and last_seq is not None and not self.starts:
            return last_seq, no_span(len(self.keys))
        return None

    def _rotate(self, seq: int, entry_hash: str, receipt_hex: str) -> tuple[str, bool] | None:
        found = self._which(entry_hash, receipt_hex)
        if found is None:
            return rotation_mismatch(len(self.keys), seq), True
        if found in self.used:
            return OLD_KEY, False
        self.current = found
        self._begin(seq, found)
        return None

    def _begin(self, seq: int, index: int) -> None:
        self.used.add(index)
        self.starts.append((seq, index))

    def _which(self, entry_hash: str, receipt_hex: str) -> int | None:
        return next(
            (index for index, key in enumerate(self.keys) if matches(key, entry_hash, receipt_hex)),
            None,
        )


def keys_for(
    spans: Sequence[tuple[int, int]], keys: Sequence[bytes], last_seq: int, seq: object
) -> tuple[bytes, ...] | None:
    """The keys a receipt for entry ``seq`` may be made with, given the ``spans`` (``(first
    seq, key index)``) of a verified log ending at ``last_seq``: the key of the span that
    holds it; after the end (a deleted tail), that of the last span or any key no span used
    (a rotation in the deleted part). None when it cannot be checked (no keys given, no
    span, or an entry before the first span found). A ``seq`` that is no positive integer
    gets every key (``gate.audit.receipts.check_receipt`` refuses it anyway)."""
    if not keys or not spans:
        return None
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        return tuple(keys)
    if seq > last_seq:
        used = {index for _, index in spans[:-1]}
        return tuple(key for index, key in enumerate(keys) if index not in used)
    holder = [index for first, index in spans if first <= seq]
    return (keys[holder[-1]],) if holder else None
