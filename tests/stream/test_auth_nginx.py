"""The RTMP side's guards: the stream-key check nginx calls on every publish (`live/auth.py`), asked
over real HTTP on loopback, and the nginx.conf builder (`live/nginx.py`), which writes no value it
has not checked."""

from __future__ import annotations

import http.client
import time
import urllib.parse
from pathlib import Path

import pytest

from swapstream.errors import ConfigError
from swapstream.live.auth import REFUSED_KEPT, REFUSED_KEY_CHARS, StreamKeyAuth, check_publish
from swapstream.live.nginx import nginx_rtmp_config

# -- the stream-key check -------------------------------------------------------------------------


def on_publish(auth: StreamKeyAuth, body: bytes, headers: dict[str, str] | None = None) -> int:
    """POST `body` as nginx-rtmp's on_publish does; the HTTP status."""
    c = http.client.HTTPConnection(auth.host, auth.port, timeout=10)
    try:
        c.request("POST", "/on_publish", body=body, headers={
            "Content-Type": "application/x-www-form-urlencoded", **(headers or {})})
        return c.getresponse().status
    finally:
        c.close()


def form(**fields: str) -> bytes:
    """nginx-rtmp's form for a publish to `live` (its fields as nginx sends them), with changes."""
    base = {"call": "publish", "addr": "127.0.0.1", "clientid": "1", "app": "live",
            "flashver": "FMLE/3.0", "swfurl": "", "tcurl": "rtmp://127.0.0.1:1935/live",
            "pageurl": "", "name": "in", "type": "live"}
    return urllib.parse.urlencode(base | fields).encode()


@pytest.fixture(scope="module")
def auth() -> StreamKeyAuth:
    with StreamKeyAuth({"in", "out"}) as a:
        yield a


def test_a_publish_with_an_allowed_key_to_the_app_is_accepted(auth: StreamKeyAuth) -> None:
    assert on_publish(auth, form()) == 200
    assert on_publish(auth, form(name="out")) == 200


@pytest.mark.parametrize("body", [
    form(name="nope"),                                        # a wrong key
    form(name="in "),                                         # near misses are wrong keys too
    form(name=""),
    form(call="play"),                                        # a player, not a publisher
    form(call="update"),
    form(app="other"),                                        # the right key for another application
    form(app="live/x"),
    urllib.parse.urlencode({"app": "live", "name": "in"}).encode(),  # no call at all
    urllib.parse.urlencode({"call": "publish", "name": "in"}).encode(),  # no app
    form() + b"&name=nope",                                   # the key field twice
    b"call=publish&app=live&name=%D0%BA%D0%BB%D1%8E%D1%87",   # a UTF-8 key that is not ASCII
    b"call=publish&app=live&name=%FF%FEin",                   # bytes that are not UTF-8
    b"call=publish&app=live&name=\xff\xfe",                   # the same, unescaped
    b"\x00\x01\x02 not a form",
])
def test_everything_else_is_refused_quietly(auth: StreamKeyAuth, body: bytes) -> None:
    # A 403 in every case: before, a non-ASCII key raised in the handler (the connection dropped
    # without an answer), and neither `call` nor `app` was looked at.
    assert on_publish(auth, body) == 403


def test_requests_that_are_not_a_sane_form_get_a_4xx(auth: StreamKeyAuth) -> None:
    assert on_publish(auth, b"x", headers={"Content-Length": "-1"}) == 400
    assert on_publish(auth, b"x", headers={"Content-Length": "ten"}) == 400
    assert on_publish(auth, b"x" * 9000) == 413
    # The server is still there after each of them.
    assert on_publish(auth, form()) == 200


def test_the_record_of_refused_keys_is_bounded() -> None:
    with StreamKeyAuth({"in"}) as a:
        for i in range(REFUSED_KEPT + 50):
            assert on_publish(a, form(name=f"wrong-{i}-" + "k" * 100)) == 403
        deadline = time.monotonic() + 10
        while a.refused_total < REFUSED_KEPT + 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = a.refused
        assert a.refused_total == REFUSED_KEPT + 50
        assert len(refused) == REFUSED_KEPT  # the rest were counted, not kept
        assert all(len(k) == REFUSED_KEY_CHARS for k in refused)
        assert refused[0] == f"wrong-0-{'k' * 100}"[:REFUSED_KEY_CHARS]


def test_check_publish_compares_bytes() -> None:
    keys = [b"in"]
    assert check_publish({"call": ["publish"], "app": ["live"], "name": ["in"]}, keys, "live")
    # A str comparison of a non-ASCII key raised TypeError in hmac.compare_digest.
    assert not check_publish({"call": ["publish"], "app": ["live"], "name": ["ключ"]}, keys, "live")
    assert not check_publish({"call": ["publish"], "app": ["live"], "name": ["\udcff"]}, keys, "live")


