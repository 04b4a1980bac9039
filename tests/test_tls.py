"""Dispatch to an https relay: certificates are always verified; ``relay.ca_file`` trusts a
private CA (instead of the system's CAs).

A throw-away CA and server certificates are made with the ``openssl`` command for each test
session; the relay is the capturing relay of tests/support.py served over TLS on loopback.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.support import (
    DEADLINE_S,
    ROOT,
    CaptureRelay,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    wait_until,
    write_config,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
]

APPROVED = {"status": "recorded", "resolved": True, "outcome": "approved"}


def openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def make_ca(directory: Path, name: str) -> None:
    """``<name>.key`` and a self-signed CA certificate ``<name>.pem``."""
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-addext",
        "subjectKeyIdentifier=hash",
        cwd=directory,
    )


def make_server_cert(directory: Path, ca: str, name: str, san: str) -> None:
    """``<name>.key`` and ``<name>.pem`` for ``san`` (e.g. ``IP:127.0.0.1``), signed by ``ca``."""
    openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=directory,
    )
    (directory / f"{name}.ext").write_text(
        f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n",
        encoding="ascii",
    )
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        cwd=directory,
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private CA ``ca`` with certificates ``ip`` (IP:127.0.0.1) and ``dns`` (DNS:localhost
    only), plus an unrelated CA ``other``."""
    directory = tmp_path_factory.mktemp("pki")
    make_ca(directory, "ca")
    make_ca(directory, "other")
    make_server_cert(directory, "ca", "ip", "IP:127.0.0.1")
    make_server_cert(directory, "ca", "dns", "DNS:localhost")
    return directory


class TlsRelay(CaptureRelay):
    """The capturing relay over https with the given certificate and key."""

    def __init__(self, cert: Path, key: Path) -> None:
        super().__init__()
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.context)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"https://127.0.0.1:{port}/relay"
        self._started.set()


@pytest.fixture
def tls_relay(pki: Path) -> Iterator[TlsRelay]:
    relay = TlsRelay(pki / "ip.pem", pki / "ip.key").start()
    yield relay
    relay.stop()


def start_gate(directory: Path, relay_url: str, **relay: str) -> GateProcess:
    directory.mkdir(exist_ok=True)
    return GateProcess(write_config(directory, relay_url, relay=relay)).start()


def not_acked_for_tls(proc: GateProcess, relay: CaptureRelay, expected: str) -> None:
    """An approval whose dispatch fails the TLS check: retried, never acked, nothing reached
    the relay's HTTP layer, and last_error names the verification failure."""
    api = proc.api()
    approval_id = api.create("q1")["approval_id"]
    wait_until(
        lambda: api.get(approval_id)["dispatch"]["attempts"] >= 2, DEADLINE_S, "two failed attempts"
    )
    dispatch = api.get(approval_id)["dispatch"]
    assert dispatch["delivered_at"] is None
    assert expected in dispatch["last_error"], dispatch["last_error"]
    assert relay.received == []


def test_https_relay_with_a_private_ca_is_refused_without_ca_file(tmp_path, tls_relay):
    proc = start_gate(tmp_path / "g", tls_relay.url)
    try:
        not_acked_for_tls(proc, tls_relay, "certificate verify failed")
        assert proc.stop() == 0
        assert "Traceback" not in proc.log()
    finally:
        if proc.proc and proc.proc.poll() is None:
            proc.stop()


def test_https_relay_with_ca_file_is_acked_and_decisions_flow(tmp_path, pki, tls_relay):
    directory = tmp_path / "g"
    directory.mkdir()
    shutil.copy(pki / "ca.pem", directory / "private-ca.pem")
    proc = start_gate(directory, tls_relay.url, ca_file="private-ca.pem")  # relative: config dir
    try:
        api = proc.api()
        approval_id = api.create("q1")["approval_id"]
        dispatch = tls_relay.wait_dispatch(approval_id)
        wait_until(lambda: api.get(approval_id)["dispatch"]["delivered_at"], DEADLINE_S, "ack")
        assert api.get(approval_id)["dispatch"]["attempts"] == 1
        status, answer, _ = post_decision(proc.callback_url, decision_body(dispatch))
        assert (status, answer) == (200, APPROVED)
        assert proc.stop() == 0
    finally:
        if proc.proc and proc.proc.poll() is None:
            proc.stop()


def test_ca_file_of_another_ca_is_refused(tmp_path, pki, tls_relay):
    proc = start_gate(tmp_path / "g", tls_relay.url, ca_file=str(pki / "other.pem"))
    try:
        not_acked_for_tls(proc, tls_relay, "certificate verify failed")
        assert proc.stop() == 0
    finally:
        if proc.proc and proc.proc.poll() is None:
            proc.stop()


def test_certificate_for_another_name_is_refused_even_with_ca_file(tmp_path, pki):
    """The relay's certificate is for DNS:localhost; the URL says 127.0.0.1."""
    relay = TlsRelay(pki / "dns.pem", pki / "dns.key").start()
    proc = start_gate(tmp_path / "g", relay.url, ca_file=str(pki / "ca.pem"))
    try:
        not_acked_for_tls(proc, relay, "certificate verify failed")
        assert proc.stop() == 0
    finally:
        if proc.proc and proc.proc.poll() is None:
            proc.stop()
        relay.stop()


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "relay.ca_file: cannot read CA bundle"),
        ("not a certificate\n", "is not a PEM bundle of CA certificates"),
    ],
)
def test_unusable_ca_file_is_a_config_error(tmp_path, content, expected):
    if content is not None:
        (tmp_path / "ca.pem").write_text(content, encoding="ascii")
    config = write_config(tmp_path, "https://relay.example.com/hook", relay={"ca_file": "ca.pem"})
    done = subprocess.run(
        [sys.executable, "-m", "gate", "check-config", "-c", str(config)],
        capture_output=True,
        text=True,
        env=gate_env(),
        cwd=ROOT,
        timeout=DEADLINE_S,
        check=False,
    )
    assert done.returncode == 2
    assert expected in done.stderr, done.stderr
    assert "relay.ca_file:" in done.stderr
