"""rtmps:// is verified: a real nginx-rtmp behind a real TLS proxy on loopback (its own process), with
certificates made here.

- By default a server whose certificate is self-signed for another name is refused before a byte
  of RTMP (so before the stream key) goes through: the proxy sees the handshake fail and nothing
  after it, for a push (LiveWriter), a pull (LiveReader), an API stream and `swapstream live`.
- `--insecure-tls` (runtime.insecure_tls) lets it through, and says so in the log.
- With the proxy's CA given (runtime.tls_ca_file, or SSL_CERT_FILE) and the name on its
  certificate, push and pull work; the right CA with another name is still refused.
"""

from __future__ import annotations

import datetime
import logging
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")
if shutil.which("ffmpeg") is None or not Path("/usr/lib/nginx/modules/ngx_rtmp_module.so").exists():
    pytest.skip("needs ffmpeg and nginx with libnginx-mod-rtmp (.ci/run installs them)",
                allow_module_level=True)

from swapstream.errors import InputError, OutputError  # noqa: E402
from swapstream.live.nginx import NginxRtmp  # noqa: E402
from swapstream.live.streams import LiveReader, LiveWriter, rtmp_input_options  # noqa: E402
from swapstream.netpolicy import Outbound, TlsSettings  # noqa: E402
from swapstream.types import Frame  # noqa: E402

from .conftest import Served  # noqa: E402
from .test_api import error_of, request  # noqa: E402

PROXY = Path(__file__).with_name("tls_proxy.py")


# -- certificates ---------------------------------------------------------------------------------


