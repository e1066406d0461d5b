"""Consent records for source faces: who agreed, when, for what, and which picture.

A source face is used only when a record matches its picture. Records are kept in a local JSON file
(the store) and made with `swapstream consent add` or `ConsentStore.add`; a job without one stops with
a `ConsentError` whose one line says how to make it. The demo portraits are public domain and come
with built-in records (`assets/consent_builtin.json`), so the demo and the tests need no setup.

A record names its picture by the SHA-256 of the decoded pixels (`image_digest`): the same picture
matches whether it arrives as a file, as a re-saved lossless copy, or as an array through the API.
When it was recorded from a file, the file's own SHA-256 is kept too and also matches that file.

Store location, first that applies: the `--store` option of `swapstream consent`, the config key
`consent.store`, `$SWAPSTREAM_CONSENT_STORE`, `$XDG_DATA_HOME/swapstream/consent.json`,
`~/.local/share/swapstream/consent.json`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .engines.filelock import exclusive
from .errors import ConsentError, InputError

FORMAT = "swapstream-consent-v1"
BUILTIN_PATH = Path(__file__).resolve().parent / "assets" / "consent_builtin.json"
ENV_STORE = "SWAPSTREAM_CONSENT_STORE"


def image_digest(image: np.ndarray) -> str:
    """SHA-256 of an (H, W, 3) uint8 RGB picture's pixels, with its size in the hashed header, so
    that two pictures with the same bytes in a different shape differ."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"image must be HxWx3 uint8 RGB, got shape {tuple(image.shape)} {image.dtype}")
    h = hashlib.sha256(f"swapstream-rgb8:{image.shape[0]}x{image.shape[1]}:".encode())
    h.update(np.ascontiguousarray(image).tobytes())
    return h.hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class ConsentRecord:
    """One person's consent to the use of one picture of their face."""

    id: str
    """Short id for `swapstream consent remove`."""
    given_by: str
    """Who gave consent (the person shown, or who may consent for them)."""
    given_at: str
    """When consent was given (ISO 8601: a date, or a date and time)."""
    purpose: str
    """What it was given for."""
    image_sha256: str
    """SHA-256 of the decoded picture (`image_digest`)."""
    file_sha256: str | None = None
    """SHA-256 of the file it was recorded from, if any."""
    source: str | None = None
    """Name of that file, for people reading the store."""
    recorded_at: str = ""
    """When the record was made (UTC, ISO 8601)."""
    builtin: bool = False
    """Shipped with SwapStream (the public-domain demo portraits); cannot be removed."""

    def matches(self, image_sha256: str, file_sha256: str | None) -> bool:
        return self.image_sha256 == image_sha256 or (file_sha256 is not None
                                                     and self.file_sha256 == file_sha256)

    def summary(self) -> str:
        """One line for the run's log."""
        return (f"record {self.id}: given by {self.given_by} on {self.given_at} for "
                f"\"{self.purpose}\" (image sha256 {self.image_sha256[:12]})")

    @classmethod
    def from_dict(cls, d: Any) -> "ConsentRecord":
        """The record in a JSON object; a ValueError that says what is wrong with it otherwise."""
        if not isinstance(d, dict):
            raise ValueError(f"a record is a JSON object, not {type(d).__name__}")
        missing = [k for k in ("id", "given_by", "given_at", "purpose", "image_sha256") if k not in d]
        if missing:
            raise ValueError(f"it has no {', '.join(missing)}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in set(d) - fields)
        if unknown:
            raise ValueError(f"it has unknown fields {', '.join(unknown)}")
        for k, v in d.items():
            if k == "builtin":
                ok = isinstance(v, bool)
            else:   # every other field is text; the file's hash and name may be null
                ok = isinstance(v, str) or (v is None and k in ("file_sha256", "source"))
            if not ok:
                raise ValueError(f"its {k} is {v!r}, not {'true or false' if k == 'builtin' else 'text'}")
        return cls(**d)


def default_store_path() -> Path:
    """$SWAPSTREAM_CONSENT_STORE, else the user data folder's swapstream/consent.json."""
    env = os.environ.get(ENV_STORE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "swapstream" / "consent.json"


def _check_date(value: str) -> str:
    """The consent date in its normal ISO 8601 form: YYYY-MM-DD for a date, YYYY-MM-DDTHH:MM:SS
    (with its UTC offset, if given) for a date and time. All of the value must parse: what is not a
    date is refused rather than stored as given."""
    try:
        when: dt.date = dt.date.fromisoformat(value)
        normal = when.isoformat()
    except ValueError:
        try:
            moment = dt.datetime.fromisoformat(value)
        except ValueError:
            raise InputError(f"consent date (--date) {value!r} is not a date: use YYYY-MM-DD, or a date "
                             f"and time such as 2026-01-31T14:30") from None
        when, normal = moment.date(), moment.isoformat(timespec="seconds")
    if when > dt.date.today() + dt.timedelta(days=1):   # a day of slack for time zones
        raise InputError(f"consent date (--date) {value!r} is in the future: give the day consent "
                         f"was given")
    return normal


class ConsentStore:
    """The records in one JSON file, plus the built-in ones. Each call reads the file afresh, so two
    processes (a `consent add` while a server runs) see each other's changes; writes replace the
    file atomically under a lock."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 choose_with: str = "--set consent.store=PATH") -> None:
        self.path = Path(path).expanduser() if path is not None else default_store_path()
        self.choose_with = choose_with
        """How the user of this store points to another, for its error messages: the config key
        for run/live/serve, the `--store` option for `swapstream consent`."""

    @classmethod
    def for_config(cls, config: Any) -> "ConsentStore":
        return cls(config.consent.store)

    # -- reading -----------------------------------------------------------------------------------

    def builtin_records(self) -> list[ConsentRecord]:
        data = json.loads(BUILTIN_PATH.read_text())
        # A malformed built-in record is our bug, not the user's: its ValueError keeps its traceback.
        return [ConsentRecord.from_dict({**r, "builtin": True}) for r in data["records"]]

    def user_records(self) -> list[ConsentRecord]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConsentError(f"cannot read the consent store '{self.path}': {e}. Fix the file, or "
                               f"point to another with {self.choose_with}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or \
                not isinstance(data.get("records"), list):
            raise ConsentError(f"'{self.path}' is not a SwapStream consent store (format {FORMAT}). "
                               f"Point to another with {self.choose_with}")
        records = []
        for i, r in enumerate(data["records"]):
            try:
                records.append(ConsentRecord.from_dict(r))
            except ValueError as e:
                shown = repr(r) if len(repr(r)) <= 80 else repr(r)[:77] + "..."
                raise ConsentError(
                    f"consent store '{self.path}' has a malformed record (number {i + 1}, {shown}): "
                    f"{e}. Repair or delete that record in the file, or remove the file (its records "
                    f"are lost), or point to another store with {self.choose_with}") from None
        return records

    def records(self) -> list[ConsentRecord]:
        """Built-in records first, then the store's, in the order they were added."""
        return self.builtin_records() + self.user_records()

    def find(self, image_sha256: str, file_sha256: str | None = None) -> ConsentRecord | None:
        """The most recent record that matches the picture (or its file)."""
        found = [r for r in self.records() if r.matches(image_sha256, file_sha256)]
        return found[-1] if found else None

    def require(self, image: np.ndarray, name: str,
                path: str | os.PathLike[str] | None = None) -> ConsentRecord:
        """The record that allows using `image` (from the file `path`, if any), or a ConsentError
        whose message says how to make one."""
        digest = image_digest(image)
        record = self.find(digest, file_digest(path) if path is not None else None)
        if record is not None:
            return record
        target = f"'{path}'" if path is not None else "IMAGE"
        raise ConsentError(
            f"no consent record for the face in {name if path is None else repr(str(path))} "
            f"(image sha256 {digest[:12]}). A face is used only with the consent of the person "
            f"shown: record it first with `swapstream consent add {target} --by \"NAME\" "
            f"--purpose \"WHAT FOR\" [--date YYYY-MM-DD]` (store: {self.path})")

    # -- writing -----------------------------------------------------------------------------------

    def _unusable(self, doing: str, path: Path, e: OSError) -> ConsentError:
        return ConsentError(f"cannot {doing} '{path}' for the consent store '{self.path}': "
                            f"{e.strerror or e}. Choose a store in a folder you can write with "
                            f"{self.choose_with}")

    def _write(self, records: list[ConsentRecord]) -> None:
        body = {"format": FORMAT, "records": [
            {k: v for k, v in dataclasses.asdict(r).items() if k != "builtin"} for r in records]}
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".consent-", suffix=".json")
        except OSError as e:
            raise self._unusable("write in", self.path.parent, e) from None
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(body, f, indent=2)
                f.write("\n")
            os.replace(tmp, self.path)
        except OSError as e:
            Path(tmp).unlink(missing_ok=True)
            raise self._unusable("write", self.path, e) from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the store's lock file (next to it) for a read-modify-write."""
        lock = self.path.with_name(self.path.name + ".lock")
        with ExitStack() as stack:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise self._unusable("create the folder", self.path.parent, e) from None
            try:
                stack.enter_context(exclusive(lock))
            except OSError as e:
                raise self._unusable("lock", lock, e) from None
            yield

    def add(self, image: np.ndarray, *, given_by: str, purpose: str, given_at: str | None = None,
            path: str | os.PathLike[str] | None = None) -> ConsentRecord:
        """Record consent for `image` (read from `path`, if it came from a file)."""
        given_by, purpose = given_by.strip(), purpose.strip()
        if not given_by:
            raise InputError("consent needs the name of who gave it: --by \"NAME\"")
        if not purpose:
            raise InputError("consent needs what it was given for: --purpose \"WHAT FOR\"")
        when = _check_date(given_at.strip() if given_at else dt.date.today().isoformat())
        record = ConsentRecord(
            id=secrets.token_hex(4), given_by=given_by, given_at=when, purpose=purpose,
            image_sha256=image_digest(image),
            file_sha256=file_digest(path) if path is not None else None,
            source=Path(path).name if path is not None else None,
            recorded_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        with self._locked():
            self._write(self.user_records() + [record])
        return record

    def remove(self, key: str) -> list[ConsentRecord]:
        """Remove the records whose id is `key`, or whose image hash starts with `key` (at least 8
        hex digits); returns them."""
        key = key.strip().lower()
        with self._locked():
            records = self.user_records()
            gone = [r for r in records if r.id == key or (len(key) >= 8 and r.image_sha256.startswith(key))]
            if not gone:
                if any(r.id == key or (len(key) >= 8 and r.image_sha256.startswith(key))
                       for r in self.builtin_records()):
                    raise InputError(f"record '{key}' is built in (a public-domain demo portrait) "
                                     f"and cannot be removed")
                raise InputError(f"no consent record '{key}' in '{self.path}': see `swapstream "
                                 f"consent list`")
            self._write([r for r in records if r not in gone])
        return gone