@pytest.mark.parametrize("keys, app, message", [
    (set(), "live", "needs at least one key"),
    ({"in", ""}, "live", "no empty key"),
    ({"in"}, "li ve", "the RTMP application name 'li ve' is not valid"),
])
def test_the_check_refuses_a_setup_that_would_let_anyone_in(keys: set[str], app: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StreamKeyAuth(keys, app=app)


# -- nginx.conf -----------------------------------------------------------------------------------


def test_the_config_is_written_from_checked_values() -> None:
    conf = nginx_rtmp_config(rtmp_port=1935, prefix=Path("/tmp/pytest-of-x/nginx_0"), app="live-2_b",
                             auth_url="http://127.0.0.1:8081/on_publish?app=live&x=1",
                             module_path="/usr/lib/nginx/modules/ngx_rtmp_module.so", user="www-data")
    assert conf == (
        "load_module /usr/lib/nginx/modules/ngx_rtmp_module.so;\n"
        "user www-data;\n"
        "daemon off;\n"
        "master_process off;\n"
        "pid /tmp/pytest-of-x/nginx_0/nginx.pid;\n"
        "error_log /tmp/pytest-of-x/nginx_0/error.log info;\n"
        "events { worker_connections 256; }\n"
        "rtmp {\n"
        "    access_log off;\n"
        "    server {\n"
        "        listen 127.0.0.1:1935;\n"
        "        chunk_size 4096;\n"
        "        application live-2_b {\n"
        "            live on;\n"
        "            record off;\n"
        "            on_publish http://127.0.0.1:8081/on_publish?app=live&x=1;\n"
        "        }\n"
        "    }\n"
        "}\n")


PATH_RULE = ("an absolute path of letters, digits and . _ / + @ % , = : ~ - (no spaces, quotes, ';', "
             "braces, '#', '$' or '\\')")
URL_RULE = ("an http:// or https:// URL with a host, an optional port and a path without spaces, quotes, "
            "';', braces, '#', '$' or '\\'")


@pytest.mark.parametrize("change, message", [
    ({"app": "live; }\nrtmp_auto_push on; application x {"},
     "the RTMP application name 'live; }\\nrtmp_auto_push on; application x {' cannot go into nginx.conf: "
     "it must be 1-64 letters, digits, '_' or '-'"),
    ({"app": ""}, "the RTMP application name '' cannot go into nginx.conf: it must be 1-64 letters, "
                  "digits, '_' or '-'"),
    ({"app": "a" * 65}, f"the RTMP application name '{'a' * 65}' cannot go into nginx.conf: it must be "
                        f"1-64 letters, digits, '_' or '-'"),
    ({"app": "live\n"}, "the RTMP application name 'live\\n' cannot go into nginx.conf: it must be 1-64 "
                        "letters, digits, '_' or '-'"),
    ({"prefix": Path("/tmp/a b")}, f"the nginx prefix folder '/tmp/a b' cannot go into nginx.conf: it must "
                                   f"be {PATH_RULE}"),
    ({"prefix": Path("/tmp/x;load_module /evil.so")},
     f"the nginx prefix folder '/tmp/x;load_module /evil.so' cannot go into nginx.conf: it must be "
     f"{PATH_RULE}"),
    ({"prefix": Path("relative/dir")}, f"the nginx prefix folder 'relative/dir' cannot go into nginx.conf: "
                                       f"it must be {PATH_RULE}"),
    ({"prefix": Path("/tmp/$x")}, f"the nginx prefix folder '/tmp/$x' cannot go into nginx.conf: it must be "
                                  f"{PATH_RULE}"),
    ({"prefix": Path("/tmp/{x}")}, f"the nginx prefix folder '/tmp/{{x}}' cannot go into nginx.conf: it must "
                                   f"be {PATH_RULE}"),
    ({"auth_url": "http://127.0.0.1/on_publish; on_play http://evil/"},
     f"the on_publish URL 'http://127.0.0.1/on_publish; on_play http://evil/' cannot go into nginx.conf: "
     f"it must be {URL_RULE}"),
    ({"auth_url": "http://h/x'y"}, f"the on_publish URL \"http://h/x'y\" cannot go into nginx.conf: it must "
                                   f"be {URL_RULE}"),
    ({"auth_url": "http://h/x\n"}, f"the on_publish URL 'http://h/x\\n' cannot go into nginx.conf: it must "
                                   f"be {URL_RULE}"),
    ({"auth_url": "file:///etc/passwd"}, f"the on_publish URL 'file:///etc/passwd' cannot go into "
                                         f"nginx.conf: it must be {URL_RULE}"),
    ({"auth_url": "http://h#x"}, f"the on_publish URL 'http://h#x' cannot go into nginx.conf: it must be "
                                 f"{URL_RULE}"),
    ({"module_path": "/m.so;\nuser root"}, f"the RTMP module path '/m.so;\\nuser root' cannot go into "
                                           f"nginx.conf: it must be {PATH_RULE}"),
    ({"user": "root; daemon on"}, "the nginx user 'root; daemon on' cannot go into nginx.conf: it must be a "
                                  "user name of letters, digits, '_', '.' or '-'"),
    ({"rtmp_port": 0}, "the RTMP port 0 cannot go into nginx.conf: it must be a whole number from 1 to 65535"),
    ({"rtmp_port": 65536}, "the RTMP port 65536 cannot go into nginx.conf: it must be a whole number from 1 "
                           "to 65535"),
    ({"rtmp_port": "1935;"}, "the RTMP port '1935;' cannot go into nginx.conf: it must be a whole number "
                             "from 1 to 65535"),
])
def test_a_value_that_would_break_out_of_its_directive_is_refused(change: dict[str, object],
                                                                 message: str) -> None:
    args: dict[str, object] = {"rtmp_port": 1935, "prefix": Path("/tmp/nginx"), "app": "live",
                               "auth_url": "http://127.0.0.1:8081/on_publish"} | change
    with pytest.raises(ConfigError) as e:
        nginx_rtmp_config(**args)  # type: ignore[arg-type]
    assert str(e.value) == message
