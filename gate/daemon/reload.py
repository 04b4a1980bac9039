"""SIGHUP: re-read the config file and its secrets; apply them to new work, or refuse."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Mapping
from operator import attrgetter
from typing import Any

from gate.config import Config, Secrets, load, raw_mapping
from gate.config.followups import ended_delegations
from gate.daemon.app import Gate, callback_url
from gate.daemon.sdnotify import Notifier
from gate.errors import ConfigError

log = logging.getLogger(__name__)

# What a reload cannot change in a running daemon: bound sockets, the open database, the
# relay HTTP session (its CA bundle), the runners' timeouts, the app's body limit, and the
# receipt keys (held by GateService; changing the HMAC key mid-log would also split the
# audit trail between two keys). Changing any of them needs a restart. Each is the dotted
# path of a setting: the attributes of a ``Config`` and the keys of its YAML.
RESTART_ONLY = (
    "relay.callback_addr",
    "api.listen",
    "storage.path",
    "storage.url",
    "storage.password_env",
    "relay.ca_file",
    "api.max_draft_bytes",
    "http",
    "receipts",
)


_RESTART_ERROR = "{}: cannot change while running (restart to apply it)"


def _raw_restart_changes(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    """``RESTART_ONLY`` settings whose YAML differs between two versions of the file (for a
    file that does not validate, so its typed values cannot be compared)."""
    if old is None or new is None:
        return []

    def at(data: Any, dotted: str) -> Any:
        for key in dotted.split("."):
            data = data.get(key) if isinstance(data, dict) else None
        return data

    return [_RESTART_ERROR.format(path) for path in RESTART_ONLY if at(old, path) != at(new, path)]


class Reloader:
    """SIGHUP: re-read the config file and its secrets; apply them to new work, or refuse.

    Applied on success (all at once, between two requests): operators, pipelines, steps,
    budgets and limits (``service.config``), the rate limit, the relay secrets accepted on
    decisions and the skew window, the API token, and the relay URL, signing secret,
    timeout and public callback URL of future dispatches. A pending approval keeps the
    scope and quorum frozen at its creation. Refused, with every error logged as
    ``event=reload_error`` then one ``event=reload_refused`` and the running config kept:
    anything ``check-config`` or a start would refuse (including missing secrets), and a
    change of a ``RESTART_ONLY`` setting or of the receipt key. systemd sees
    ``RELOADING=1`` then ``READY=1`` either way.

    ``gate`` is the running gate (``build_gate``); ``environ`` holds the secrets read again;
    ``callback_bound`` is the callback listener's bound ``host:port``; ``serving`` the
    systemd status line to restore after a reload.
    """

    def __init__(
        self,
        gate: Gate,
        environ: Mapping[str, str],
        callback_bound: str,
        notifier: Notifier,
        serving: str,
    ) -> None:
        self.gate = gate
        self.config = gate.config
        self.secrets = gate.secrets
        self.environ = environ
        self.callback_bound = callback_bound
        self.notifier = notifier
        self.serving = serving
        # the running config's file as plain YAML, to name restart-only changes even in a
        # new file that does not validate
        source = gate.config.source
        self._raw = raw_mapping(source) if source is not None else None
        self._checked_raw: dict[str, Any] | None = self._raw

    def check(self) -> tuple[Config, Secrets] | list[str]:
        """Load and validate the config file again; return it with its secrets, or errors."""
        source = self.config.source
        if source is None:
            return ["the running config was not read from a file; nothing to reload"]
        raw = raw_mapping(source)
        try:
            config, secrets = load(source, self.environ)
        except ConfigError as exc:
            return list(exc.errors) + _raw_restart_changes(self._raw, raw)
        errors = [
            _RESTART_ERROR.format(path)
            for path in RESTART_ONLY
            if attrgetter(path)(config) != attrgetter(path)(self.config)
        ]
        if not hmac.compare_digest(secrets.receipt_key, self.secrets.receipt_key):
            errors.append(
                f"receipts.key_env: the receipt key ({config.receipts.key_env})"
                " cannot change while running (restart to apply it)"
            )
        if not errors:
            self._checked_raw = raw  # becomes the running file's YAML once applied
        return errors or (config, secrets)

    async def reload(self) -> bool:
        """Apply the config file as it is now; True if applied, False if refused."""
        self.notifier.reloading()
        log.info("event=reloading config=%s", self.config.source)
        result = await asyncio.to_thread(self.check)
        if isinstance(result, list):
            # one event=reload_refused per refused reload; each error on its own line (A3)
            for error in result:
                log.error("event=reload_error error=%s", error)
            log.error("event=reload_refused errors=%d kept=running_config", len(result))
            self.notifier.ready(
                f"{self.serving} (last reload refused: {len(result)} "
                "errors, see the log; running config kept)"
            )
            return False
        config, secrets = result
        for warning in secrets.warnings:
            log.warning("event=weak_secret warning=%s", warning)
        for ended in ended_delegations(config.delegations, self.gate.service.clock.now_ms()):
            log.warning("event=delegation_ended warning=%s", ended)
        self.apply(config, secrets)
        steps = sum(len(p.steps) for p in config.pipelines)
        log.info(
            "event=reloaded pipelines=%d steps=%d operators=%d relay_secrets=%d",
            len(config.pipelines),
            steps,
            len(config.relay.operators),
            len(secrets.relay_secrets),
        )
        self.notifier.ready(f"{self.serving} (config reloaded)")
        return True

    def apply(self, config: Config, secrets: Secrets) -> None:
        """Hand the new settings to the gate's service, both apps' settings and the
        dispatcher (their ``reconfigure``); no await, so no request sees half of them."""
        gate = self.gate
        gate.service.reconfigure(config)
        gate.callback_settings.reconfigure(secrets.relay_secrets, config.relay.security.max_skew)
        gate.api_settings.reconfigure(secrets.api_token, secrets.admin_token)
        gate.dispatcher.reconfigure(
            config.relay.url,
            secrets.relay_secrets[0],
            config.relay.dispatch_timeout,
            callback_url(config, self.callback_bound),
        )
        self.config, self.secrets = config, secrets
        self._raw = self._checked_raw
