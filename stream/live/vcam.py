"""A live output to a virtual camera through pyvirtualcam: v4l2loopback on Linux, OBS Virtual
Camera on Windows and macOS. Video calls, OBS and browsers then see the swapped stream as a webcam.

Where no such device exists, opening says so in one line that names the fix for this platform.
pyvirtualcam is an optional extra (`pip install 'swapstream[vcam]'`).
"""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OutputError
from ..io.video import AudioPacket
from ..types import Frame

V4L2_VIRTUAL = Path("/sys/devices/virtual/video4linux")
"""Where Linux lists virtual video devices: each loaded v4l2loopback device appears here."""


def vcam_fix(platform: str) -> str:
    """What a user on `platform` (`sys.platform`) does to get a virtual camera device."""
    if platform.startswith("linux"):
        return ("load the v4l2loopback module: sudo modprobe v4l2loopback devices=1 exclusive_caps=1 "
                "card_label=SwapStream (Debian/Ubuntu package v4l2loopback-dkms)")
    if platform == "darwin":
        return ("install OBS Studio 30 or later and start its virtual camera once (Tools > Start "
                "Virtual Camera), then allow its system extension")
    if platform.startswith("win"):
        return "install OBS Studio 30 or later, which registers the OBS Virtual Camera"
    return "pyvirtualcam supports Linux (v4l2loopback), Windows and macOS (OBS Virtual Camera) only"


def missing_device_error(platform: str, detail: str = "") -> OutputError:
    """The one-line error for "no virtual camera here", with the fix for `platform`."""
    why = f" ({detail.strip().rstrip('.')})" if detail.strip() else ""
    return OutputError(f"no virtual camera device{why}: {vcam_fix(platform)}")


def loopback_devices(root: Path = V4L2_VIRTUAL) -> list[str]:
    """The /dev paths of the virtual video devices Linux lists (v4l2loopback's among them)."""
    if not root.is_dir():
        return []
    return sorted(f"/dev/{p.name}" for p in root.glob("video*"))


def check_vcam(device: str | None = None, platform: str = sys.platform) -> None:
    """Fail early, before any input is opened, where a virtual camera cannot work here."""
    try:
        import pyvirtualcam  # noqa: F401
    except ImportError:
        raise OutputError("the virtual camera needs pyvirtualcam: pip install 'swapstream[vcam]'") from None
    if platform.startswith("linux"):
        found = loopback_devices()
        if not found:
            raise missing_device_error(platform, "no v4l2loopback device in /dev/video*")
        if device is not None and device not in found:
            raise OutputError(f"'{device}' is not a v4l2loopback device; these are: {', '.join(found)}")
    # Elsewhere the OBS backend is found when the camera is opened (`VirtualCamera`).


class VirtualCamera:
    """Sends RGB frames to a virtual camera; the same interface as `LiveWriter`. A camera carries no
    audio: audio packets are ignored (OBS takes the sound from the microphone or the stream)."""

    def __init__(self, *, width: int, height: int, fps: float, device: str | None = None,
                 platform: str = sys.platform) -> None:
        try:
            import pyvirtualcam
        except ImportError:
            raise OutputError("the virtual camera needs pyvirtualcam: pip install 'swapstream[vcam]'") from None
        # 4:2:0 and 4:2:2 device formats need even sizes.
        self.width, self.height = width - width % 2, height - height % 2
        self.frames = 0
        try:
            self._cam: Any = pyvirtualcam.Camera(self.width, self.height, fps, device=device,
                                                 fmt=pyvirtualcam.PixelFormat.RGB, print_fps=False)
        except RuntimeError as e:  # pyvirtualcam's way of saying "no backend found a device"
            # Its first sentence says which backend looked where; the rest is advice we replace.
            raise missing_device_error(platform, str(e).split(". ")[0]) from None
        self.device: str = self._cam.device

    def write(self, frame: Frame) -> None:
        self._cam.send(np.ascontiguousarray(frame.data[: self.height, : self.width]))
        self.frames += 1

    def write_nv12(self, nv12: np.ndarray, pts: int | None, time_base: Fraction | None) -> None:
        """A frame the GPU path downloaded as NV12 (see `LiveWriter.write_nv12`): the camera takes RGB."""
        import av

        rgb = av.VideoFrame.from_ndarray(nv12, format="nv12").to_ndarray(format="rgb24")
        self.write(Frame(rgb, pts, time_base, 0))

    def write_audio(self, packet: AudioPacket) -> None:
        """A camera has no audio."""

    def close(self) -> None:
        self._cam.close()
