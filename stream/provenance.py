"""C2PA Content Credentials: a signed manifest on the files SwapStream writes, and reading it back.

The watermark (watermark.py) survives re-encoding but says little; the container tags (disclosure.py)
say more but anyone can edit them. A C2PA manifest is the industry's machine-readable declaration:
it names the tool (claim generator "SwapStream"), lists what was done (actions), and is signed with
the user's key over a hash of the media, so any change to the pictures or the declaration after
signing is detected by every C2PA validator (c2pa-python, c2patool, contentcredentials.org/verify).

What a `run` output declares (`manifest_definition`):
- `c2pa.created`, digital source type compositeWithTrainedAlgorithmicMedia: the file as a whole is
  real footage composited with a trained model's output (the same IPTC term as the container tag);
- `c2pa.edited`, digital source type trainedAlgorithmicMedia: the edit, faces replaced by a trained
  model, made by the software agent SwapStream;
- `com.swapstream.watermark`, when the frames carry the mark: its scheme and payload, so a checker
  can tie the signed declaration to the mark that `swapstream verify` reads from the pixels.

Signing happens once the file is complete (the manifest's hash covers the finished media): the signed
copy is written beside the output and moved over it in one rename, so a crash never leaves a
half-signed file. MP4, M4V and MOV are signed (ISO BMFF, c2pa's hard binding `c2pa.hash.bmff.v3`);
Matroska, WebM, FLV and MPEG-TS have no C2PA binding in the library (docs/responsible_use.md).

The key and certificate come from the configuration (`provenance.*`, config.py); `swapstream keys
init` (keys.py) makes a test pair. They are checked when a job starts, by signing a tiny picture in
memory, so that a wrong key is one error line before any frame is processed, not after the encode.

c2pa-python is imported inside the functions that use it: it loads a 23 MB native library that the
live and serve paths never need.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import __version__
from .config import ProvenanceConfig
from .errors import ConfigError, OutputError
from .keys import CHAIN_FILE, KEY_FILE, default_dir
from .watermark import SCHEME, Payload

log = logging.getLogger(__name__)

IPTC = "http://cv.iptc.org/newscodes/digitalsourcetype/"
TRAINED_ALGORITHMIC_MEDIA = IPTC + "trainedAlgorithmicMedia"
"""IPTC digital source type of media made by a trained model: the swap itself."""
COMPOSITE_WITH_TRAINED = IPTC + "compositeWithTrainedAlgorithmicMedia"
"""IPTC digital source type of footage combined with a trained model's output: the whole file."""
CLAIM_GENERATOR = "SwapStream"
WATERMARK_ASSERTION = "com.swapstream.watermark"
"""Label of the assertion that records the invisible mark's payload (reverse-DNS: not a C2PA label)."""

SIGNABLE: dict[str, str] = {".mp4": "video/mp4", ".m4v": "video/x-m4v", ".mov": "video/quicktime"}
"""Output suffixes that get a manifest, and their MIME types: the ISO BMFF files SwapStream writes."""

UNTRUSTED = "signingCredential.untrusted"
"""The validator's code for a signer whose chain ends at no trust anchor it was given: a test pair,
or any certificate when no trust list is configured. It does not make a manifest invalid."""

Verdict = Literal["absent", "invalid", "valid", "trusted", "unsupported"]


@dataclass(frozen=True)
class Credentials:
    """A usable signing key and its certificate chain (checked by a test signature)."""

    key_path: Path
    cert_path: Path
    key_pem: bytes = field(repr=False)
    chain_pem: bytes
    alg: str
    """c2pa's name of the signature algorithm, from the key type (es256, es384, es512, ps256, ed25519)."""
    signer: str
    """The signing certificate's subject, for the run's log."""
    timestamp_url: str | None = None


_FIX = ("make a test pair with `swapstream keys init`, give yours with --set provenance.key=PATH "
        "--set provenance.cert=PATH, or turn signing off with --set provenance.c2pa=false")


def _read(path: Path, what: str) -> bytes:
    if not path.exists():
        raise ConfigError(f"{what} '{path}' does not exist: {_FIX}")
    if path.is_dir():
        raise ConfigError(f"{what} '{path}' is a folder: give the PEM file itself")
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {what} '{path}': {e.strerror or e}. Make it readable by "
                          f"this user") from None


