"""The reference relay's terminal: shows a draft, then reads the answer typed after it.

On a terminal, what was typed before the draft and its prompt were on screen is discarded
(``tcflush(TCIFLUSH)``), and stdin is read only while a prompt waits. Any other stdin (a
pipe, a file) is a script: its lines answer the prompts in order, whenever they were
written. A prompt can be withdrawn while it waits (it went stale).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import select
import sys
import termios
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TextIO

from gate.protocol.followup import skip_reason_required
from gate.protocol.whitespace import is_blank
from gate.tools.reference_relay.view import Choices, question, reason_question, render

log = logging.getLogger(__name__)

MAX_HELD_LOGS = 1000
# a script's bytes read at once when armed; the reader thread reads the rest
READY_LIMIT = 1 << 20


class Withdrawn(Exception):
    """The prompt went stale while it waited; ``str(exc)`` tells the human why."""


class NoScreen(Exception):
    """Stdin is a terminal, but that terminal cannot be written: nobody would see what they
    answer (relay review item B). ``str(exc)`` is one line for the CLI."""


def screen_of(fd: int) -> TextIO:
    """Where drafts and prompts go when stdin (``fd``) is a terminal: stdout when it is that
    same terminal (so ``| tee`` and ``> file`` never get them twice or alone), else the
    terminal device of stdin (``os.ttyname``), opened for writing without becoming the
    controlling terminal (``O_NOCTTY``). Raises NoScreen when it cannot be opened."""
    stdout = sys.stdout
    with contextlib.suppress(AttributeError, ValueError, OSError):
        if os.isatty(stdout.fileno()) and os.path.samestat(os.fstat(stdout.fileno()), os.fstat(fd)):
            return stdout
    try:
        name = os.ttyname(fd)
        out = os.open(name, os.O_WRONLY | os.O_NOCTTY)
    except OSError as exc:
        raise NoScreen(
            f"stdin is a terminal that cannot be written ({exc.strerror}): nobody would see "
            "the drafts; use --auto, or pipe the answers into stdin"
        ) from None
    return open(out, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by close()


class _Lines:
    """Lines of input handed out one at a time on the event loop; end of input is kept."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.buffer: deque[str | None] = deque()  # None: end of input
        self.waiter: asyncio.Future[None] | None = None

    def push(self, line: str | None) -> None:
        """Add a line (None: end of input); runs on the loop."""
        self.buffer.append(line)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def next(self, stale: asyncio.Future[str]) -> str:
        """The next line; raises Withdrawn once ``stale`` is done (the line, if any, stays
        for the next prompt) and EOFError at the end of input."""
        while True:
            if stale.done():
                raise Withdrawn(stale.result())
            if self.buffer:
                break
            self.waiter = self.loop.create_future()
            either: set[asyncio.Future[Any]] = {self.waiter, stale}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        line = self.buffer[0]
        if line is None:
            raise EOFError("end of input")
        self.buffer.popleft()
        return line

    def ended(self) -> bool:
        """True when input ended and no line is left to read: nobody can answer here."""
        return bool(self.buffer) and self.buffer[0] is None

    def arm(self) -> None:
        """Called when the draft is on screen, right before the first prompt line."""

    def disarm(self) -> None:
        """Called when the prompt is answered or withdrawn."""


