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