def _alg_for(key: Any, key_path: Path) -> str:
    """c2pa's algorithm name for a private key (the curve or key type fixes it)."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    if isinstance(key, ec.EllipticCurvePrivateKey):
        by_curve = {"secp256r1": "es256", "secp384r1": "es384", "secp521r1": "es512"}
        if key.curve.name in by_curve:
            return by_curve[key.curve.name]
        raise ConfigError(f"provenance.key '{key_path}' is on the curve {key.curve.name}: C2PA signs "
                          f"with P-256, P-384 or P-521 only. {_FIX[0].upper()}{_FIX[1:]}")
    if isinstance(key, rsa.RSAPrivateKey):
        if key.key_size < 2048:
            raise ConfigError(f"provenance.key '{key_path}' is a {key.key_size}-bit RSA key: C2PA needs "
                              f"2048 bits or more. {_FIX[0].upper()}{_FIX[1:]}")
        return "ps256"  # C2PA allows RSA only with PSS padding
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "ed25519"
    raise ConfigError(f"provenance.key '{key_path}' is a {type(key).__name__}: C2PA signs with EC "
                      f"(P-256/384/521), RSA or Ed25519 keys. {_FIX[0].upper()}{_FIX[1:]}")


def _subject(cert: Any) -> str:
    from cryptography.x509.oid import NameOID

    names = [a.value for oid in (NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME)
             for a in cert.subject.get_attributes_for_oid(oid)]
    return ", ".join(str(n) for n in names) or cert.subject.rfc4514_string()


def load_credentials(cfg: ProvenanceConfig) -> Credentials | None:
    """The configured key and chain, checked; None when signing is off, or `auto` finds neither
    default file. Every problem is a ConfigError naming the file and the fix."""
    if cfg.c2pa is False:
        return None
    key_path = cfg.key if cfg.key is not None else default_dir() / KEY_FILE
    cert_path = cfg.cert if cfg.cert is not None else default_dir() / CHAIN_FILE
    given = cfg.key is not None or cfg.cert is not None
    if cfg.c2pa == "auto" and not given and not key_path.exists() and not cert_path.exists():
        return None
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    key_pem = _read(key_path, "provenance.key")
    chain_pem = _read(cert_path, "provenance.cert")
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise ConfigError(f"provenance.key '{key_path}' is encrypted: give an unencrypted PEM key "
                          f"(readable only by you: chmod 600)") from None
    except (ValueError, UnsupportedAlgorithm) as e:
        raise ConfigError(f"provenance.key '{key_path}' is not a PEM private key "
                          f"({str(e).splitlines()[0] if str(e) else type(e).__name__}): {_FIX}") from None
    try:
        certs = x509.load_pem_x509_certificates(chain_pem)
    except ValueError as e:
        raise ConfigError(f"provenance.cert '{cert_path}' is not a PEM certificate chain "
                          f"({str(e).splitlines()[0]}): {_FIX}") from None
    alg = _alg_for(key, key_path)
    raw = serialization.PublicFormat.SubjectPublicKeyInfo
    if certs[0].public_key().public_bytes(serialization.Encoding.DER, raw) != \
            key.public_key().public_bytes(serialization.Encoding.DER, raw):
        raise ConfigError(f"provenance.cert '{cert_path}' does not belong to provenance.key "
                          f"'{key_path}': its first certificate must be the key's own (the signing "
                          f"certificate, then its issuers)")
    creds = Credentials(key_path, cert_path, key_pem, chain_pem, alg, _subject(certs[0]), cfg.timestamp_url)
    _test_signature(creds)
    return creds


def _signer(creds: Credentials) -> Any:
    import c2pa

    return c2pa.Signer.from_info(c2pa.C2paSignerInfo(creds.alg.encode(), creds.chain_pem, creds.key_pem,
                                                     creds.timestamp_url))


def _test_signature(creds: Credentials) -> None:
    """Sign a 16x16 PNG in memory: the library checks the certificate's profile (not self-signed,
    not a CA, the right key usages) only when it signs, and a rejection here costs milliseconds."""
    import c2pa
    import cv2
    import numpy as np

    ok, png = cv2.imencode(".png", np.zeros((16, 16, 3), np.uint8))
    assert ok
    manifest = manifest_definition("check.png", None)
    try:
        with _signer(creds) as signer, c2pa.Builder(manifest) as builder:
            builder.sign(signer, "image/png", io.BytesIO(png.tobytes()), io.BytesIO())
    except c2pa.C2paError as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"provenance.cert '{creds.cert_path}' with provenance.key '{creds.key_path}' "
                          f"cannot sign C2PA manifests ({why}). A signing certificate must be issued by "
                          f"a CA (not self-signed), must not be a CA itself, and needs the digital "
                          f"signature key usage (docs/responsible_use.md); or {_FIX}") from None


def manifest_definition(title: str, mark: Payload | None, scheme: str = SCHEME) -> dict[str, Any]:
    """The manifest of one output named `title` (the file name only: no folders, which could name the
    user), declaring the swap; `mark` is the invisible mark's payload when the frames carry it, in the
    layout `scheme`."""
    agent = {"name": CLAIM_GENERATOR, "version": __version__}
    assertions: list[dict[str, Any]] = [{"label": "c2pa.actions.v2", "data": {"actions": [
        {"action": "c2pa.created", "digitalSourceType": COMPOSITE_WITH_TRAINED, "softwareAgent": agent,
         "description": "Video written by SwapStream: real footage with faces replaced by AI."},
        {"action": "c2pa.edited", "digitalSourceType": TRAINED_ALGORITHMIC_MEDIA, "softwareAgent": agent,
         "description": "Faces replaced by a trained face-swap model."},
    ]}}]
    if mark is not None:
        assertions.append({"label": WATERMARK_ASSERTION, "data": {
            "scheme": scheme, "product_id": mark.product_id, "stream_id": mark.stream_id,
            "check_with": "swapstream verify"}})
    return {"claim_generator_info": [agent], "title": title, "assertions": assertions}


def sign_file(path: Path, creds: Credentials, mark: Payload | None, scheme: str = SCHEME) -> None:
    """Embed a signed manifest in the finished file `path` (an MP4/M4V/MOV), replacing it atomically."""
    import c2pa

    mime = SIGNABLE[path.suffix.lower()]
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".c2pa-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w+b") as dst:
            with path.open("rb") as src, _signer(creds) as signer, \
                    c2pa.Builder(manifest_definition(path.name, mark, scheme)) as builder:
                builder.sign(signer, mime, src, dst)
            dst.flush()
            os.fsync(dst.fileno())
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)  # mkstemp makes 0600: keep the output's mode
        os.replace(tmp, path)
    except (c2pa.C2paError, OSError) as e:
        Path(tmp).unlink(missing_ok=True)
        why = (e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]) or type(e).__name__
        raise OutputError(f"cannot sign '{path}' with C2PA ({why}): the video was written without "
                          f"Content Credentials (the mark and the tags are in it). Check the disk and "
                          f"the key, or run again with --set provenance.c2pa=false") from None


class Provenance:
    """The C2PA side of one job: credentials loaded (and checked) once, each output signed."""

    def __init__(self, cfg: ProvenanceConfig) -> None:
        self.cfg = cfg
        self.credentials: Credentials | None = load_credentials(cfg)
        self.signed: list[Path] = []

    def plan(self, output: Path) -> bool:
        """Whether `output` will be signed; raises for `c2pa: true` and a container C2PA cannot hold.
        Called before the first frame, so that the answer does not wait for the encode."""
        if self.credentials is None:
            if self.cfg.c2pa is True:  # cannot happen: load_credentials raised; kept for clarity
                raise ConfigError(f"provenance.c2pa is true but no key was found: {_FIX}")
            return False
        if output.suffix.lower() in SIGNABLE:
            return True
        msg = (f"output '{output}': C2PA cannot be embedded in a {output.suffix or 'suffix-less'} file "
               f"(the library signs {', '.join(SIGNABLE)})")
        if self.cfg.c2pa is True:
            raise ConfigError(f"{msg}. Write an .mp4 or .mov with --output, or --set provenance.c2pa=auto")
        log.warning("%s: this output gets no Content Credentials (the mark and the tags are in it)", msg)
        return False

    def sign(self, output: Path, mark: Payload | None, scheme: str = SCHEME) -> None:
        assert self.credentials is not None
        sign_file(output, self.credentials, mark, scheme)
        self.signed.append(output)

    def describe(self, live: bool) -> list[tuple[str, str]]:
        """(name, value) for the run's log."""
        c = self.credentials
        if live:
            return [("c2pa", "not on live outputs (C2PA has no binding for RTMP, MPEG-TS or WebRTC)")]
        if c is None:
            how = "provenance.c2pa=false" if self.cfg.c2pa is False else \
                "no signing key (`swapstream keys init` makes a test pair)"
            return [("c2pa", f"not signed: {how}")]
        return [("c2pa", f"signed by '{c.signer}' ({c.alg}, {c.cert_path})")]