class TtyLines(_Lines):
    """A terminal: read only while a prompt waits; type-ahead is flushed when armed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        super().__init__(loop)
        self.fd = fd
        self.partial = ""
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.reading = False

    def arm(self) -> None:
        """Discard everything typed so far (kernel queue and our own), then read."""
        try:
            termios.tcflush(self.fd, termios.TCIFLUSH)
        except termios.error as exc:  # not our terminal any more (hung up)
            log.warning("event=tty_flush_failed error=%r", str(exc))
        self.buffer = deque(line for line in self.buffer if line is None)
        self.partial = ""
        self.decoder.reset()
        if not self.reading:
            self.loop.add_reader(self.fd, self._readable)
            self.reading = True

    def disarm(self) -> None:
        """Stop reading: what is typed now waits in the terminal until the next ``arm``."""
        if self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, 4096)
        except OSError:
            data = b""
        if not data:
            self.disarm()
            self.push(None)
            return
        self.partial += self.decoder.decode(data)
        *lines, self.partial = self.partial.split("\n")
        for line in lines:
            self.push(line.removesuffix("\r"))  # a terminal that does not map CR to NL


class ScriptLines(_Lines):
    """Stdin that is no terminal: read line by line, in order, from the start
    (``Terminal.open``) or else the first prompt on; nothing is discarded.

    What stdin already holds when it is armed is read at once, before the event loop runs
    again (``select`` with no wait): a stdin already at its end (``< /dev/null``, a closed
    pipe, a file) is known before the first dispatch is acked, whatever the machine's load.
    The rest is read by a thread, only when the end has not come yet.

    Both read the file descriptor ``fd`` with ``os.read`` (chunks of at most 64 KiB),
    never through ``sys.stdin.buffer``: a daemon thread waiting inside the buffered reader
    holds its lock, and the interpreter's shutdown then aborts the process (exit -6)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int | None) -> None:
        super().__init__(loop)
        self.fd = fd
        self.thread: threading.Thread | None = None
        self.partial = b""  # a line read in part (its newline not read yet)
        self.armed = False

    def arm(self) -> None:
        """Read what is ready; start the reader thread for the rest (once)."""
        if self.armed:
            return
        self.armed = True
        if self.fd is None:  # nothing to read (``--auto``): input has ended
            self.push(None)
            return
        if self._read_ready():
            return
        self.thread = threading.Thread(target=self._read, name="relay-stdin", daemon=True)
        self.thread.start()

    def _read_ready(self) -> bool:
        """Read, on the loop's thread, what ``fd`` holds now (at most ``READY_LIMIT``
        bytes); True when that reached its end (pushed), False when the thread reads on."""
        assert self.fd is not None
        read = 0
        try:
            while read < READY_LIMIT and select.select([self.fd], [], [], 0)[0]:
                data = os.read(self.fd, 65536)
                if not data:
                    self._end(self.push)
                    return True
                read += len(data)
                self._lines(data, self.push)
        except (OSError, ValueError):  # stdin closed or unselectable: the thread decides
            pass
        return False

    def _lines(self, data: bytes, push: Callable[[str | None], object]) -> None:
        *lines, self.partial = (self.partial + data).split(b"\n")
        for raw in lines:
            push(raw.decode("utf-8", "replace"))

    def _end(self, push: Callable[[str | None], object]) -> None:
        if self.partial:  # a last line without its newline
            push(self.partial.decode("utf-8", "replace"))
        push(None)

    def _read(self) -> None:
        def push(line: str | None) -> None:
            self.loop.call_soon_threadsafe(self.push, line)

        with contextlib.suppress(RuntimeError):  # the loop closed: the relay is stopping
            try:
                while self.fd is not None and (data := os.read(self.fd, 65536)):
                    self._lines(data, push)
            except OSError:  # stdin closed under us: as its end
                pass
            self._end(push)


