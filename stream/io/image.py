"""Still images: the source face's picture."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

from ..errors import InputError, InputNotFoundError


def load_image(path: str | os.PathLike[str], what: str = "source image") -> np.ndarray:
    """Read an image file as HxWx3 uint8 RGB, or raise an error naming the file and the fix."""
    p = Path(path)
    if not p.exists():
        raise InputNotFoundError(f"{what} '{p}' does not exist. Check the path.")
    if p.is_dir():
        raise InputError(f"{what} '{p}' is a folder. Give the path of a PNG or JPEG file.")
    data = np.fromfile(p, dtype=np.uint8)
    img = cv2.imdecode(data, cv2.IMREAD_COLOR_RGB) if data.size else None
    if img is None:
        raise InputError(f"{what} '{p}' is not an image OpenCV can read. Give a PNG, JPEG, WebP "
                         f"or BMP file.")
    return np.ascontiguousarray(img)
