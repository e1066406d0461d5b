"""Which ONNX files the PyTorch runner runs with a native module.

A file is recognised by its initializer names (each architecture's `is_*` checks names only it
has); the loader then builds the module from those initializers. The list is in one place so that
the runner's choice (`engines/select.py`, which sends anything else to ONNX Runtime under `auto`)
and the torch runner's loading cannot disagree. Torch is not imported here: the checks read names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .codeformer_model import build_codeformer, is_codeformer
from .face_models import build_bisenet, build_gfpgan, build_xseg, is_bisenet, is_gfpgan, is_xseg
from .gpen_model import build_gpen, is_gpen
from .restoreformer_model import build_restoreformer, is_restoreformer
from .torch_models import build_inswapper, is_inswapper

Inits = dict[str, np.ndarray]


class Native(NamedTuple):
    architecture: str
    recognise: Callable[[Inits], bool]
    build: Callable[[Inits], Any]


NATIVE: tuple[Native, ...] = (
    Native("inswapper", is_inswapper, build_inswapper),
    Native("xseg", is_xseg, build_xseg),
    Native("gfpgan", is_gfpgan, build_gfpgan),
    Native("bisenet", is_bisenet, build_bisenet),
    Native("gpen", is_gpen, build_gpen),
    Native("codeformer", is_codeformer, build_codeformer),
    Native("restoreformer", is_restoreformer, build_restoreformer),
)
"""Every architecture with a native module, tried in this order."""


def native_for(inits: Inits) -> Native | None:
    """The native architecture whose weights these initializers hold, or None."""
    return next((n for n in NATIVE if n.recognise(inits)), None)
