"""C2PA Content Credentials, end to end: `swapstream keys init` makes a test pair, `swapstream run`
signs its output with it, and c2pa-python's own Reader (not SwapStream's code) validates the file,
finds the declared actions and source types, and rejects it once a byte of its pictures changes.
Bad key configuration of every kind is one `error:` line, before any frame is processed.

Everything runs offline: the pair is self-signed (validated as "untrusted" until its CA is given as
a trust anchor), no timestamp authority is asked, and the Reader fetches no OCSP or remote manifest.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import re
import stat
from pathlib import Path

import pytest

av = pytest.importorskip("av")
c2pa = pytest.importorskip("c2pa")

from swapstream.config import ProvenanceConfig
from swapstream.errors import ConfigError
from swapstream.keys import make_test_pair
from swapstream.provenance import (COMPOSITE_WITH_TRAINED, TRAINED_ALGORITHMIC_MEDIA, WATERMARK_ASSERTION,
                                   load_credentials, read_manifest)
from swapstream.verify import verify
from tests.stream.test_cli import CLIP_FRAMES, Assets, _show, assert_user_error, cli, count_frames


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Assets:
    return Assets(tmp_path_factory.mktemp("c2pa_assets"))


@pytest.fixture(autouse=True)
def no_default_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with an empty user data folder: no developer's own pair is picked up."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


class Signed:
    """One signed `run` output, shared by the read-only tests of this module."""

    def __init__(self, root: Path, assets: Assets) -> None:
        self.keys = root / "keys"
        res = cli("keys", "init", "--out", self.keys, cwd=root)
        assert res.returncode == 0, _show(res)
        self.out = root / "signed.mp4"
        self.run = cli("run", "--source", assets.face, "--input", assets.clip, "--output", self.out,
                       "--quiet", "--set", f"provenance.key={self.keys / 'signer.key'}",
                       "--set", f"provenance.cert={self.keys / 'chain.pem'}",
                       "--set", "provenance.c2pa=true", cwd=root)
        assert self.run.returncode == 0, _show(self.run)


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, assets: Assets) -> Signed:
    # Module scope: autouse fixtures are function-scoped, so the folder is set here by hand.
    root = tmp_path_factory.mktemp("signed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_DATA_HOME", str(root / "xdg"))
        return Signed(root, assets)


def _read(path: Path, trust: Path | None = None) -> dict:
    """The manifest store as c2pa-python reports it, validation included."""
    settings: dict = {"verify": {"ocsp_fetch": False, "remote_manifest_fetch": False}}
    if trust is not None:
        settings["trust"] = {"user_anchors": trust.read_text()}
        settings["verify"]["verify_trust"] = True
    with path.open("rb") as f, c2pa.Reader("video/mp4", f, None, c2pa.Context.from_dict(settings)) as r:
        return json.loads(r.json())


def _active(store: dict) -> dict:
    return store["manifests"][store["active_manifest"]]


def _failures(store: dict) -> set[str]:
    return {f["code"] for f in store["validation_results"]["activeManifest"].get("failure", [])}


# --------------------------------------------------------------------------------------------------
# The round trip


def test_keys_init_writes_a_private_key_and_a_two_certificate_chain(signed: Signed) -> None:
    from cryptography import x509

    key = signed.keys / "signer.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    chain = x509.load_pem_x509_certificates((signed.keys / "chain.pem").read_bytes())
    ca = x509.load_pem_x509_certificates((signed.keys / "ca.pem").read_bytes())
    assert len(chain) == 2 and len(ca) == 1
    assert chain[1] == ca[0]
    assert chain[0].issuer == ca[0].subject != chain[0].subject  # not self-signed
    assert chain[0].extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_run_output_validates_with_c2pa_python(signed: Signed) -> None:
    store = _read(signed.out)
    # Valid, and the only failure is that no trust anchor was given for a test CA.
    assert store["validation_state"] == "Valid", store["validation_results"]
    assert _failures(store) == {"signingCredential.untrusted"}
    m = _active(store)
    assert m["claim_generator_info"][0]["name"] == "SwapStream"
    assert m["title"] == "signed.mp4"  # the name only, never the folders
    actions = [a for x in m["assertions"] if x["label"].startswith("c2pa.actions")
               for a in x["data"]["actions"]]
    by_name = {a["action"]: a for a in actions}
    assert by_name["c2pa.edited"]["digitalSourceType"] == TRAINED_ALGORITHMIC_MEDIA
    assert by_name["c2pa.created"]["digitalSourceType"] == COMPOSITE_WITH_TRAINED
    assert by_name["c2pa.edited"]["softwareAgent"]["name"] == "SwapStream"
    # The hard binding covers the media (BMFF hash), checked and matched.
    passed = {s["code"] for s in store["validation_results"]["activeManifest"]["success"]}
    assert "assertion.bmffHash.match" in passed
    assert "claimSignature.validated" in passed


def test_signed_file_is_still_the_whole_video(signed: Signed) -> None:
    assert count_frames(signed.out) == CLIP_FRAMES
    with av.open(str(signed.out)) as c:
        assert len(c.streams.audio) == 1
        assert "AI-modified" in c.metadata.get("comment", "")
    # The signed copy replaced the output in one rename: no temporary file is left beside it.
    assert sorted(p.name for p in signed.out.parent.glob(".signed.mp4*")) == []


def test_manifest_names_the_mark_that_the_pixels_carry(signed: Signed) -> None:
    store = _read(signed.out)
    declared = next(x["data"] for x in _active(store)["assertions"] if x["label"] == WATERMARK_ASSERTION)
    rep = verify(str(signed.out))
    assert rep.combined is not None and rep.combined.found and rep.combined.payload is not None
    assert declared["stream_id"] == rep.combined.payload.stream_id
    assert declared["product_id"] == rep.combined.payload.product_id
    # The run's log says that it signed, and with what.
    assert re.search(r"^c2pa: signed by '.+' \(es256, ", signed.run.stderr, re.M), _show(signed.run)


def test_trusted_once_its_ca_is_an_anchor(signed: Signed) -> None:
    store = _read(signed.out, trust=signed.keys / "ca.pem")
    assert store["validation_state"] == "Trusted", store["validation_results"]
    assert read_manifest(str(signed.out), (signed.keys / "ca.pem").read_bytes()).verdict == "trusted"
    # Another CA does not make it trusted.
    other = make_test_pair(signed.keys.parent / "other_keys")
    assert read_manifest(str(signed.out), other.ca.read_bytes()).verdict == "valid"


def test_verify_reports_the_manifest(signed: Signed, tmp_path: Path) -> None:
    res = cli("verify", signed.out, "--summary", cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    text = " ".join(res.stdout.split())  # rich wraps the table
    assert "c2pa VALID: SwapStream" in text, text
    assert "c2pa.edited (trainedAlgorithmicMedia)" in text, text
    res = cli("verify", signed.out, "--json", "--max-frames", "2", "--trust", signed.keys / "ca.pem",
              cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    c = json.loads(res.stdout)["summary"]["c2pa"]
    assert c["verdict"] == "trusted" and c["claim_generator"].startswith("SwapStream")


# --------------------------------------------------------------------------------------------------
# Tampering


def _tamper(src: Path, dst: Path) -> None:
    """Copy `src` with one byte of coded picture data changed (inside mdat, past its header)."""
    data = bytearray(src.read_bytes())
    at = data.find(b"mdat")
    assert at > 0
    size = int.from_bytes(data[at - 4:at], "big")
    assert size > 1000, "the media data box is too small to hold the clip"
    data[at + size // 2] ^= 0x5A  # the middle of the pictures
    dst.write_bytes(bytes(data))


def test_changed_media_fails_validation(signed: Signed, tmp_path: Path) -> None:
    bad = tmp_path / "tampered.mp4"
    _tamper(signed.out, bad)
    store = _read(bad)
    assert store["validation_state"] == "Invalid"
    assert "assertion.bmffHash.mismatch" in _failures(store)
    # A trust anchor does not rescue changed media.
    assert _read(bad, trust=signed.keys / "ca.pem")["validation_state"] == "Invalid"
    check = read_manifest(str(bad))
    assert check.verdict == "invalid" and "assertion.bmffHash.mismatch" in check.failures
    res = cli("verify", bad, "--summary", cwd=tmp_path)
    text = " ".join(res.stdout.split())
    assert "c2pa INVALID: assertion.bmffHash.mismatch" in text, _show(res)


def test_changed_declaration_fails_validation(signed: Signed, tmp_path: Path) -> None:
    """Editing the manifest's own text (here: the claimed tool's name) breaks its signature."""
    data = signed.out.read_bytes()
    assert data.count(b"trainedAlgorithmicMedia") >= 1
    bad = tmp_path / "relabelled.mp4"
    bad.write_bytes(data.replace(b"trainedAlgorithmicMedia", b"trainedAlgorithmicMEDIA"))
    check = read_manifest(str(bad))
    assert check.verdict == "invalid", check


# --------------------------------------------------------------------------------------------------
# No key, bad keys


def test_auto_without_a_key_writes_an_unsigned_file(assets: Assets, tmp_path: Path) -> None:
    out = tmp_path / "plain.mp4"
    res = cli("run", "--source", assets.face, "--input", assets.clip, "--output", out, "--quiet", cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    assert re.search(r"^c2pa: not signed: no signing key \(`swapstream keys init`", res.stderr, re.M), _show(res)
    assert read_manifest(str(out)).verdict == "absent"
    with out.open("rb") as f:
        assert c2pa.Reader.try_create("video/mp4", f) is None


def _run_with(assets: Assets, tmp_path: Path, *sets: str,
              output: str = "out.mp4") -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / output
    args: list[object] = ["run", "--source", assets.face, "--input", assets.clip, "--output", out, "--quiet"]
    for s in sets:
        args += ["--set", s]
    return cli(*args, cwd=tmp_path), out


def test_required_without_a_key_is_one_error_line(assets: Assets, tmp_path: Path) -> None:
    res, out = _run_with(assets, tmp_path, "provenance.c2pa=true")
    line = assert_user_error(res, "provenance.key", "does not exist", "swapstream keys init",
                             "provenance.c2pa=false")
    assert str(tmp_path / "xdg") in line
    assert not out.exists()  # refused before the output was opened


@pytest.mark.parametrize("case", ["not_pem", "missing_cert", "mismatch", "self_signed_ca", "small_curve"])
def test_bad_key_config_is_one_error_line(assets: Assets, tmp_path: Path, case: str) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pair = make_test_pair(tmp_path / "keys")
    key, cert = pair.key, pair.chain
    if case == "not_pem":
        key = tmp_path / "key.txt"
        key.write_text("this is not a key\n")
        needles = ["provenance.key", "key.txt", "not a PEM private key"]
    elif case == "missing_cert":
        cert = tmp_path / "nowhere.pem"
        needles = ["provenance.cert", "nowhere.pem", "does not exist"]
    elif case == "mismatch":
        other = make_test_pair(tmp_path / "other")
        key = other.key
        needles = ["does not belong to provenance.key", "chain.pem"]
    elif case == "self_signed_ca":
        # A self-signed certificate used as the signing certificate: refused by c2pa itself.
        ca_key = ec.generate_private_key(ec.SECP256R1())
        key = tmp_path / "ca.key"
        key.write_bytes(ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
        name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "self")])
        now = dt.datetime.now(dt.timezone.utc)
        self_signed = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                       .public_key(ca_key.public_key()).serial_number(1)
                       .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=1))
                       .sign(ca_key, hashes.SHA256()))
        cert = tmp_path / "self.pem"
        cert.write_bytes(self_signed.public_bytes(serialization.Encoding.PEM))
        needles = ["cannot sign C2PA manifests", "self-signed", "self.pem"]
    else:
        small = ec.generate_private_key(ec.SECP256K1())
        key = tmp_path / "k1.key"
        key.write_bytes(small.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
        needles = ["secp256k1", "P-256"]
    res, out = _run_with(assets, tmp_path, f"provenance.key={key}", f"provenance.cert={cert}")
    assert_user_error(res, *needles)
    assert not out.exists()


def test_required_with_a_container_c2pa_cannot_hold_is_one_error_line(assets: Assets, tmp_path: Path) -> None:
    pair = make_test_pair(tmp_path / "keys")
    res, out = _run_with(assets, tmp_path, "provenance.c2pa=true", f"provenance.key={pair.key}",
                         f"provenance.cert={pair.chain}", output="out.mkv")
    assert_user_error(res, "out.mkv", "C2PA cannot be embedded", ".mp4")
    assert not out.exists()


def test_bad_timestamp_url_is_a_config_error(tmp_path: Path) -> None:
    res = cli("config", "--set", "provenance.timestamp_url=ftp://x", cwd=tmp_path)
    assert_user_error(res, "provenance.timestamp_url", "ftp://x")


def test_keys_init_keeps_an_existing_pair(tmp_path: Path) -> None:
    first = cli("keys", "init", "--out", tmp_path / "k", cwd=tmp_path)
    assert first.returncode == 0, _show(first)
    key = (tmp_path / "k" / "signer.key").read_bytes()
    again = cli("keys", "init", "--out", tmp_path / "k", cwd=tmp_path)
    assert_user_error(again, "already exists", "--force")
    assert (tmp_path / "k" / "signer.key").read_bytes() == key
    forced = cli("keys", "init", "--out", tmp_path / "k", "--force", cwd=tmp_path)
    assert forced.returncode == 0, _show(forced)
    assert (tmp_path / "k" / "signer.key").read_bytes() != key


def test_keys_init_default_folder_is_what_run_uses(tmp_path: Path) -> None:
    res = cli("keys", "init", cwd=tmp_path)
    assert res.returncode == 0, _show(res)
    creds = load_credentials(ProvenanceConfig())
    assert creds is not None
    assert creds.key_path == tmp_path / "xdg" / "swapstream" / "c2pa" / "signer.key"
    assert creds.alg == "es256"
    assert load_credentials(ProvenanceConfig(c2pa=False)) is None


def test_encrypted_key_is_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    pair = make_test_pair(tmp_path / "keys")
    key = serialization.load_pem_private_key(pair.key.read_bytes(), None)
    enc = tmp_path / "enc.key"
    enc.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(b"pw")))
    with pytest.raises(ConfigError, match=r"enc\.key' is encrypted"):
        load_credentials(ProvenanceConfig(key=enc, cert=pair.chain))


def test_verify_trust_must_be_certificates(signed: Signed, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("nothing here\n")
    assert_user_error(cli("verify", signed.out, "--trust", junk, cwd=tmp_path), "--trust", "junk.pem",
                      "no PEM certificate")
    assert_user_error(cli("verify", signed.out, "--trust", tmp_path / "none.pem", cwd=tmp_path), "--trust",
                      "none.pem", "not a file")


def test_formats_without_a_binding_are_reported_as_such(tmp_path: Path) -> None:
    assert read_manifest("rtmp://example.invalid/live/key").verdict == "unsupported"
    assert read_manifest(str(tmp_path / "index.m3u8")).verdict == "unsupported"


def test_an_unsigned_png_is_absent_not_invalid(tmp_path: Path) -> None:
    import cv2
    import numpy as np

    p = tmp_path / "plain.png"
    ok, png = cv2.imencode(".png", np.full((8, 8, 3), 7, np.uint8))
    assert ok
    p.write_bytes(png.tobytes())
    assert read_manifest(str(p)).verdict == "absent"
