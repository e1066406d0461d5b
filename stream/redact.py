"""One way to show URLs and messages without the secrets they carry: stream keys, tokens, passwords.

Stream keys travel in RTMP paths (`rtmp://host/app/KEY`), tokens in query strings (`/view?token=...`)
and headers, passwords in a URL's user part. Whatever SwapStream shows (API answers
and error fields, log lines, the console, the HTTP access log) goes through `redact_url` (one URL)
or `redact_text` (a message that may hold URLs). `RedactingFilter` applies `redact_text` to every
record of a logger it is added to, arguments and traceback included.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

# A URL inside a message: a scheme, `://`, then anything up to a space, a quote or an angle bracket
# (messages quote URLs as 'url' or "url"; FFmpeg's errors put a ':' right after them, which a
# stream key's mask swallows harmlessly).
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
# A relative path with a query (an access log's request line: `GET /view?token=abc HTTP/1.1`).
_PATH_QUERY = re.compile(r"(/[^\s?'\"<>]*)\?[^\s'\"<>]+")
# `name=value` pairs whose name says secret, wherever they stand (a query without its path, a form
# body, an FFmpeg option string). Not a bare `key=`: messages say "key=value" to explain overrides.
_SECRET_PAIR = re.compile(r"(?i)\b(token|access_token|api_token|stream_?key|passphrase|password|"
                          r"passwd|secret|signature)=([^&\s'\"<>]+)")


# The URL forms that messages teach (`give rtmp://HOST[:PORT]/APP/KEY`): placeholders, no secret.
_PLACEHOLDER_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://HOST(?:\[:PORT\]|:PORT)?"
                              r"(?:/(?:APP|KEY|PATH|NAME|STREAM|\.\.\.))*/?")


def redact_url(url: str) -> str:
    """A URL fit to show: no password or user name, no query (keys and passphrases travel there:
    `?key=...`, SRT's `passphrase=`), and for RTMP no stream key (the last part of a path of two or
    more parts). Anything that is not a URL, or is a form with placeholders only
    (`rtmp://HOST[:PORT]/APP/KEY`), is given back as it is."""
    if "://" not in url or _PLACEHOLDER_URL.fullmatch(url):
        return url
    try:
        p = urlsplit(url)
        host = p.hostname or ""
        port = p.port
    except ValueError:  # a malformed URL: show only its scheme
        return url.split("://", 1)[0] + "://" + MASK
    netloc = (MASK + "@" if p.username or p.password else "") + host + (f":{port}" if port else "")
    path = p.path
    if p.scheme.lower() in ("rtmp", "rtmps", "rtmpt", "rtmpe", "rtmpte", "rtmpts"):
        parts = path.split("/")
        named = [i for i, x in enumerate(parts) if x]
        if len(named) >= 2:
            parts[named[-1]] = MASK
        path = "/".join(parts)
    return urlunsplit((p.scheme, netloc, path, MASK if p.query else "", ""))


def redact_text(text: str) -> str:
    """`text` with every URL in it redacted (`redact_url`), every query of a relative path masked,
    and secret-looking `name=value` pairs (`token=`, `passphrase=`...) masked."""
    if not text:
        return text
    out = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    out = _PATH_QUERY.sub(lambda m: f"{m.group(1)}?{MASK}", out)
    return _SECRET_PAIR.sub(lambda m: f"{m.group(1)}={MASK}", out)


class RedactingFilter(logging.Filter):
    """Redacts a record's message (with its arguments merged in) and its traceback text in place.

    On a logger it sees only that logger's own records; on a handler, every record the handler
    writes. It never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave it for logging's own error report
            return True
        record.msg, record.args = redact_text(message), None
        if record.exc_info and not record.exc_text:
            # Formatter.format uses exc_text when set: the traceback's messages hold URLs too.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add a `RedactingFilter` to every handler of `logger` (the root logger by default), once."""
    for h in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in h.filters):
            h.addFilter(RedactingFilter())
