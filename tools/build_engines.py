"""Build and cache TensorRT engines for ONNX files or zoo model names, printing progress.

    python tools/build_engines.py MODEL [MODEL ...] [--precision fp16|fp32] [--max-batch 4]
                                  [--cache-dir DIR] [--models-dir DIR] [--offline] [--force]

A MODEL is a path to an .onnx file, or a zoo name (`swapstream models list`) whose file is already
downloaded. Engines go where the TensorRT runner looks for them, so a later run starts at once.
Exit status: 0 when every engine is ready, 2 on a user error (printed as one line).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path


def _printer(model: str, every: float = 2.0) -> Callable[[str], None]:
    """A progress callback that prints a line when the phase changes or every `every` seconds: a build
    reports thousands of tactic steps, and a log of each one helps nobody."""
    t0 = time.perf_counter()
    last_phase, last_at = "", 0.0

    def report(msg: str) -> None:
        nonlocal last_phase, last_at
        phase = msg.split(" (")[0]
        now = time.perf_counter()
        if phase != last_phase or now - last_at >= every:
            last_phase, last_at = phase, now
            print(f"[{now - t0:7.1f} s] {model}: {msg}", file=sys.stderr, flush=True)

    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", metavar="MODEL", help="ONNX file or zoo model name")
    ap.add_argument("--precision", choices=("fp16", "fp32"), default="fp16")
    ap.add_argument("--max-batch", type=int, default=4, help="largest batch (profile 1..N); default 4")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="engine cache (default $SWAPSTREAM_ENGINE_CACHE or ~/.cache/swapstream/engines)")
    ap.add_argument("--models-dir", type=Path, default=None, help="folder with model files placed by hand")
    ap.add_argument("--offline", action="store_true", help="never use the network to verify zoo models")
    ap.add_argument("--force", action="store_true", help="rebuild even when a cached engine matches")
    args = ap.parse_args(argv)
    if args.max_batch < 1:
        ap.error("--max-batch must be at least 1")

    from swapstream.engines.errors import EngineUserError
    from swapstream.engines.tensorrt_runner import ensure_engine, resolve_model, tensorrt_available

    try:
        ok, why = tensorrt_available()
        if not ok:
            raise EngineUserError(why)
        print(f"using {why}", file=sys.stderr)
        paths = [resolve_model(m, models_dir=args.models_dir, offline=args.offline) for m in args.models]
        for model, path in zip(args.models, paths):
            result = ensure_engine(path, cache_dir=args.cache_dir, precision=args.precision,
                                   max_batch=args.max_batch, progress=_printer(model), force=args.force)
            how = f"built in {result.seconds:.1f} s" if result.built else "cached"
            print(f"ok  {model}  {result.path}  ({how})")
    except EngineUserError as e:
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
