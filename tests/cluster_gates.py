"""Several real gates on one PostgreSQL database for the fail-over tests and the cluster soak:
``Gates`` starts N ``hitl-gate serve`` processes, each on ports of its own that stay the
same across restarts (so a balancer's upstreams stay right), optionally behind two throwaway
haproxys (tests/balancer.py): one in front of the pipeline APIs, one in front of the
decision listeners (its health checks on each gate's API). ``kill9(i)`` and ``restart(i)``
replace one gate; ``logs()`` is what every process of every slot wrote, the dead ones'
included (for ``event=audit_head`` anchors and for what must never be logged).
"""

from __future__ import annotations

import os
import re
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.balancer import Balancer, haproxy
from tests.pg_server import PgServer, free_port, running_server
from tests.support import GateProcess, gate_env, write_config

DB_PASSWORD = "db-password-never-logged-0b7e4c21"
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
HEAD = re.compile(r"event=audit_head seq=(\d+) hash=([0-9a-f]{64})")


def server_and_balancer() -> Iterator[PgServer]:
    """A module's ``server`` fixture for gates behind the balancer (``yield from``): a
    started throwaway PostgreSQL (``running_server``); skips where haproxy or PostgreSQL is
    missing, and fails instead under HITL_CI=1 (``.ci/run`` installs both)."""
    if haproxy() is None:
        if os.environ.get("HITL_CI"):
            pytest.fail("no haproxy here (.ci/run installs it)")
        pytest.skip("no haproxy here (apt-get install haproxy)")
    yield from running_server()


def faketime_lib() -> Path | None:
    """Debian's libfaketime (package ``faketime``), or None when it is not installed."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    return found[0] if found else None


def skewed_env(offset_s: int) -> dict[str, str]:
    """What a gate process's environment adds to run ``offset_s`` seconds off the real clock
    (libfaketime; its monotonic clock left alone, so sleeps and timeouts stay true)."""
    lib = faketime_lib()
    assert lib is not None, "libfaketime is not installed (apt-get install faketime)"
    return {
        "LD_PRELOAD": str(lib),
        "FAKETIME": f"{offset_s:+d}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def cluster_config(directory: Path, relay_url: str, url: str, **config: Any) -> Path:
    """A test config (``write_config`` with ``config``) on the PostgreSQL database ``url``
    (its password in ``HITL_DB_PASSWORD``: the test server trusts loopback)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = write_config(directory, relay_url, **config)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["storage"] = {"url": url, "password_env": "HITL_DB_PASSWORD"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def hostport(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    return parts.hostname, parts.port


class Gates:
    """N gate processes on the database ``url`` (see the module docstring).

    ``config`` goes to ``write_config`` for every gate (steps, security, ...); ``envs`` adds
    to one gate's environment by its index (e.g. ``skewed_env``); ``urls`` gives one gate
    another way to the same database by its index (e.g. a ``tests.pg_proxy.CutProxy``)."""

    def __init__(
        self,
        root: Path,
        relay_url: str,
        url: str,
        n: int = 3,
        envs: dict[int, dict[str, str]] | None = None,
        urls: dict[int, str] | None = None,
        **config: Any,
    ) -> None:
        self.url = url
        self.configs: list[Path] = []
        self.envs: list[dict[str, str]] = []
        for index in range(n):
            api_port, callback_port = free_port(), free_port()
            path = cluster_config(
                root / f"g{index}",
                relay_url,
                (urls or {}).get(index, url),
                api={"listen": f"127.0.0.1:{api_port}"},
                relay={"callback_addr": f"127.0.0.1:{callback_port}"},
                **config,
            )
            self.configs.append(path)
            extra = (envs or {}).get(index, {})
            self.envs.append(gate_env(HITL_DB_PASSWORD=DB_PASSWORD, **extra))
        self.procs: list[GateProcess | None] = [None] * n
        self.dead: list[GateProcess] = []  # killed or stopped ones, for their logs
        self.api_lb: Balancer | None = None
        self.decisions_lb: Balancer | None = None

    def start(self, balanced: bool = False) -> Gates:
        """Start every gate at once (each from its own thread: they migrate an empty database
        together), then the balancers when ``balanced``; returns when all listen."""
        errors: list[BaseException] = []

        def one(index: int) -> None:
            try:
                self.procs[index] = GateProcess(self.configs[index], env=self.envs[index]).start()
            except BaseException as exc:  # re-raised below, after every thread ended
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(self.configs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        if errors:
            raise errors[0]
        if balanced:
            self.api_lb = Balancer([hostport(g.api_url) for g in self.live()]).start()
            self.decisions_lb = Balancer(
                [(*hostport(g.callback_url), hostport(g.api_url)[1]) for g in self.live()]
            ).start()
            self.api_lb.wait_all_up()
            self.decisions_lb.wait_all_up()
        return self

    def __getitem__(self, index: int) -> GateProcess:
        gate = self.procs[index]
        assert gate is not None, f"gate {index} is not running"
        return gate

    def __len__(self) -> int:
        return len(self.procs)

    def live(self) -> list[GateProcess]:
        """The gates running now."""
        return [g for g in self.procs if g is not None]

    @property
    def api_url(self) -> str:
        """The pipeline API through the balancer."""
        assert self.api_lb is not None
        return self.api_lb.url()

    @property
    def decisions_url(self) -> str:
        """The decision callback through the balancer."""
        assert self.decisions_lb is not None
        return self.decisions_lb.url() + "/hitl/v0/decisions"

    def kill9(self, index: int) -> None:
        """``kill -9`` gate ``index`` (daemon, then its writer exits) and reap it."""
        gate = self[index]
        gate.kill9()
        self.dead.append(gate)
        self.procs[index] = None

    def restart(self, index: int) -> GateProcess:
        """Start gate ``index`` again on its config and ports."""
        assert self.procs[index] is None, f"gate {index} is still running"
        gate = GateProcess(self.configs[index], env=self.envs[index]).start()
        self.procs[index] = gate
        return gate

    def stop(self) -> list[int]:
        """Stop every running gate (SIGTERM); their exit codes."""
        codes = []
        for index, gate in enumerate(self.procs):
            if gate is not None and gate.proc is not None:
                codes.append(gate.stop())
                self.dead.append(gate)
                self.procs[index] = None
        return codes

    def remove(self) -> None:
        """Stop the balancers and every gate still running (kill -9 when a clean stop does
        not come); nothing is left running."""
        for lb in (self.api_lb, self.decisions_lb):
            if lb is not None:
                lb.remove()
        for index, gate in enumerate(self.procs):
            if gate is not None and gate.proc is not None and gate.proc.poll() is None:
                try:
                    gate.stop()
                except Exception:  # a hung stop: end it hard
                    gate.kill9()
                self.dead.append(gate)
                self.procs[index] = None

    def logs(self) -> list[str]:
        """What every gate process wrote (the dead ones first, then the running ones)."""
        return [g.log() for g in self.dead] + [g.log() for g in self.live()]

    def heads(self) -> list[tuple[int, str]]:
        """Every chain head any gate logged (``event=audit_head``), distinct, by seq."""
        found = {(int(m[1]), m[2]) for text in self.logs() for m in HEAD.finditer(text)}
        return sorted(found)
