"""The outbound policy (swapstream.netpolicy) for the URLs of API streams, and the media folder's
file rules, over real HTTP, nginx-rtmp, ffmpeg and sockets on loopback.

Refusals are checked to happen before any connection: an audit hook sees every Python-level
`socket.connect` and `socket.getaddrinfo` of the process (the API server runs in it); FFmpeg's own
connections, which the hook cannot see, are ruled out with real listeners that must stay untouched.
No test contacts anything beyond loopback: the refused addresses are IP literals, and the only name
looked up is `localhost`.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

av = pytest.importorskip("av")
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from swapstream.errors import InputError  # noqa: E402
from swapstream.live.streams import (MEDIA_FORMATS, LiveReader, media_file_options,  # noqa: E402
                                     rtmp_input_options)
from swapstream.netpolicy import (REFUSED, Outbound, OutboundPolicy, OutboundRefused,  # noqa: E402
                                  UrlSyntaxError, parse_rtmp_url)
from swapstream.runtime.api import ApiSettings  # noqa: E402
from swapstream.runtime.manager import StreamRequestError, StreamRuntime  # noqa: E402
from swapstream.runtime.stream import InputSpec, OutputSpec, StreamSpec  # noqa: E402

from .conftest import TOKEN, Served, runtime_config, serve_runtime  # noqa: E402
from .test_api import error_of, request  # noqa: E402

HAVE_RTMP = shutil.which("ffmpeg") is not None and Path("/usr/lib/nginx/modules/ngx_rtmp_module.so").exists()

# -- what the process tries to reach --------------------------------------------------------------

_seen: list[tuple[str, Any]] = []
_recording = threading.Event()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _recording.is_set() and event in ("socket.connect", "socket.getaddrinfo"):
        # connect: (socket, address); getaddrinfo: (host, port, family, type, proto)
        _seen.append((event, args[1] if event == "socket.connect" else args[0]))


sys.addaudithook(_audit)  # hooks stay for the process's life: this one records only when asked


@contextmanager
def contacts() -> Iterator[list[tuple[str, Any]]]:
    """The connections and lookups the process attempts meanwhile."""
    _seen.clear()
    _recording.set()
    try:
        yield _seen
    finally:
        _recording.clear()


def host_of(target: Any) -> str:
    return str(target[0] if isinstance(target, tuple) else target)


# -- the policy itself ----------------------------------------------------------------------------

REFUSED_BY_DEFAULT = [
    "rtmp://10.0.0.1/live/k", "rtmp://192.168.1.1/live/k", "rtmp://172.16.0.5/live/k",
    "rtmp://169.254.169.254/live/k",  # cloud metadata, link-local
    "rtmp://100.100.100.200/live/k",  # Alibaba's metadata, in the shared (CGNAT) range
    "rtmp://168.63.129.16/live/k",  # Azure's wireserver: a public address
    "rtmp://0.0.0.0/live/k", "rtmp://[::]/live/k",  # "this host": Linux connects it to loopback
    "rtmp://[::ffff:10.0.0.1]/live/k", "rtmp://[::ffff:169.254.169.254]/live/k",  # IPv4-mapped
    "rtmp://[::10.0.0.1]/live/k",  # IPv4-compatible
    "rtmp://[64:ff9b::a9fe:a9fe]/live/k", "rtmp://[2002:a00:1::1]/live/k",  # NAT64, 6to4 of private
    "rtmp://[fe80::1]/live/k", "rtmp://[fd00:ec2::254]/live/k", "rtmp://[fc00::1]/live/k",
    "rtmp://224.0.0.1/live/k", "rtmp://255.255.255.255/live/k",
    "rtmp://127.0.0.1:22/live/k", "rtmp://127.0.0.1:6379/live/k",  # loopback, off the scheme's port
    "rtmps://127.0.0.1:1935/live/k", "rtmp://127.0.0.1:443/live/k",  # the other scheme's port
]


@pytest.mark.parametrize("url", REFUSED_BY_DEFAULT)
def test_the_default_policy_refuses_before_any_contact(url: str) -> None:
    with contacts() as seen, pytest.raises(OutboundRefused) as e:
        OutboundPolicy().decide(url)
    assert str(e.value) == REFUSED  # the same words whatever the cause
    assert seen == [], seen  # not even a lookup: the host is an address


def test_the_default_policy_allows_loopback_on_the_schemes_ports_and_public_hosts() -> None:
    policy = OutboundPolicy()
    for url, pinned in (("rtmp://127.0.0.1/live/k", "127.0.0.1"), ("rtmp://127.3.4.5:1935/a/b", "127.3.4.5"),
                        ("rtmp://[::1]/live/k", "::1"), ("rtmps://127.0.0.1/live/k", "127.0.0.1"),
                        ("rtmp://[::ffff:127.0.0.1]/live/k", "127.0.0.1"),
                        ("rtmp://8.8.8.8/live/k", "8.8.8.8")):  # decided, never contacted
        with contacts() as seen:
            _, addresses = policy.decide(url)
        assert [str(a) for a in addresses] == [pinned] and seen == [], (url, seen)
    with contacts() as seen:
        _, addresses = policy.decide("rtmp://localhost/live/k")
    assert {str(a) for a in addresses} <= {"127.0.0.1", "::1"}
    assert [s for s in seen if s[0] == "socket.connect"] == []
    assert {host_of(s[1]) for s in seen} == {"localhost"}


def test_a_name_is_judged_by_what_it_resolves_to() -> None:
    """Loopback taken out of allowed_hosts: `localhost` is refused although `*` matches its name."""
    with pytest.raises(OutboundRefused) as e:
        OutboundPolicy(allowed_hosts=("*",)).decide("rtmp://localhost/live/k")
    assert str(e.value) == REFUSED and "127.0.0.1" in e.value.reason


def test_listed_networks_ports_and_name_patterns() -> None:
    lab = OutboundPolicy(allowed_hosts=("10.20.0.0/16", "fd12::/16", "169.254.169.254"),
                         allowed_ports=(8935,))
    for url in ("rtmp://10.20.1.2/live/k", "rtmp://10.20.1.2:8935/live/k", "rtmp://[fd12::5]/a/b",
                "rtmp://[::ffff:10.20.0.9]/a/b", "rtmp://169.254.169.254/a/b"):
        lab.decide(url)
    for url in ("rtmp://10.21.0.1/live/k", "rtmp://10.20.1.2:8936/live/k",
                "rtmp://8.8.8.8/live/k",  # no `*`: public hosts only by name pattern
                "rtmp://127.0.0.1/live/k"):  # nor loopback, now that it is not listed
        with pytest.raises(OutboundRefused):
            lab.decide(url)
    with pytest.raises(OutboundRefused):  # a metadata address only when listed as itself
        OutboundPolicy(allowed_hosts=("169.254.0.0/16",)).decide("rtmp://169.254.169.254/live/k")
    OutboundPolicy(allowed_hosts=("169.254.0.0/16",)).decide("rtmp://169.254.1.2/live/k")
    named = OutboundPolicy(allowed_hosts=("*.example.com",))
    with pytest.raises(OutboundRefused):
        named.decide("rtmp://8.8.8.8/live/k")  # an address matches no name pattern


@pytest.mark.parametrize("url, why", [
    ("rtmp://host_name/live/k", "not a host name"), ("rtmp://a..b/live/k", "not a host name"),
    ("rtmp://256.1.1.1/live/k", "not a host name"), ("rtmp://2130706433/live/k", "not a host name"),
    ("rtmp://0x7f000001/live/k", "not a host name"), ("rtmp://127.1/live/k", "not a host name"),
    ("rtmp://h:0/live/k", "port 0"), ("rtmp://h:70000/live/k", "port 70000"),
    ("rtmp://user@h/live/k", "not an rtmp"), ("rtmp://[fe80::1%25eth0]/live/k", "not a host"),
])
def test_malformed_hosts_are_syntax_errors_and_never_looked_up(url: str, why: str) -> None:
    with contacts() as seen:
        with pytest.raises(UrlSyntaxError) as e:
            parse_rtmp_url(url)
        with pytest.raises(OutboundRefused):
            OutboundPolicy().decide(url)
    assert why in str(e.value)
    assert seen == [], seen  # glibc would read 2130706433 or 0x7f000001 as 127.0.0.1


def test_connections_go_to_the_checked_address() -> None:
    enforced = Outbound(OutboundPolicy())
    # IPv4 first when a name has both (nginx-rtmp listens on IPv4 only by default).
    assert enforced.connect("rtmp://localhost/live/k").url == "rtmp://127.0.0.1:1935/live/k"
    mapped = enforced.connect("rtmp://[::ffff:127.0.0.1]:1935/live/k?x=1")
    assert mapped.url == "rtmp://127.0.0.1:1935/live/k?x=1"
    with pytest.raises(OutboundRefused):
        enforced.connect("http://127.0.0.1/x")  # only rtmp and rtmps go out under the policy
    # The operator's own URL (the CLI): no policy, given to FFmpeg as it was typed.
    assert Outbound().connect("rtmp://localhost:1234/live/k").url == "rtmp://localhost:1234/live/k"


def test_config_entries_are_checked() -> None:
    from swapstream.config import load_config
    from swapstream.errors import ConfigError

    cfg = load_config(None, ['runtime.allowed_hosts=["*.example.com", 10.0.0.0/8, "::1"]',
                             "runtime.allowed_ports=[8935]"])
    assert cfg.runtime.allowed_hosts == ["*.example.com", "10.0.0.0/8", "::1/128"]
    assert OutboundPolicy.from_config(cfg.runtime).allowed_ports == (8935,)
    for bad in ("runtime.allowed_hosts=[10.0.0.1/8]", 'runtime.allowed_hosts=["a b"]',
                "runtime.allowed_ports=[0]", "runtime.allowed_ports=[65536]"):
        with pytest.raises(ConfigError, match="runtime.allowed_"):
            load_config(None, [bad])


# -- over the API ---------------------------------------------------------------------------------


@contextmanager
def listeners() -> Iterator[dict[str, Any]]:
    """A port that accepts (and counts), one that never accepts (its backlog fills silently), and
    one with nothing behind it: the three a port scan tells apart by error and time."""
    accepting = socket.socket()
    accepting.bind(("127.0.0.1", 0))
    accepting.listen(8)
    accepting.settimeout(0.2)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    accepted: list[Any] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(accepting.accept())
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield {"open": accepting.getsockname()[1], "silent": silent.getsockname()[1], "closed": closed,
               "accepted": accepted, "silent_socket": silent}
    finally:
        stop.set()
        t.join(2)
        accepting.close()
        silent.close()


def create(served: Served, url: str, as_output: bool) -> tuple[int, bytes, float]:
    body = ({"input": {"file": "clip.mp4"}, "outputs": [{"type": "rtmp", "url": url}]} if as_output
            else {"input": url, "outputs": [{"type": "null"}]})
    t0 = time.monotonic()
    status, _, payload = request(served, "POST", "/api/streams", body)
    return status, payload, time.monotonic() - t0


def test_every_refusal_over_the_api_is_one_answer_before_any_connection(served: Served) -> None:
    with listeners() as ports:
        urls = REFUSED_BY_DEFAULT + [
            f"rtmp://127.0.0.1:{ports['open']}/live/k", f"rtmp://127.0.0.1:{ports['silent']}/live/k",
            f"rtmp://127.0.0.1:{ports['closed']}/live/k", f"rtmp://localhost:{ports['open']}/live/k"]
        answers: dict[bool, set[bytes]] = {False: set(), True: set()}
        with contacts() as seen:
            for as_output in (False, True):
                for url in urls:
                    status, payload, took = create(served, url, as_output)
                    assert status == 403, (url, payload)
                    assert took < 2.0, (url, took)  # no connection to time out on
                    answers[as_output].add(payload)
            # Loopback itself taken out of the allowed hosts: a name that resolves to it is refused
            # with the same answer, though its port is allowed.
            served.runtime.config.runtime.allowed_hosts = ["*"]
            served.runtime.config.runtime.allowed_ports = [ports["open"]]
            for as_output in (False, True):
                status, payload, _ = create(served, f"rtmp://localhost:{ports['open']}/live/k", as_output)
                assert status == 403
                answers[as_output].add(payload)
        # One body per field, naming the field, the policy and the keys that allow a host.
        assert len(answers[False]) == 1 and len(answers[True]) == 1, answers
        assert error_of(answers[False].pop()) == f"field 'input.url': {REFUSED}"
        assert error_of(answers[True].pop()) == f"field 'outputs.0.url': {REFUSED}"
        assert "runtime.allowed_hosts" in REFUSED and "runtime.allowed_ports" in REFUSED
        # Nothing was connected to: no Python connect but the test's own to the API, no lookup but
        # `localhost`'s, and the listeners (which FFmpeg would have reached) untouched.
        api_port = int(served.url.rsplit(":", 1)[1])
        assert [s for s in seen if s[0] == "socket.connect" and s[1][1] != api_port] == []
        assert {host_of(s[1]) for s in seen if s[0] == "socket.getaddrinfo"} <= {"localhost", "127.0.0.1"}
        assert ports["accepted"] == []
        ports["silent_socket"].settimeout(0.1)
        with pytest.raises(TimeoutError):
            ports["silent_socket"].accept()  # nothing waits in its backlog either
    assert served.runtime.streams == {}


def test_ids_and_urls_with_a_trailing_newline_are_refused(served: Served) -> None:
    for body, field in (
            ({"id": "abc\n", "input": {"file": "clip.mp4"}, "outputs": [{"type": "null"}]}, "field 'id'"),
            ({"input": "rtmp://127.0.0.1/live/k\n", "outputs": [{"type": "null"}]}, "field 'input.url'"),
            ({"input": {"file": "clip.mp4"},
              "outputs": [{"type": "rtmp", "url": "rtmp://127.0.0.1/live/k\n"}]}, "field 'outputs.0.url'")):
        status, _, payload = request(served, "POST", "/api/streams", body)
        assert status == 400 and error_of(payload).startswith(field), payload
    assert served.runtime.streams == {}
    spec = StreamSpec("abc\n", InputSpec("unused.mp4"), (OutputSpec("null"),))
    with pytest.raises(StreamRequestError, match="is not valid"):
        served.call(served.runtime.add_stream(spec))


@pytest.mark.skipif(not HAVE_RTMP, reason="needs ffmpeg and nginx with libnginx-mod-rtmp")
def test_an_allowed_loopback_url_works_end_to_end(served: Served, clip: tuple[Path, list[np.ndarray]],
                                                  tmp_path: Path) -> None:
    from swapstream.live.nginx import NginxRtmp

    with NginxRtmp(tmp_path / "nginx") as nginx:
        pub = subprocess.Popen(["ffmpeg", "-hide_banner", "-loglevel", "error", "-re", "-stream_loop", "-1",
                                "-i", str(clip[0]), "-c", "copy", "-f", "flv", nginx.url("in")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            body = {"id": "lo", "input": f"rtmp://localhost:{nginx.port}/live/in", "budget_ms": 10000,
                    "outputs": [{"type": "rtmp", "url": f"rtmp://localhost:{nginx.port}/live/out"}]}
            # nginx listens on an ephemeral port: refused until the operator allows it.
            status, _, payload = request(served, "POST", "/api/streams", body)
            assert status == 403 and error_of(payload) == f"field 'input.url': {REFUSED}"
            served.runtime.config.runtime.allowed_ports = [nginx.port]
            status, _, payload = request(served, "POST", "/api/streams", body)
            assert status == 201, payload
            info = json.loads(payload)
            shown = info["input"]
            assert shown.startswith(f"rtmp://localhost:{nginx.port}/") and shown.endswith("/***"), shown
            frames = 0
            deadline = time.monotonic() + 30
            while frames < 5 and time.monotonic() < deadline:
                try:
                    with av.open(nginx.url("out"), options=rtmp_input_options(), timeout=(5, 3)) as c:
                        for _ in c.decode(video=0):
                            frames += 1
                            if frames >= 5:
                                break
                except (av.error.FFmpegError, OSError):
                    time.sleep(0.3)
            assert frames >= 5
            status, _, payload = request(served, "DELETE", "/api/streams/lo")
            assert status == 200 and json.loads(payload)["frames_out"] > 0
        finally:
            pub.terminate()
            pub.wait(5)


# -- the media folder -----------------------------------------------------------------------------


@pytest.fixture
def media(clip: tuple[Path, list[np.ndarray]], tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    """A media folder with a plain MPEG-TS file, and an HLS playlist and a concat list that name a
    file outside it (a clip whose frames are not the inside file's)."""
    folder = tmp_path / "media"
    folder.mkdir()
    outside = tmp_path / "private" / "outside.ts"
    outside.parent.mkdir()
    for src, dst in ((clip[0], outside), (clip[0], folder / "plain.ts")):
        subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-i", str(src), "-c", "copy",
                        "-f", "mpegts", str(dst)], check=True)
    (folder / "evil.m3u8").write_text("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:4\n"
                                      "#EXT-X-MEDIA-SEQUENCE:0\n#EXTINF:4.0,\n"
                                      f"{outside}\n#EXT-X-ENDLIST\n")
    (folder / "evil.ffconcat").write_text(f"ffconcat version 1.0\nfile '{outside}'\n")
    runtime = StreamRuntime(runtime_config(), devices=["cpu"])
    for s in serve_runtime(runtime, ApiSettings(TOKEN, media_root=folder)):
        yield s, outside


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")
def test_a_list_in_the_media_folder_cannot_read_outside_it(media: tuple[Served, Path]) -> None:
    served, outside = media
    assert media_file_options() == {"protocol_whitelist": "file",
                                    "format_whitelist": ",".join(MEDIA_FORMATS), "enable_drefs": "0"}
    # Without the restriction FFmpeg would read the outside file through the playlist.
    with av.open(str(served.settings.media_root / "evil.m3u8")) as c:
        assert c.format.name == "hls" and sum(1 for _ in c.decode(video=0)) > 0
    for name in ("evil.m3u8", "evil.ffconcat"):
        status, _, payload = request(served, "POST", "/api/streams",
                                     {"input": {"file": name}, "outputs": [{"type": "null"}]})
        assert status == 422, payload
        why = error_of(payload)
        assert f"live input file '{name}' is not a video file of a kind read from the media folder" in why
        assert "playlists (.m3u8) and concat lists" in why and str(outside) not in why
        with pytest.raises(InputError):
            LiveReader(str(served.settings.media_root / name), media=True).open()
    assert served.runtime.streams == {}
    status, _, payload = request(served, "POST", "/api/streams",
                                 {"id": "plain", "input": {"file": "plain.ts"},
                                  "outputs": [{"type": "null"}]})
    assert status == 201, payload
    request(served, "DELETE", "/api/streams/plain")