# --------------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class ManifestCheck:
    """What a C2PA validator says about a file's manifest."""

    verdict: Verdict
    """absent: no manifest; invalid: one that fails validation (the media or the manifest changed
    after signing, or a bad signature); valid: it validates, its signer is on no trust list given;
    trusted: it validates and chains to a given trust anchor; unsupported: a format without a C2PA
    binding, or a URL (not read)."""
    detail: str = ""
    """One line: why it is invalid, absent or unsupported."""
    failures: tuple[str, ...] = ()
    """Validation failure codes (without signingCredential.untrusted, reported by `verdict`)."""
    generator: str = ""
    """The active manifest's claim generator (name and version)."""
    signer: str = ""
    """Who signed it: the certificate's common name and issuer."""
    actions: tuple[tuple[str, str], ...] = ()
    """(action, digital source type or "") of the active manifest."""
    watermark: dict[str, Any] | None = None
    """The com.swapstream.watermark assertion, when present."""

    @property
    def by_swapstream(self) -> bool:
        """A manifest that validates and was made by SwapStream."""
        return self.verdict in ("valid", "trusted") and self.generator.startswith(CLAIM_GENERATOR)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "detail": self.detail, "failures": list(self.failures),
                "claim_generator": self.generator, "signer": self.signer,
                "actions": [{"action": a, "digitalSourceType": t or None} for a, t in self.actions],
                "watermark": self.watermark}


