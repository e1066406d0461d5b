"""`swapstream engines ...`: build and cache TensorRT engines ahead of time.

The first run of a model on a GPU builds its engine, which takes minutes; `engines build` does that
before a live stream starts. User errors (no TensorRT, a missing model) are raised as the engines'
exception types, which the main CLI prints as one line; `python -m swapstream.engines_cli` does the
same on its own.
"""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from .engines.tensorrt_runner import (ENGINE_CACHE_ENV, ensure_engine, resolve_model,
                                      tensorrt_available)
from .errors import EngineUserError

app = typer.Typer(
    name="engines",
    help="Build and cache TensorRT engines (one per model, GPU, TensorRT version and precision). "
         f"Engines go to ${ENGINE_CACHE_ENV} (default ~/.cache/swapstream/engines).",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
from .console import err, out, run_app


@app.callback()
def _group() -> None:
    """Build and cache TensorRT engines."""
    # A callback keeps `engines` a command group (`engines build ...`) when this app runs on its own;
    # without one, Typer would collapse its only command into the app itself.


class PrecisionChoice(str, Enum):
    fp16 = "fp16"
    fp32 = "fp32"


@app.command()
def build(
    models: Annotated[list[str], typer.Argument(
        metavar="MODEL...", help="ONNX files, or zoo model names (`swapstream models list`; download "
                                 "them first with `swapstream models download`).")],
    precision: Annotated[PrecisionChoice, typer.Option(
        "--precision", "-p", case_sensitive=False,
        help="fp16 (the fast path) or fp32.")] = PrecisionChoice.fp16,
    max_batch: Annotated[int, typer.Option(
        "--max-batch", min=1, max=64,
        help="Largest batch the engine accepts (its profile is 1..N).")] = 4,
    cache_dir: Annotated[Optional[Path], typer.Option(
        "--cache-dir",
        help=f"Engine cache folder (default ${ENGINE_CACHE_ENV} or ~/.cache/swapstream/engines).")] = None,
    models_dir: Annotated[Optional[Path], typer.Option(
        "--models-dir", help="Folder with model files placed by hand, for zoo names.")] = None,
    offline: Annotated[bool, typer.Option(
        "--offline", help="Never use the network to verify zoo models.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Rebuild even when a cached engine matches.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
) -> None:
    """Build the TensorRT engine of each MODEL for this GPU, or find it in the cache."""
    ok, why = tensorrt_available()
    if not ok:
        raise EngineUserError(why)
    paths = [resolve_model(m, models_dir=models_dir, offline=offline) for m in models]  # all checked first
    for model, path in zip(models, paths):
        # markup=False: model paths and TensorRT phase names may contain "[...]", which Rich would
        # read as style tags.
        with Progress(SpinnerColumn(), TextColumn("{task.fields[model]}", markup=False, style="bold"),
                      TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                      console=err, transient=True, disable=quiet) as bar:
            task = bar.add_task("checking the cache", model=model)

            def report(msg: str, bar: Progress = bar, task: TaskID = task) -> None:
                bar.update(task, description=msg)

            t0 = time.perf_counter()
            result = ensure_engine(path, cache_dir=cache_dir, precision=precision.value,
                                   max_batch=max_batch, progress=report, force=force)
        how = f"built in {time.perf_counter() - t0:.1f} s" if result.built else "cached"
        out.print(Text(f"ok  {model}  {result.path}  ({how})"))


def main() -> None:
    """`python -m swapstream.engines_cli`: user errors are one line on stderr and a non-zero exit."""
    run_app(app)


if __name__ == "__main__":
    main()
