"""A self-signed C2PA test pair (`swapstream keys init`): a throw-away CA and a signing certificate.

C2PA validators refuse a self-signed signing certificate and a CA certificate used to sign, so even a
test pair is a chain of two: a CA (kept only as its certificate, ca.pem, for `verify --trust`; its
private key is discarded once it has signed, so nothing else can ever be issued under it) and an
end-entity ECDSA P-256 certificate with the profile the C2PA specification asks of a claim signer:
digital signature key usage, the email-protection extended key usage, subject and authority key
identifiers, not a CA. Manifests signed with it validate but are "untrusted" everywhere except where
ca.pem is given as a trust anchor: that is what a test pair is for. docs/responsible_use.md says what
a real certificate needs.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import OutputError

KEY_FILE = "signer.key"
CHAIN_FILE = "chain.pem"
CA_FILE = "ca.pem"
"""File names `swapstream keys init` writes, and where `provenance.key`/`cert` look when unset."""

DEFAULT_DAYS = 365
"""Validity of a test pair: long enough to test with for a while, short enough to expire."""


def default_dir() -> Path:
    """The user data folder's swapstream/c2pa ($XDG_DATA_HOME, else ~/.local/share), like the
    consent store's."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "swapstream" / "c2pa"


@dataclass(frozen=True)
class PairFiles:
    """Where `make_test_pair` wrote the files."""

    key: Path
    """The signing key (PEM, PKCS#8, mode 600): provenance.key."""
    chain: Path
    """Signing certificate then CA certificate (PEM): provenance.cert."""
    ca: Path
    """The CA certificate alone (PEM): the trust anchor for `swapstream verify --trust`."""


def _name(common_name: str, organisation: str) -> "object":
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation)])


def make_test_pair(out_dir: Path, *, organisation: str = "SwapStream test",
                   days: int = DEFAULT_DAYS, force: bool = False) -> PairFiles:
    """Write signer.key, chain.pem and ca.pem into `out_dir` (made if missing). Existing files are
    kept unless `force`: a key that signed published files may still be needed to explain them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    if not 1 <= days <= 3650:
        raise ValueError(f"days must be 1..3650, got {days}")
    paths = PairFiles(out_dir / KEY_FILE, out_dir / CHAIN_FILE, out_dir / CA_FILE)
    there = [p for p in (paths.key, paths.chain, paths.ca) if p.exists()]
    if there and not force:
        raise OutputError(f"'{there[0]}' already exists: keep it, or replace the pair with "
                          f"`swapstream keys init --force` (files it signed then no longer match a key "
                          f"you hold)")
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"--out '{out_dir}' is a file: give a folder (it is made if missing)")
    now = dt.datetime.now(dt.timezone.utc)
    # A few minutes back: a validator whose clock is slightly behind must not see "not yet valid".
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("SwapStream test CA (not trusted)", organisation)
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)  # type: ignore[arg-type]
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(_name("SwapStream test signer", organisation))  # type: ignore[arg-type]
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=False, crl_sign=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        # The key is created 600 from the start: never readable by others, even for a moment.
        fd = os.open(paths.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        os.chmod(paths.key, 0o600)  # O_CREAT's mode applies only to a new file
        paths.chain.write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
        paths.ca.write_bytes(ca.public_bytes(pem))
    except OSError as e:
        raise OutputError(f"cannot write the test pair into '{out_dir}': {e.strerror or e}. Give a "
                          f"folder you can write with --out") from None
    return paths