class LogHold(logging.Filter):
    """Holds the records of the stderr handler while a draft or prompt is on the terminal
    and lets them out after it (at most ``MAX_HELD_LOGS``; how many were dropped is said)."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler
        self.holding = False
        self.held: deque[logging.LogRecord] = deque(maxlen=MAX_HELD_LOGS)
        self.dropped = 0
        self.lock = threading.Lock()

    @classmethod
    def install(cls) -> LogHold | None:
        """Hold the root logger's stderr handler when stderr is a terminal; else None."""
        if not sys.stderr.isatty():
            return None
        for handler in logging.getLogger().handlers:
            if getattr(handler, "stream", None) is sys.stderr:
                hold = cls(handler)
                handler.addFilter(hold)
                return hold
        return None

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep ``record`` for later while holding; pass it otherwise."""
        with self.lock:
            if not self.holding:
                return True
            if len(self.held) == self.held.maxlen:
                self.dropped += 1
            self.held.append(record)
            return False

    def hold(self, on: bool) -> None:
        """Start holding, or stop and emit what was held."""
        with self.lock:
            self.holding = on
            if on:
                return
            held, dropped = list(self.held), self.dropped
            self.held.clear()
            self.dropped = 0
        for record in held:
            self.handler.handle(record)
        if dropped:
            log.warning("event=logs_dropped count=%d (while a prompt was on screen)", dropped)


class Terminal:
    """Where the relay asks: drafts and prompts on ``out``, answers from ``lines``.

    ``interactive`` is True for a terminal (type-ahead discarded), False for a script.
    """

    def __init__(self, lines: _Lines, out: TextIO, hold: LogHold | None = None) -> None:
        self.lines = lines
        self.out = out
        self.hold = hold

    @classmethod
    def open(cls, loop: asyncio.AbstractEventLoop, hold: LogHold | None = None) -> Terminal:
        """The process's stdin, and where to show what it answers: the terminal stdin is
        (``screen_of``, whatever stdout is), else stdout. Raises NoScreen when stdin is a
        terminal that cannot be written."""
        stdin = sys.stdin
        fd: int | None = None
        with contextlib.suppress(AttributeError, ValueError, OSError):
            fd = stdin.fileno()
        if fd is not None and os.isatty(fd):
            return cls(TtyLines(loop, fd), screen_of(fd), hold)
        lines = ScriptLines(loop, fd)
        lines.arm()  # read ahead: a script's lines wait in order, its end is known early
        return cls(lines, sys.stdout, hold)

    @classmethod
    def for_auto(cls, loop: asyncio.AbstractEventLoop) -> Terminal:
        """With ``--auto`` nobody is asked: stdin is never read, lines go to stdout."""
        return cls(ScriptLines(loop, None), sys.stdout)

    def close(self) -> None:
        """Close the terminal device opened for writing (never stdout itself)."""
        if self.out is not sys.stdout:
            with contextlib.suppress(OSError):
                self.out.close()

    @property
    def interactive(self) -> bool:
        """True when stdin is a terminal."""
        return isinstance(self.lines, TtyLines)

    def width(self) -> int | None:
        """The columns of the terminal written to, or None (not a terminal, or no size)."""
        try:
            columns = os.get_terminal_size(self.out.fileno()).columns
        except (AttributeError, ValueError, OSError):
            return None
        return columns if columns > 0 else None

    def say(self, text: str, end: str = "\n") -> None:
        """Write ``text`` (one or more lines) to the terminal."""
        self.out.write(text + end)
        self.out.flush()

    async def _reason(self, required: bool, stale: asyncio.Future[str]) -> str | None:
        """One line: a skip's reason, or None for an empty (only whitespace) one, asked
        again while ``required``. Raises Withdrawn and EOFError as ``ask`` does."""
        while True:
            self.say(reason_question(required), end="")
            line = await self.lines.next(stale)
            if not is_blank(line):
                return line
            if not required:
                return None
            self.say("This step needs a reason for a skip.")

    async def ask(
        self, envelope: dict[str, Any], identity: str, stale: asyncio.Future[str]
    ) -> tuple[str, str | None]:
        """Show the draft to ``identity`` and return ``(verb, text)``: an adjust's new text, a
        skip's reason (asked on one line; required when the dispatch's skip action says so,
        else an empty line is none; a script is asked only for a required one, so
        scripts written before reasons existed answer as before), None for an approve.

        Only input given after the whole draft was written counts (a terminal's earlier
        input is flushed); a risk outside ``low``/``normal`` takes whole words only
        (``Choices``). Raises Withdrawn when ``stale`` is set while waiting (a line saying why
        is shown) and EOFError at the end of input (the prompt's line ended first). Log
        records wait until it returns.
        """
        choices = Choices.for_risk(envelope.get("risk"))
        async with self.prompting(render(envelope, identity, self.width())):
            while True:
                self.say(question(envelope, choices), end="")
                verb = choices.parse(await self.lines.next(stale))
                if verb is None:
                    self.say(choices.hint)
                    continue
                if verb == "skip":
                    required = skip_reason_required(envelope)
                    if not (self.interactive or required):
                        return verb, None  # a script's next line answers the next prompt
                    return verb, await self._reason(required, stale)
                if verb != "adjust":
                    return verb, None
                self.say("Type the new text; end with a line holding only '.'")
                lines: list[str] = []
                while (line := await self.lines.next(stale)) != ".":
                    lines.append(line)
                return "adjust", "\n".join(lines) + "\n"

    @contextlib.asynccontextmanager
    async def prompting(self, screen: str) -> AsyncIterator[None]:
        """Show ``screen`` (a draft, a question) and read only what is typed after it, until
        the block ends; log records wait until then. A Withdrawn is said on a line of its
        own, an EOFError ends the prompt's line (what follows starts a line of its own);
        both propagate."""
        if self.hold is not None:
            self.hold.hold(True)
        try:
            # written from a thread: a terminal paused with Ctrl-S must not stop the loop
            await asyncio.to_thread(self.say, screen, "")
            self.lines.arm()
            yield
        except Withdrawn as exc:
            self.say(f"\n{exc}")
            raise
        except EOFError:
            self.say("")
            raise
        finally:
            self.lines.disarm()
            if self.hold is not None:
                self.hold.hold(False)
