"""Finding, downloading and verifying the zoo's model files.

A model file is looked for first in the models folder (files placed by hand on offline machines,
`--models-dir`), then in the download cache. Downloads go to the cache only, so that a folder the user
curates is never written to, except for a missing `.hash` sibling that we fetched for them.

Every file is checked against FaceFusion's `.hash` sibling (CRC32, 8 hex digits). A download that fails
the check is deleted, as FaceFusion does: keeping it would only fail again on every start. Downloads
resume from `FILE.part` with an HTTP Range request, because these files are up to 550 MB and home
connections drop. HTTP uses only `urllib.request`: one download path needs no new dependency.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from .filelock import exclusive
from .paths import cache_dir
from .builtin import default_models_dir
from .errors import EngineUserError, ModelMissingError
from .zoo import ASSETS_BASE_URL, MODELS, ModelSpec, crc32_file, get_spec, parse_hash

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "SWAPSTREAM_CACHE_DIR"
"""Environment variable naming the download cache folder."""
BASE_URL_ENV = "SWAPSTREAM_ZOO_URL"
"""Environment variable naming a mirror of facefusion-assets (`{url}/{release}/{file}`)."""
LICENCES_FILE = "licences.json"
"""Name of the file in the cache folder that records accepted licences."""

Status = Literal["ok", "missing", "corrupt", "unverified"]
Listing = list[tuple[ModelSpec, Path | None, Status]]
Progress = Callable[[int, int], None]

_CHUNK = 1 << 16
_USER_AGENT = "swapstream-model-download (python-urllib)"
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class ModelCorruptError(EngineUserError, ValueError):
    """A model file fails its CRC32 check."""


class LicenceNotAcceptedError(EngineUserError, PermissionError):
    """The user has not accepted a model's licence, so it was not downloaded."""


class DownloadError(EngineUserError, ConnectionError):
    """A download failed (HTTP error, timeout, dropped connection); the message names the URL."""


class _Dropped(Exception):
    """The body ended early; what arrived is kept in the `.part` file for the next attempt."""


def default_cache_dir() -> Path:
    """`$SWAPSTREAM_CACHE_DIR`, else `$XDG_CACHE_HOME/swapstream/zoo` (~/.cache by default)."""
    return cache_dir(CACHE_DIR_ENV, "zoo")


def licence_notice(spec: ModelSpec) -> str:
    """The text shown before a model's first download."""
    return (f"{spec.file} ({spec.kind}, from facefusion-assets {spec.release}) is licensed: "
            f"{spec.licence}. Use it only as that licence allows.")


def _write_atomic(path: Path, data: bytes) -> None:
    # A crash mid-write must never leave a half file that a later run would trust. Not mkstemp: its
    # 0600 mode would hide a shared models folder's .hash files from other users.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _one_line(reason: object) -> str:
    text = " ".join(str(reason).split())
    return text or type(reason).__name__