def _write_certs(folder: Path) -> dict[str, Path]:
    """A CA and a certificate it signed for `localhost` (DNS name only); and a self-signed
    certificate for `other.example`."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def build(subject: str, issuer: str, key: ec.EllipticCurvePrivateKey, signer: ec.EllipticCurvePrivateKey,
              ca: bool, san: str | None) -> x509.Certificate:
        b = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(hours=1))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                              content_commitment=False, key_encipherment=False,
                                              data_encipherment=False, key_agreement=False,
                                              encipher_only=False, decipher_only=False), critical=True)
            b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        else:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(san or subject)]), critical=False)
            b = b.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                                critical=False)
            b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
                                critical=False)
        return b.sign(signer, hashes.SHA256())

    def save(stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        (folder / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / f"{stem}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))

    ca_key, good_key, bad_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    save("ca", build("SwapStream test CA", "SwapStream test CA", ca_key, ca_key, True, None), ca_key)
    save("good", build("localhost", "SwapStream test CA", good_key, ca_key, False, "localhost"), good_key)
    save("bad", build("other.example", "other.example", bad_key, bad_key, False, "other.example"), bad_key)
    return {k: folder / f"{k}.pem" for k in ("ca", "good", "bad")}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _write_certs(tmp_path_factory.mktemp("certs"))


# -- servers --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxRtmp]:
    with NginxRtmp(tmp_path_factory.mktemp("nginx")) as server:
        yield server


class Proxy:
    """tls_proxy.py in its own process, in front of nginx."""

    def __init__(self, cert: Path, upstream_port: int, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen([sys.executable, str(PROXY), "--cert", str(cert),
                                      "--key", str(cert.with_suffix(".key")),
                                      "--upstream-port", str(upstream_port), "--log", str(log)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("PORT "), line
        self.port = int(line.split()[1])

    def events(self, settle: float = 0.5) -> list[str]:
        time.sleep(settle)  # the proxy writes a connection's end when it sees it
        return self.log.read_text().splitlines() if self.log.exists() else []

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


@contextmanager
def proxy(cert: Path, nginx: NginxRtmp, tmp_path: Path) -> Iterator[Proxy]:
    p = Proxy(cert, nginx.port, tmp_path / f"proxy-{time.monotonic_ns()}.log")
    try:
        yield p
    finally:
        p.close()


def assert_nothing_after_the_handshake(p: Proxy) -> None:
    events = p.events()
    assert "accepted" in events, events
    assert any(e.startswith("handshake failed") for e in events), events
    assert "handshake ok" not in events and not any(e.startswith("bytes") for e in events), events


def rtmp_bytes(p: Proxy) -> int:
    return sum(int(e.split()[1]) for e in p.events() if e.startswith("bytes "))


# -- media ----------------------------------------------------------------------------------------


@contextmanager
def publishing(clip: Path, url: str) -> Iterator[None]:
    pub = subprocess.Popen(["ffmpeg", "-hide_banner", "-loglevel", "error", "-re", "-stream_loop", "-1",
                            "-i", str(clip), "-c", "copy", "-f", "flv", url],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        yield
    finally:
        pub.terminate()
        pub.wait(5)


def push(url: str, outbound: Outbound, seconds: float = 5.0) -> None:
    """Push a few seconds of frames, at their pace."""
    fps = 10
    w = LiveWriter(url, width=160, height=120, fps=fps, time_base=Fraction(1, fps), outbound=outbound)
    try:
        t0 = time.monotonic()
        for i in range(int(seconds * fps)):
            img = np.full((120, 160, 3), (i * 8) % 256, np.uint8)
            w.write(Frame(img, pts=i, time_base=Fraction(1, fps), index=i))
            time.sleep(max(0.0, t0 + (i + 1) / fps - time.monotonic()))
        assert w.dropped == 0
    finally:
        w.close()


def watch(url: str, got: list[int], stop: threading.Event) -> None:
    """Count the frames a plain viewer of nginx sees."""
    while not stop.is_set():
        try:
            with av.open(url, options=rtmp_input_options(), timeout=(5, 3)) as c:
                for _ in c.decode(video=0):
                    got.append(1)
                    if stop.is_set():
                        return
        except (av.error.FFmpegError, OSError):
            time.sleep(0.1)


def push_and_watch(url: str, outbound: Outbound, viewer_url: str) -> int:
    got: list[int] = []
    stop = threading.Event()
    t = threading.Thread(target=watch, args=(viewer_url, got, stop), daemon=True)
    t.start()
    try:
        push(url, outbound)
        time.sleep(1.0)
    finally:
        stop.set()
        t.join(10)
    return len(got)


def pull(url: str, outbound: Outbound, frames: int = 5) -> int:
    r = LiveReader(url, outbound=outbound, reconnect_seconds=0.0)
    n = 0
    try:
        r.open()
        for item in r:
            if isinstance(item, Frame):
                n += 1
                if n >= frames:
                    break
    finally:
        r.stop()
        r.close()
    return n


# -- the tests ------------------------------------------------------------------------------------


def test_a_certificate_for_another_name_is_refused_before_the_stream_key(
        certs: dict[str, Path], nginx: NginxRtmp, tmp_path: Path) -> None:
    with proxy(certs["bad"], nginx, tmp_path) as p:
        url = f"rtmps://localhost:{p.port}/live/secret-key"
        with pytest.raises(OutputError) as e:
            push(url, Outbound())
        why = str(e.value)
        assert "certificate was not accepted for localhost" in why and "--insecure-tls" in why, why
        assert "SSL_CERT_FILE" in why
        assert_nothing_after_the_handshake(p)
    with proxy(certs["bad"], nginx, tmp_path) as p:
        with pytest.raises(InputError) as e2:
            pull(f"rtmps://localhost:{p.port}/live/secret-key", Outbound())
        assert "certificate was not accepted" in str(e2.value)
        assert_nothing_after_the_handshake(p)


def test_insecure_tls_lets_it_through_and_says_so(certs: dict[str, Path], nginx: NginxRtmp, tmp_path: Path,
                                                  clip: tuple[Path, list[np.ndarray]],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    insecure = Outbound(tls=TlsSettings(insecure=True))
    with proxy(certs["bad"], nginx, tmp_path) as p, caplog.at_level(logging.WARNING, "swapstream"):
        seen = push_and_watch(f"rtmps://localhost:{p.port}/live/ins", insecure, nginx.url("ins"))
        assert seen >= 5, seen
        assert rtmp_bytes(p) > 10_000
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("--insecure-tls" in m and "NOT verified" in m for m in warnings), warnings
    with proxy(certs["bad"], nginx, tmp_path) as p, publishing(clip[0], nginx.url("in1")):
        assert pull(f"rtmps://localhost:{p.port}/live/in1", insecure) == 5


def test_the_servers_ca_and_its_name_verify(certs: dict[str, Path], nginx: NginxRtmp, tmp_path: Path,
                                            clip: tuple[Path, list[np.ndarray]],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    verified = Outbound(tls=TlsSettings(ca_file=certs["ca"]))
    with proxy(certs["good"], nginx, tmp_path) as p:
        assert push_and_watch(f"rtmps://localhost:{p.port}/live/ca", verified, nginx.url("ca")) >= 5
        assert rtmp_bytes(p) > 10_000
    with proxy(certs["good"], nginx, tmp_path) as p, publishing(clip[0], nginx.url("in2")):
        assert pull(f"rtmps://localhost:{p.port}/live/in2", verified) == 5
        # The CA through SSL_CERT_FILE, as OpenSSL reads it, with nothing configured.
        monkeypatch.setenv("SSL_CERT_FILE", str(certs["ca"]))
        assert pull(f"rtmps://localhost:{p.port}/live/in2", Outbound()) == 5
    # The right CA, but the URL names what the certificate does not hold (127.0.0.1): refused.
    with proxy(certs["good"], nginx, tmp_path) as p:
        with pytest.raises(OutputError) as e:
            push(f"rtmps://127.0.0.1:{p.port}/live/ca", verified)
        assert "certificate was not accepted for 127.0.0.1" in str(e.value)
        assert_nothing_after_the_handshake(p)


def test_an_api_stream_to_a_bad_certificate_gets_a_422_and_sends_nothing(
        served: Served, certs: dict[str, Path], nginx: NginxRtmp, tmp_path: Path) -> None:
    with proxy(certs["bad"], nginx, tmp_path) as p:
        served.runtime.config.runtime.allowed_ports = [p.port]
        status, _, body = request(served, "POST", "/api/streams", {
            "id": "tls", "input": f"rtmps://localhost:{p.port}/live/secret-key",
            "outputs": [{"type": "null"}]})
        assert status == 422, body
        assert "certificate was not accepted for localhost" in error_of(body)
        assert_nothing_after_the_handshake(p)
    assert served.runtime.streams == {}


def test_the_live_command_verifies_and_takes_insecure_tls(certs: dict[str, Path], nginx: NginxRtmp,
                                                          tmp_path: Path,
                                                          clip: tuple[Path, list[np.ndarray]]) -> None:
    import cv2

    from swapstream.demo import astronaut

    from ..stream.test_cli import assert_user_error, cli

    face = tmp_path / "face.png"
    cv2.imwrite(str(face), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    with proxy(certs["bad"], nginx, tmp_path) as p, publishing(clip[0], nginx.url("in3")):
        url = f"rtmps://localhost:{p.port}/live/in3"
        res = cli("live", "-s", face, "-i", url, "--hls-dir", tmp_path / "hls", "--max-frames", "3",
                  cwd=tmp_path)
        assert_user_error(res, "certificate was not accepted for localhost", "--insecure-tls")
        assert_nothing_after_the_handshake(p)
        res = cli("live", "-s", face, "-i", url, "--hls-dir", tmp_path / "hls", "--max-frames", "3",
                  "--insecure-tls", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "--insecure-tls" in res.stderr and "not verified" in res.stderr, res.stderr
        assert "frames in" in res.stdout and (tmp_path / "hls" / "index.m3u8").exists()


def test_help_names_the_flag() -> None:
    from typer.testing import CliRunner

    from swapstream.cli import app

    for command in ("live", "serve"):
        out = CliRunner().invoke(app, [command, "--help"], terminal_width=200).output
        assert "--insecure-tls" in out, out
