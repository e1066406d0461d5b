"""The virtual-camera output. This machine and CI have no v4l2loopback device (it needs a kernel
module), so what is tested is what a user without one meets: one line that names the fix, exit 2,
from the real pyvirtualcam; and the device listing it relies on, on a real directory tree."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import cv2
import pytest

from swapstream.demo import astronaut
from swapstream.errors import OutputError
from swapstream.live.vcam import (VirtualCamera, check_vcam, loopback_devices, missing_device_error,
                                  vcam_fix)

from .test_cli import assert_user_error, cli

HAVE_PYVIRTUALCAM = importlib.util.find_spec("pyvirtualcam") is not None
no_device_here = pytest.mark.skipif(bool(loopback_devices()),
                                    reason="this machine has a v4l2loopback device")


def test_the_fix_named_for_each_platform() -> None:
    assert vcam_fix("linux") == (
        "load the v4l2loopback module: sudo modprobe v4l2loopback devices=1 exclusive_caps=1 "
        "card_label=SwapStream (Debian/Ubuntu package v4l2loopback-dkms)")
    assert vcam_fix("win32") == "install OBS Studio 30 or later, which registers the OBS Virtual Camera"
    assert vcam_fix("darwin").startswith("install OBS Studio 30 or later and start its virtual camera once")
    assert str(missing_device_error("linux", "nothing at /dev/video*. ")) == (
        "no virtual camera device (nothing at /dev/video*): " + vcam_fix("linux"))


def test_loopback_devices_are_read_from_sysfs(tmp_path: Path) -> None:
    assert loopback_devices(tmp_path / "absent") == []
    for name in ("video11", "video10"):
        (tmp_path / name).mkdir()
    (tmp_path / "not-a-camera").mkdir()
    assert loopback_devices(tmp_path) == ["/dev/video10", "/dev/video11"]


@no_device_here
@pytest.mark.skipif(not HAVE_PYVIRTUALCAM, reason="pyvirtualcam is in the test extra")
def test_opening_the_camera_without_a_device_names_the_fix() -> None:
    with pytest.raises(OutputError) as e:
        VirtualCamera(width=320, height=240, fps=15, platform="linux")
    # pyvirtualcam's own finding, then our fix, on one line.
    assert str(e.value) == ("no virtual camera device ('v4l2loopback' backend: No v4l2 loopback "
                            "device found at /dev/video[0-99]): " + vcam_fix("linux"))


def test_without_pyvirtualcam_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyvirtualcam", None)  # makes `import pyvirtualcam` fail
    with pytest.raises(OutputError, match=r"needs pyvirtualcam: pip install 'swapstream\[vcam\]'"):
        check_vcam()


@no_device_here
def test_live_to_vcam_without_a_device_is_one_clear_error(tmp_path: Path) -> None:
    face = tmp_path / "face.png"
    cv2.imwrite(str(face), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    # Port 9 (discard) has no RTMP server: the check must come before the input is even tried.
    res = cli("live", "-s", face, "-i", "rtmp://127.0.0.1:9/live/in", "--vcam", cwd=tmp_path)
    assert res.returncode == 2
    if HAVE_PYVIRTUALCAM:
        assert_user_error(res, "no virtual camera device", "sudo modprobe v4l2loopback")
    else:
        assert_user_error(res, "pip install 'swapstream[vcam]'")
    assert "cannot open live input" not in res.stderr