class ModelStore:
    """Where the zoo's files are, and how to get and check them.

    `base_url` (default `$SWAPSTREAM_ZOO_URL`, else GitHub) replaces the facefusion-assets download base;
    `offline=True` never opens a connection. Nothing here is shared between instances except the files.
    """

    def __init__(self, models_dir: Path | None = None, *, cache_dir: Path | None = None,
                 offline: bool = False, base_url: str | None = None, timeout: float = 30.0,
                 retries: int = 3) -> None:
        self.models_dir = Path(models_dir) if models_dir is not None else default_models_dir()
        """Folder with files placed by hand; looked in first, never downloaded into."""
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        """Folder that downloads go to."""
        self.offline = offline
        """Never touch the network: only files already present count."""
        self.base_url = (base_url or os.environ.get(BASE_URL_ENV) or ASSETS_BASE_URL).rstrip("/")
        """Download base: `{base_url}/{release}/{file}`."""
        self.timeout = timeout
        """Seconds to wait for a connection or for the next bytes of a response."""
        self.retries = retries
        """How many times one `download` call resumes after a dropped connection before giving up."""
        # CRC32 of a 500 MB file takes a while; remember it per (path, size, mtime) for this instance.
        self._crc_memo: dict[tuple[str, int, int], str] = {}

    # ---------------------------------------------------------------------------------------- lookup

    def url(self, name: str) -> str:
        """The URL this store downloads `name` from."""
        return get_spec(name).url_for(self.base_url)

    def hash_url(self, name: str) -> str:
        """The URL of `name`'s `.hash` under this store's base."""
        return get_spec(name).hash_url_for(self.base_url)

    def find(self, name: str) -> Path | None:
        """Where the file of `name` is, unverified: the models folder first, then the cache."""
        spec = get_spec(name)
        for folder in (self.models_dir, self.cache_dir):
            candidate = folder / spec.file
            if candidate.is_file():
                return candidate
        return None

    def status(self, name: str) -> tuple[Path | None, Status]:
        """Where `name` is and whether its CRC32 matches (`unverified`: offline, with no `.hash` beside it)."""
        path, status, _expected, _actual = self._check(get_spec(name))
        return path, status

    def path(self, name: str) -> Path:
        """The verified file of `name`, else an error whose one line says what to do."""
        spec = get_spec(name)
        path, status, expected, actual = self._check(spec)
        if status == "ok":
            assert path is not None
            return path
        if status == "missing" or path is None:
            raise ModelMissingError(self._missing_message(spec))
        if status == "unverified":
            raise ModelMissingError(
                f"'{path}' has no '{spec.hash_file}' beside it, so it cannot be verified offline: put "
                f"{self.hash_url(name)} (its CRC32) in '{path.parent}', or run once without --offline")
        raise ModelCorruptError(self._corrupt_message(spec, path, expected, actual))

    def verify(self, name: str) -> bool:
        """Whether the file of `name` is present and matches its `.hash` (kept, or fetched if online)."""
        return self.status(name)[1] == "ok"

    def list(self) -> Listing:
        """Every zoo model with where it was found and its status."""
        rows: Listing = []
        for spec in MODELS.values():
            try:
                path, status, _e, _a = self._check(spec)
            except DownloadError as exc:
                # A listing must not die of one unreachable .hash: that file just stays unverified.
                log.warning("%s", exc)
                path, status = self.find(spec.name), "unverified"
            rows.append((spec, path, status))
        return rows

    # -------------------------------------------------------------------------------------- licences

    def licence_accepted(self, name: str) -> bool:
        """Whether the user accepted `name`'s current licence text before."""
        spec = get_spec(name)
        return self._accepted_licences().get(spec.name) == spec.licence

    def _licences_path(self) -> Path:
        return self.cache_dir / LICENCES_FILE

    def _accepted_licences(self) -> dict[str, str]:
        try:
            data = json.loads(self._licences_path().read_text())
        except (OSError, ValueError):
            return {}  # none recorded yet, or unreadable: asking again is the safe side
        accepted = data.get("accepted") if isinstance(data, dict) else None
        return {str(k): str(v) for k, v in accepted.items()} if isinstance(accepted, dict) else {}

    def _remember_licence(self, spec: ModelSpec) -> None:
        accepted = self._accepted_licences()
        # Keyed by the licence text too: if a licence changes, the user is asked again.
        accepted[spec.name] = spec.licence
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(self._licences_path(),
                      json.dumps({"accepted": accepted}, indent=2, sort_keys=True).encode() + b"\n")

    # -------------------------------------------------------------------------------------- download

    def download(self, name: str, *, accept_licence: bool = False, progress: Progress | None = None,
                 confirm: Callable[[str], bool] | None = None) -> Path:
        """Make sure `name` is present and verified, downloading it into the cache if it is not.

        Before a model's first download its licence is shown through `confirm(text)`, unless
        `accept_licence` is true (for non-interactive callers); without either the download is refused.
        `progress(done, total)` gets byte counts (total 0 when the server does not say).
        """
        spec = get_spec(name)
        path, status, expected, actual = self._check(spec)
        if status == "ok":
            assert path is not None
            return path
        if path is not None and status == "corrupt" and not self._in_cache(path):
            # A file the user placed: replacing it behind their back would hide a real problem.
            raise ModelCorruptError(self._corrupt_message(spec, path, expected, actual))
        if self.offline:
            if path is not None and status == "unverified":
                self.path(name)  # raises the error that asks for the .hash
            raise ModelMissingError(self._missing_message(spec) + " (offline: nothing was downloaded)")

        if not self.licence_accepted(name):
            notice = licence_notice(spec)
            if not accept_licence and not (confirm is not None and confirm(notice)):
                raise LicenceNotAcceptedError(
                    f"licence of '{name}' not accepted, nothing downloaded. {notice} To accept it, "
                    f"answer yes when asked, or pass --accept-licence")
            self._remember_licence(spec)

        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with exclusive(self.cache_dir / ".download.lock"):
            return self._download_locked(spec, progress)

    def _download_locked(self, spec: ModelSpec, progress: Progress | None) -> Path:
        url, hash_url = spec.url_for(self.base_url), spec.hash_url_for(self.base_url)
        expected = self._fetch_hash(spec)
        dest = self.cache_dir / spec.file
        if dest.is_file():
            # Another process finished it while we waited for the lock, or its .hash was lost.
            if self._crc(dest) == expected:
                _write_atomic(dest.with_name(spec.hash_file), expected.encode() + b"\n")
                return dest
            log.warning("deleting '%s': it fails its CRC32 check", dest)
            dest.unlink()
        part = dest.with_name(spec.file + ".part")
        resumed_whole = self._fetch_to_part(url, part, progress)
        actual = crc32_file(part)
        if actual != expected and resumed_whole:
            # The server said the .part was already whole (416), yet it is wrong: fetch it afresh once.
            part.unlink()
            self._fetch_to_part(url, part, progress)
            actual = crc32_file(part)
        if actual != expected:
            part.unlink(missing_ok=True)
            raise ModelCorruptError(
                f"'{spec.file}' downloaded from {url} fails its CRC32 check (expected {expected} from "
                f"{hash_url}, got {actual}) and was deleted; try again, and if it fails again the "
                f"server is sending a different file")
        # The .hash goes first: a model without its .hash could not be verified offline later.
        _write_atomic(dest.with_name(spec.hash_file), expected.encode() + b"\n")
        os.replace(part, dest)
        return dest

    def _fetch_to_part(self, url: str, part: Path, progress: Progress | None) -> bool:
        """Fill `part` with the whole body of `url`, resuming; True if the server said it was already whole."""
        attempt = 0
        while True:
            try:
                return self._fetch_once(url, part, progress)
            except _Dropped as exc:
                have = part.stat().st_size if part.exists() else 0
                if attempt >= self.retries:
                    raise DownloadError(
                        f"download of {url} broke off ({exc}) after {attempt + 1} attempts; "
                        f"{have} bytes are kept in '{part}' and the next run resumes from there") from None
                attempt += 1
                log.info("connection to %s dropped (%s); resuming from byte %d", url, exc, have)

    def _fetch_once(self, url: str, part: Path, progress: Progress | None) -> bool:
        start = part.stat().st_size if part.exists() else 0
        headers = {"User-Agent": _USER_AGENT}
        if start:
            headers["Range"] = f"bytes={start}-"
        try:
            resp = self._open(url, headers)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and start:
                exc.close()
                return True  # nothing left to send: the .part is whole (the CRC check decides)
            raise self._http_error(url, exc) from None
        with resp:
            total = 0
            length = resp.headers.get("Content-Length")
            if resp.status == 206 and start:
                m = _CONTENT_RANGE.fullmatch((resp.headers.get("Content-Range") or "").strip())
                if m is None or int(m.group(1)) != start:
                    part.unlink()  # a range we did not ask for: start again from byte 0
                    raise _Dropped(f"server answered Range bytes={start}- with "
                                   f"'{resp.headers.get('Content-Range')}'")
                total = int(m.group(3)) if m.group(3) != "*" else 0
                mode = "ab"
            elif resp.status == 200:
                # No Range asked, or the server ignored it and sends the whole file: appending would
                # duplicate the head, so start over.
                start, mode = 0, "wb"
                total = int(length) if length and length.isdigit() else 0
            else:
                raise DownloadError(f"unexpected HTTP {resp.status} {resp.reason} from {url}")
            done = start
            with open(part, mode) as f:
                if progress is not None:
                    progress(done, total)
                while True:
                    try:
                        chunk = resp.read(_CHUNK)
                    except (OSError, http.client.HTTPException) as exc:  # includes timeouts
                        raise _Dropped(_one_line(exc) or "read failed") from None
                    if not chunk:
                        break
                    f.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done, total)
            # http.client returns b"" rather than raising when a body ends before its Content-Length.
            if total and done < total:
                raise _Dropped(f"got {done} of {total} bytes")
        return False

    def _fetch_hash(self, spec: ModelSpec) -> str:
        url = spec.hash_url_for(self.base_url)
        try:
            with self._open(url, {"User-Agent": _USER_AGENT}) as resp:
                body = resp.read(256)
        except urllib.error.HTTPError as exc:
            raise self._http_error(url, exc) from None
        except (OSError, http.client.HTTPException) as exc:
            raise DownloadError(f"reading {url} failed: {_one_line(exc)}") from None
        value = parse_hash(body.decode("ascii", errors="replace"))
        if value is None:
            raise DownloadError(f"{url} does not hold a CRC32 (8 hex digits): got {body[:40]!r}")
        return value

    def _open(self, url: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        """urlopen with our timeout; connection failures become one-line DownloadErrors naming the URL."""
        req = urllib.request.Request(url, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)  # type: ignore[no-any-return]
        except urllib.error.HTTPError:
            raise
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise DownloadError(f"timed out after {self.timeout:g} s connecting to {url}") from None
            raise DownloadError(f"cannot reach {url}: {_one_line(exc.reason)}") from None
        except TimeoutError:
            raise DownloadError(f"timed out after {self.timeout:g} s waiting for {url}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise DownloadError(f"request to {url} failed: {_one_line(exc)}") from None

    @staticmethod
    def _http_error(url: str, exc: urllib.error.HTTPError) -> DownloadError:
        exc.close()
        hint = "; the model may have moved to another release, or set --offline and place it by hand" \
            if exc.code == 404 else ""
        return DownloadError(f"HTTP {exc.code} {_one_line(exc.reason)} from {url}{hint}")

    # -------------------------------------------------------------------------------------- checking

    def _check(self, spec: ModelSpec) -> tuple[Path | None, Status, str | None, str | None]:
        """(path, status, expected CRC32, actual CRC32) of the file that `find` picks."""
        path = self.find(spec.name)
        if path is None:
            return None, "missing", None, None
        expected = self._expected_hash(spec, path)
        if expected is None:
            return path, "unverified", None, None
        actual = self._crc(path)
        return path, ("ok" if actual == expected else "corrupt"), expected, actual

    def _expected_hash(self, spec: ModelSpec, path: Path) -> str | None:
        sibling = path.with_name(spec.hash_file)
        try:
            kept = parse_hash(sibling.read_text(errors="replace"))
        except OSError:
            kept = None
        if kept is not None or self.offline:
            return kept
        fetched = self._fetch_hash(spec)
        try:
            _write_atomic(sibling, fetched.encode() + b"\n")  # so that the next offline run can verify
        except OSError as exc:  # a read-only models folder is fine: we just fetch it again next time
            log.debug("cannot save '%s': %s", sibling, exc)
        return fetched

    def _crc(self, path: Path) -> str:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._crc_memo:
            self._crc_memo[key] = crc32_file(path)
        return self._crc_memo[key]

    def _in_cache(self, path: Path) -> bool:
        return path.parent.resolve() == self.cache_dir.resolve()

    def _missing_message(self, spec: ModelSpec) -> str:
        return (f"model '{spec.name}' ({spec.file}) is in neither '{self.models_dir}' nor "
                f"'{self.cache_dir}': run `swapstream models download {spec.name}`, or download "
                f"{spec.url_for(self.base_url)} and {spec.hash_url_for(self.base_url)} and put both "
                f"in '{self.models_dir}'")

    def _corrupt_message(self, spec: ModelSpec, path: Path, expected: str | None,
                         actual: str | None) -> str:
        fix = (f"run `swapstream models download {spec.name}` to fetch it again" if self._in_cache(path)
               else f"replace it with {spec.url_for(self.base_url)}, or delete it")
        return f"'{path}' fails its CRC32 check (expected {expected}, got {actual}): {fix}"