def _reader_context(trust_pem: bytes | None) -> Any:
    import c2pa

    # Nothing from the network while verifying: no remote manifests (a file could point verify at any
    # URL) and no OCSP; trust is only what the user gives.
    settings: dict[str, Any] = {"verify": {"remote_manifest_fetch": False, "ocsp_fetch": False}}
    if trust_pem is not None:
        settings["trust"] = {"user_anchors": trust_pem.decode("ascii", "replace")}
        settings["verify"]["verify_trust"] = True
    return c2pa.Context.from_dict(settings)


def read_manifest(source: str, trust_pem: bytes | None = None) -> ManifestCheck:
    """Validate the C2PA manifest of a local file (`trust_pem`: CA certificates to trust)."""
    if "://" in source:
        return ManifestCheck("unsupported", "a URL: C2PA is read from local files only")
    path = Path(source)
    if path.suffix.lower() in (".m3u8", ".ts", ".mkv", ".webm", ".flv"):
        return ManifestCheck("unsupported", f"{path.suffix} files have no C2PA binding in the library")
    # Imported once a file can carry a manifest: checking a playlist's mark needs no C2PA library.
    import c2pa

    try:
        with path.open("rb") as f, c2pa.Reader(None, f, None, _reader_context(trust_pem)) as reader:
            store = json.loads(reader.json())
    except c2pa.C2paError.ManifestNotFound:
        return ManifestCheck("absent", "no C2PA manifest in the file")
    except c2pa.C2paError as e:
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "not supported" in text.lower() or "NotSupported" in type(e).__name__:
            return ManifestCheck("unsupported", f"the C2PA library cannot read this format ({text})")
        return ManifestCheck("invalid", f"the manifest cannot be read ({text})")
    state = str(store.get("validation_state", "")).lower()
    results = store.get("validation_results", {}).get("activeManifest", {}) or {}
    failures = [f for f in results.get("failure", []) or [] if f.get("code") != UNTRUSTED]
    active = store.get("manifests", {}).get(store.get("active_manifest", ""), {})
    gen_info = (active.get("claim_generator_info") or [{}])[0]
    generator = " ".join(str(gen_info.get(k, "")) for k in ("name", "version")).strip()
    sig = active.get("signature_info") or {}
    signer = ", ".join(x for x in (str(sig.get("common_name", "")), str(sig.get("issuer", ""))) if x)
    actions: list[tuple[str, str]] = []
    watermark = None
    for a in active.get("assertions", []) or []:
        if str(a.get("label", "")).startswith("c2pa.actions"):
            actions += [(str(x.get("action", "")), str(x.get("digitalSourceType", "")))
                        for x in a.get("data", {}).get("actions", [])]
        elif a.get("label") == WATERMARK_ASSERTION:
            watermark = a.get("data")
    verdict: Verdict
    if state == "trusted":
        verdict, detail = "trusted", "validates and chains to a trusted certificate"
    elif state == "valid" and not failures:
        verdict, detail = "valid", ("validates; the signer is on no trust list given (--trust CA.pem)"
                                    if trust_pem is None else "validates; the signer is NOT in --trust")
    else:
        verdict = "invalid"
        detail = "; ".join(f"{f.get('code')}: {f.get('explanation', '')}" for f in failures) or \
            f"validation state {state or 'unknown'}"
    return ManifestCheck(verdict, detail, tuple(str(f.get("code")) for f in failures), generator, signer,
                         tuple(actions), watermark)
