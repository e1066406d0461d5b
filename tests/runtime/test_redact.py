"""What the API shows of a stream's input URL: no stream key, password, user or query."""

from __future__ import annotations

import pytest

pytest.importorskip("av")  # swapstream.runtime.stream reads inputs with PyAV

from swapstream.runtime.stream import redact_url  # noqa: E402


@pytest.mark.parametrize("url,shown", [
    ("rtmp://h/live/KEY", "rtmp://h/live/***"),
    ("rtmp://h:1935/live/KEY?x=1", "rtmp://h:1935/live/***?***"),
    ("rtmp://h/live?key=abc", "rtmp://h/live?***"),          # a key in the query of a one-part path
    ("rtmps://u:p@h/app/KEY", "rtmps://***@h/app/***"),       # credentials
    ("srt://h:9000?passphrase=secret", "srt://h:9000?***"),   # SRT's passphrase
    ("http://h/a.m3u8", "http://h/a.m3u8"),
    ("clip.mp4", "clip.mp4"),
    ("rtmp://h:99999/live/KEY", "rtmp://***"),                 # malformed port: nothing but the scheme
])
def test_secrets_never_reach_the_api(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    for secret in ("KEY", "abc", "secret", "u:p"):
        if secret in url:
            assert secret not in redact_url(url)


@pytest.mark.parametrize("text,shown", [
    ("cannot open live input 'rtmp://h:1935/live/KEY': [Errno 5] I/O error: 'rtmp://h/live/KEY'",
     "cannot open live input 'rtmp://h:1935/live/***': [Errno 5] I/O error: 'rtmp://h/live/***'"),
    ('GET /view?token=KEY&bg=x HTTP/1.1', 'GET /view?*** HTTP/1.1'),    # an access log's request line
    ('"http://127.0.0.1:8080/view?token=KEY"', '"http://127.0.0.1:8080/view?***"'),  # a Referer
    ("passphrase=KEY streamid=x", "passphrase=*** streamid=x"),
    ("override 'a' must look like key=value, e.g. mesh.keep_eyes=true",  # config help stays readable
     "override 'a' must look like key=value, e.g. mesh.keep_eyes=true"),
    ("input 'clip.mp4' ended", "input 'clip.mp4' ended"),
])
def test_messages_lose_their_secrets_and_keep_the_rest(text: str, shown: str) -> None:
    from swapstream.redact import redact_text

    assert redact_text(text) == shown


def test_the_log_filter_redacts_arguments_and_tracebacks() -> None:
    import logging

    from swapstream.redact import RedactingFilter

    try:
        raise OSError("connection to 'rtmp://h/live/KEY' refused")
    except OSError:
        import sys

        record = logging.LogRecord("x", logging.WARNING, __file__, 1, "live input '%s' dropped",
                                   ("rtmp://h/live/KEY",), sys.exc_info())
    assert RedactingFilter().filter(record)
    text = logging.Formatter().format(record)
    assert "KEY" not in text and "live input 'rtmp://h/live/***' dropped" in text
    assert "connection to 'rtmp://h/live/***' refused" in text
