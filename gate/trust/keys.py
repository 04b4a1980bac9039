"""Ed25519 keys for signed audit entries and permits: generate, load, key id (SPEC §7)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gate.errors import ConfigError, GateError

KEY_ID_PREFIX = "ed25519:"
PRIVATE_KEY_NAME = "hitl-gate-ed25519.key"
PUBLIC_KEY_NAME = "hitl-gate-ed25519.pub"

PublicKeys = Mapping[str, Ed25519PublicKey]


class KeyFileError(GateError):
    """A key file is missing, unreadable, not an Ed25519 PEM key, or too widely readable."""

    def __init__(self, message: str) -> None:
        super().__init__("bad_key_file", message, status=500, kind="error")


def raw_public(key: Ed25519PublicKey) -> bytes:
    """Return the 32 raw bytes of an Ed25519 public key (RFC 8032 encoding)."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey) -> str:
    """Return ``"ed25519:" + first 16 lowercase hex digits of SHA-256(raw public key bytes)``."""
    return KEY_ID_PREFIX + hashlib.sha256(raw_public(key)).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Signer:
    """An Ed25519 private key with its key id; never shown by ``repr``."""

    private_key: Ed25519PrivateKey = field(repr=False)
    key_id: str

    @classmethod
    def from_private_key(cls, private_key: Ed25519PrivateKey) -> Signer:
        """Wrap ``private_key``, deriving the key id from its public half."""
        return cls(private_key, key_id(private_key.public_key()))

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The matching public key."""
        return self.private_key.public_key()

    def sign(self, message: bytes) -> bytes:
        """Return the 64-byte Ed25519 signature of ``message``."""
        return self.private_key.sign(message)


def verify_signature(key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    """Return True when ``signature`` is a valid Ed25519 signature of ``message`` by ``key``."""
    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


def trusted(keys: Iterable[Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
    """Return ``{key id: key}`` for ``keys`` (rotation: several keys may be trusted at once)."""
    return {key_id(k): k for k in keys}


def public_pem(key: Ed25519PublicKey) -> bytes:
    """Return the SubjectPublicKeyInfo PEM (``-----BEGIN PUBLIC KEY-----``) of ``key``."""
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def private_pem(key: Ed25519PrivateKey) -> bytes:
    """Return the unencrypted PKCS#8 PEM (``-----BEGIN PRIVATE KEY-----``) of ``key``."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def generate(out_dir: Path) -> tuple[Path, Path, str]:
    """Write a new key pair into ``out_dir`` (made 0700 if missing); return (private, public, id).

    The private key file ``hitl-gate-ed25519.key`` is created with mode 0600 (never
    overwritten); the public key ``hitl-gate-ed25519.pub`` with 0644. Raises KeyFileError
    when a file already exists or cannot be written.
    """
    out = Path(out_dir)
    private_path, public_path = out / PRIVATE_KEY_NAME, out / PUBLIC_KEY_NAME
    key = Ed25519PrivateKey.generate()
    try:
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path in (private_path, public_path):
            if path.exists():
                raise KeyFileError(f"{path} already exists; refusing to overwrite a key")
        _write_new(private_path, private_pem(key), 0o600)
        _write_new(public_path, public_pem(key.public_key()), 0o644)
    except OSError as exc:
        raise KeyFileError(f"cannot write keys into {out}: {exc.strerror or exc}") from None
    return private_path, public_path, key_id(key.public_key())


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask must not widen or narrow what we promise
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read: {exc.strerror or exc}") from None


def private_key_mode_problem(path: Path, mode: int) -> str | None:
    """Why a private key file with ``st_mode`` ``mode`` must not be used, as one line naming
    ``path``, or None when it is fine: others may neither read it nor its group change it
    (0600 and 0640 pass). Used for ``receipts.signing_key_file`` and the reference relay's
    ``--approver-key``."""
    if os.name == "posix" and mode & 0o027:
        return (
            f"{path}: mode {stat.S_IMODE(mode):04o} lets other users read or "
            "change the private key; chmod 600 it"
        )
    return None


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Load an unencrypted PEM (PKCS#8) Ed25519 private key.

    Raises KeyFileError when the file is missing, accessible by others or writable by its
    group (0600 or 0640 are fine; 0640 leaves room for systemd credentials), or not an
    Ed25519 key.
    """
    data = _read(path)
    problem = private_key_mode_problem(path, os.stat(path).st_mode)
    if problem is not None:
        raise KeyFileError(problem)
    try:
        key: Any = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise KeyFileError(
            f"{path}: not an unencrypted PEM private key (make one with `hitl-gate keygen`)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: not an Ed25519 key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Load a PEM (``BEGIN PUBLIC KEY``) Ed25519 public key; raises KeyFileError otherwise.

    A private key file is refused on purpose: verifiers need, and should get, only the
    public key.
    """
    data = _read(path)
    if b"PRIVATE KEY" in data:
        raise KeyFileError(
            f"{path}: is a private key; give the public key file ({PUBLIC_KEY_NAME})"
        )
    try:
        key: Any = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise KeyFileError(f"{path}: not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path}: not an Ed25519 key")
    return key


@dataclass(frozen=True, slots=True)
class ReceiptKeys:
    """The gate's signing key (or None) and every public key it trusts, by key id.

    ``public`` holds the signing key's own public key plus ``receipts.trusted_public_keys``
    (older keys kept after a rotation).
    """

    signer: Signer | None
    public: dict[str, Ed25519PublicKey]


def load_receipt_keys(receipts: Any, *, private: bool = True) -> ReceiptKeys:
    """Load the keys named by a ``ReceiptsConfig`` (``signing_key_file``, ``trusted_public_keys``).

    With ``private=False`` the signing key file is not read (a verifier without access
    to it). Raises ConfigError listing every bad file as ``"<yaml.path>: <problem>"``.
    """
    errors: list[str] = []
    signer = None
    public: dict[str, Ed25519PublicKey] = {}
    if private and receipts.signing_key_file is not None:
        try:
            signer = Signer.from_private_key(load_private_key(receipts.signing_key_file))
            public[signer.key_id] = signer.public_key
        except KeyFileError as exc:
            errors.append(f"receipts.signing_key_file: {exc.message}")
    for i, path in enumerate(receipts.trusted_public_keys):
        try:
            key = load_public_key(path)
        except KeyFileError as exc:
            errors.append(f"receipts.trusted_public_keys[{i}]: {exc.message}")
            continue
        public[key_id(key)] = key
    if errors:
        raise ConfigError(errors)
    return ReceiptKeys(signer, public)
