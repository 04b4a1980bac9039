"""The ``webauthn`` config section (passkeys): ``resolve_webauthn``'s defaults,
check-config's one-line errors with their YAML path, and doctor's passkeys line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.config import load_config
from gate.config.webauthn import WebAuthnSettings, resolve_webauthn
from gate.errors import ConfigError
from gate.tools.doctor_passkeys import passkeys_summary
from tests.support import write_config


def config_with(tmp_path: Path, relay: dict[str, Any] | None = None, **top: Any) -> Any:
    path = write_config(tmp_path, "http://127.0.0.1:9/relay", relay=relay)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data.update(top)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_config(path)


def test_resolve_webauthn_defaults_from_public_url(tmp_path: Path) -> None:
    config = config_with(tmp_path, {"public_url": "https://gate.example.com/hitl/"})
    assert resolve_webauthn(config, "0.0.0.0:8443") == WebAuthnSettings(
        "gate.example.com", "hitl-gate", ("https://gate.example.com",)
    )


def test_resolve_webauthn_loopback_without_public_url_is_localhost(tmp_path: Path) -> None:
    config = config_with(tmp_path)
    assert resolve_webauthn(config, "127.0.0.1:40123") == WebAuthnSettings(
        "localhost", "hitl-gate", ("http://localhost:40123",)
    )
    assert resolve_webauthn(config, None) is None


def test_resolve_webauthn_never_uses_an_ip_as_rp_id(tmp_path: Path) -> None:
    config = config_with(tmp_path, {"public_url": "https://10.0.0.5:8443"})
    assert resolve_webauthn(config, "10.0.0.5:8443") is None


def test_resolve_webauthn_configured_section_wins(tmp_path: Path) -> None:
    section = {
        "rp_id": "example.com",
        "rp_name": "Acme approvals",
        "origins": ["https://gate.example.com", "https://inbox.example.com"],
    }
    config = config_with(tmp_path, {"public_url": "https://gate.example.com"}, webauthn=section)
    assert resolve_webauthn(config, None) == WebAuthnSettings(
        "example.com", "Acme approvals", ("https://gate.example.com", "https://inbox.example.com")
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"rp_id": "10.1.2.3"}, "webauthn.rp_id: '10.1.2.3' is an IP address"),
        ({"rp_id": "Gate_Example"}, "webauthn.rp_id: 'Gate_Example' is not a lowercase domain"),
        (
            {"rp_id": "example.com", "origins": ["ftp://example.com"]},
            "webauthn.origins[0]: 'ftp://example.com' is not an http(s) origin",
        ),
        (
            {"rp_id": "example.com", "origins": ["http://gate.example.com"]},
            "webauthn.origins[0]: 'http://gate.example.com' uses http on a host other than",
        ),
        (
            {"rp_id": "example.com", "origins": ["https://example.com", "https://evil.com"]},
            "webauthn.origins[1]: host 'evil.com' is neither 'example.com' nor a subdomain",
        ),
        (
            {"rp_id": "example.com", "origins": ["https://example.com/path"]},
            "webauthn.origins[0]: 'https://example.com/path' is not an http(s) origin",
        ),
    ],
    ids=["ip-rp-id", "not-a-domain", "ftp", "http-not-localhost", "foreign-host", "path"],
)
def test_check_config_refuses_bad_webauthn(
    tmp_path: Path, section: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_with(tmp_path, webauthn=section)
    assert message in str(caught.value)


def test_doctor_passkeys_line_warns_when_a_step_requires_signatures(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        "http://127.0.0.1:9/relay",
        steps=[{"name": "s", "approvers": [101], "approver_signature": "required"}],
        relay={"callback_addr": "0.0.0.0:8080"},
    )
    config = load_config(path)
    level, detail = passkeys_summary(config, tmp_path / "absent.db")
    assert level == "WARN" and "passkeys unavailable" in detail and "p/s" in detail
    assert detail.endswith("0 passkeys enrolled")


def test_doctor_passkeys_line_names_the_relying_party(tmp_path: Path) -> None:
    config = config_with(tmp_path, {"public_url": "https://gate.example.com"})
    assert passkeys_summary(config, tmp_path / "absent.db") == (
        "",
        "rp_id gate.example.com, origins https://gate.example.com; 0 passkeys enrolled",
    )


def test_resolve_webauthn_http_public_url_only_on_localhost(tmp_path: Path) -> None:
    config = config_with(tmp_path, {"public_url": "http://gate.example.com/"})
    assert resolve_webauthn(config, "127.0.0.1:8089") is None  # browsers refuse it
    config = config_with(tmp_path, {"public_url": "http://localhost:8089/"})
    assert resolve_webauthn(config, "127.0.0.1:8089") == WebAuthnSettings(
        "localhost", "hitl-gate", ("http://localhost:8089",)
    )


def test_the_example_config_gives_passkeys_a_relying_party_on_one_machine() -> None:
    # the example's public_url was http://127.0.0.1:8089, an IP (never an
    # RP id), so invites printed a link where passkeys do not work
    example = Path(__file__).resolve().parent.parent / "config.example.yaml"
    config = load_config(example)
    assert resolve_webauthn(config, "127.0.0.1:8089") == WebAuthnSettings(
        "localhost", "hitl-gate", ("http://localhost:8089",)
    )
