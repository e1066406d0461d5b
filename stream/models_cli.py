"""`swapstream models ...`: list, download and verify the FaceFusion-compatible neural models.

User errors are raised as the engines' exception types; the main CLI prints them as one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import (BarColumn, DownloadColumn, Progress, TaskID, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)
from rich.table import Table
from rich.text import Text

from .engines.download import (CACHE_DIR_ENV, ModelCorruptError, ModelStore, Status,
                               licence_notice)
from .engines.errors import ModelMissingError
from .engines.zoo import MODELS, get_spec

app = typer.Typer(
    name="models",
    help="List, download and verify the neural models (FaceFusion's zoo). Downloads go to "
         f"${CACHE_DIR_ENV} (default ~/.cache/swapstream/zoo).",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
from .console import err, out

ModelsDir = Annotated[Optional[Path], typer.Option(
    "--models-dir", help="Folder with model files placed by hand; looked in before the download cache.")]
Offline = Annotated[bool, typer.Option("--offline", help="Never use the network.")]

_STYLE: dict[Status, str] = {"ok": "green", "missing": "dim", "corrupt": "bold red", "unverified": "yellow"}


def _store(models_dir: Path | None, offline: bool) -> ModelStore:
    return ModelStore(models_dir, offline=offline)


def _ask_licence(text: str) -> bool:
    err.print(Text(text))
    try:
        return typer.confirm("Accept this licence and download?", default=False, err=True)
    except typer.Abort:  # no answer (stdin closed, Ctrl-C): not accepted
        err.print()  # end the prompt's line, so that the error starts on its own
        return False


@app.command("list")
def list_models(models_dir: ModelsDir = None, offline: Offline = False) -> None:
    """List every model with its licence and whether its file is here and intact."""
    store = _store(models_dir, offline)
    table = Table("model", "kind", "status", "where", "licence")
    for column in table.columns[:4]:
        column.no_wrap = True
    table.columns[4].overflow = "fold"  # the licence is the one column allowed to wrap, never to be cut
    for spec, path, status in store.list():
        where = "-" if path is None else ("models folder" if path.parent == store.models_dir else "cache")
        table.add_row(spec.name, spec.kind, Text(status, style=_STYLE[status]), where, Text(spec.licence))
    out.print(table)
    out.print(Text(f"models folder: {store.models_dir}\ndownload cache: {store.cache_dir}"))


@app.command()
def download(
    names: Annotated[list[str], typer.Argument(metavar="NAME...", help="Models to download "
                     "(`swapstream models list` shows them); converters they need come along.")],
    accept_licence: Annotated[bool, typer.Option("--accept-licence",
                              help="Accept each model's licence without asking (for scripts).")] = False,
    models_dir: ModelsDir = None,
    offline: Offline = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Download models into the cache, verify them, and show each licence before its first download."""
    store = _store(models_dir, offline)
    wanted: list[str] = []
    for name in names:
        spec = get_spec(name)  # every name checked before anything is fetched
        for n in (spec.name, spec.converter):
            if n is not None and n not in wanted:
                wanted.append(n)
    for name in wanted:
        spec = get_spec(name)
        if not offline and accept_licence and not store.licence_accepted(name) \
                and store.find(name) is None:
            err.print(Text(licence_notice(spec) + " (accepted with --accept-licence)"))
        bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                       TransferSpeedColumn(), TimeRemainingColumn(), console=err)
        task: list[TaskID] = []

        def report(done: int, total: int, bar: Progress = bar, task: list[TaskID] = task,
                   label: str = escape(spec.file)) -> None:
            # Started on the first bytes, not before: the licence question must not sit under a live bar.
            if not task:
                bar.start()
                task.append(bar.add_task(label, total=total or None))
            bar.update(task[0], completed=done, total=total or None)

        try:
            path = store.download(name, accept_licence=accept_licence,
                                  progress=None if quiet else report, confirm=_ask_licence)
        finally:
            bar.stop()
        out.print(Text(f"ok  {name}  {path}"))


@app.command()
def verify(
    names: Annotated[Optional[list[str]], typer.Argument(
        metavar="[NAME...]", help="Models to check (default: every one that is present).")] = None,
    models_dir: ModelsDir = None,
    offline: Offline = False,
) -> None:
    """Check model files against their CRC32; fails if any named (or present) file is not intact."""
    store = _store(models_dir, offline)
    checked = [get_spec(n).name for n in names] if names else list(MODELS)
    failed: list[tuple[str, Status]] = []
    shown = 0
    for name in checked:
        path, status = store.status(name)
        if status == "missing" and not names:
            continue  # "every present one": absent models are not failures
        shown += 1
        out.print(Text(f"{status:<10} {name}  {path or '-'}", style=_STYLE[status]))
        if status != "ok":
            failed.append((name, status))
    if not shown:
        out.print(Text(f"no models in '{store.models_dir}' or '{store.cache_dir}'"))
    if failed:
        listing = ", ".join(f"{n} ({s})" for n, s in failed)
        fixes = ["run `swapstream models download NAME` for missing or corrupt ones (files placed by "
                 f"hand in '{store.models_dir}' you replace yourself)"]
        if any(s == "unverified" for _n, s in failed):
            fixes.append("put each unverified file's .hash beside it, or check once without --offline")
        message = f"{len(failed)} of {shown} models failed verification: {listing}; {'; '.join(fixes)}"
        if any(s == "corrupt" for _n, s in failed):
            raise ModelCorruptError(message)
        raise ModelMissingError(message)
