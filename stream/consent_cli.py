"""`swapstream consent add|list|remove|check`: the consent records that source faces need."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from .config import load_config
from .consent import ConsentStore, image_digest
from .console import err, out

app = typer.Typer(help="Consent records: a source face is used only with the consent of the person "
                       "shown.", no_args_is_help=True)

StoreOpt = Annotated[Optional[Path], typer.Option(
    "--store", help="Consent records file (default: config consent.store, $SWAPSTREAM_CONSENT_STORE, "
                    "else ~/.local/share/swapstream/consent.json).")]


def _store(store: Path | None) -> ConsentStore:
    # The option wins; else the default preset's consent.store; else the environment and the default.
    # Whichever applied, these commands' errors point to another store with their own option.
    return ConsentStore(store if store is not None else load_config().consent.store,
                        choose_with="--store PATH")


@app.command()
def add(
    image: Annotated[Path, typer.Argument(help="The picture of the face (PNG, JPEG, ...).")],
    by: Annotated[str, typer.Option("--by", help="Who gave consent: the person shown, or who may consent for them.")],
    purpose: Annotated[str, typer.Option("--purpose", help="What consent was given for.")],
    date: Annotated[Optional[str], typer.Option("--date", help="When consent was given: YYYY-MM-DD, or an ISO date and time (default: today).")] = None,
    store: StoreOpt = None,
) -> None:
    """Record that the person shown in IMAGE consented to its use, for PURPOSE."""
    from .io.image import load_image

    s = _store(store)
    rec = s.add(load_image(image), given_by=by, purpose=purpose, given_at=date, path=image)
    err.print(Text(f"recorded in {s.path}"))
    out.print(Text(rec.summary()), soft_wrap=True)


@app.command("list")
def list_(
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the records as JSON.")] = False,
) -> None:
    """List the consent records (the built-in ones for the demo portraits first)."""
    s = _store(store)
    records = s.records()
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(r) for r in records], indent=2))
        return
    # One line per record (id first): readable in a narrow terminal and easy to grep.
    for r in records:
        out.print(Text(f"{r.id}  {r.given_at}  {r.given_by}  for \"{r.purpose}\"  image "
                       f"{r.image_sha256[:12]}" + ("  (built in)" if r.builtin else "")), soft_wrap=True)
    err.print(Text(f"store: {s.path} ({len(s.user_records())} records, plus "
                   f"{len(s.builtin_records())} built in)"))


@app.command()
def remove(
    key: Annotated[str, typer.Argument(help="Record id, or the first 8+ hex digits of its image hash.")],
    store: StoreOpt = None,
) -> None:
    """Remove a consent record (withdrawn consent): the face can no longer be used."""
    s = _store(store)
    for r in s.remove(key):
        out.print(Text(f"removed {r.summary()}"), soft_wrap=True)


@app.command()
def check(
    image: Annotated[Path, typer.Argument(help="The picture of the face.")],
    store: StoreOpt = None,
) -> None:
    """Say which record allows using IMAGE as a source face; exit 2 when none does."""
    from .io.image import load_image

    s = _store(store)
    img = load_image(image)
    rec = s.require(img, str(image), image)
    out.print(Text(f"ok  {rec.summary()}"), soft_wrap=True)
    err.print(Text(f"image sha256 {image_digest(img)}"))
