"""`swapstream keys init`: a self-signed C2PA key and certificate pair for testing (keys.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from .console import err, out
from .keys import DEFAULT_DAYS, default_dir, make_test_pair

app = typer.Typer(help="Keys that sign C2PA Content Credentials on file outputs.", no_args_is_help=True)


@app.command()
def init(
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", help="Folder for signer.key, chain.pem and ca.pem (default: the user data folder's "
                      "swapstream/c2pa, where `run` looks when provenance.key/cert are unset).")] = None,
    days: Annotated[int, typer.Option(min=1, max=3650, help="Days the certificates are valid.")] = DEFAULT_DAYS,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing pair.")] = False,
) -> None:
    """Make a self-signed test pair: a signing key, its certificate chain, and the test CA.

    Manifests signed with it validate but are untrusted (no public trust list has this CA); give
    ca.pem to `swapstream verify --trust` to check them as trusted. Not for publishing: see
    docs/responsible_use.md for what a real certificate needs.
    """
    where = out_dir if out_dir is not None else default_dir()
    pair = make_test_pair(where, days=days, force=force)
    for label, p in (("key", pair.key), ("certificate chain", pair.chain), ("test CA", pair.ca)):
        out.print(Text(f"{label:18s} {p}"), soft_wrap=True)
    if out_dir is None:
        err.print(Text("`swapstream run` now signs MP4/MOV outputs with this pair (provenance.c2pa=auto)."),
                  soft_wrap=True)
    else:
        err.print(Text(f"sign with it: --set provenance.key={pair.key} --set provenance.cert={pair.chain}"),
                  soft_wrap=True)
    err.print(Text(f"check signed files as trusted: swapstream verify FILE --trust {pair.ca}"), soft_wrap=True)
