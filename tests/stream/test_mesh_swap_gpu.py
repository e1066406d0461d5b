"""The whole mesh swap on the GPU against the CPU swap, on frames of the demo clip (`pytest -m gpu`)."""

from __future__ import annotations

from fractions import Fraction
from types import ModuleType

import numpy as np
import pytest

from swapstream.config import MeshConfig, load_config
from swapstream.demo import astronaut, grace_hopper, render_target_frame
from swapstream.face.analyser import FaceAnalyser
from swapstream.swap.mesh import MeshSwapper, source_face
from swapstream.types import Frame

from .measures import psnr

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mesh", [MeshConfig(), MeshConfig(keep_eyes=True, color_match="rgb")])
def test_gpu_mesh_swap_matches_cpu_on_the_demo_clip(cp: ModuleType, mesh: MeshConfig) -> None:
    cfg = load_config()
    analyser = FaceAnalyser(cfg)
    src = astronaut()
    sw_cpu, sw_gpu = MeshSwapper(mesh), MeshSwapper(mesh)
    face = source_face(analyser.analyse_image(src), "astronaut")
    sw_cpu.set_source(src, face)
    sw_gpu.set_source(src, face)
    portrait = grace_hopper()
    worst_face, worst_frame = 99.0, 99.0
    for i in range(0, 100, 4):  # every 4th frame of the 4 s, 25 fps demo clip
        img = render_target_frame(portrait, i / 25.0)
        faces = analyser.track(Frame(img, pts=i, time_base=Fraction(1, 25), index=i))
        assert len(faces) == 1
        cpu = img.copy()
        regions = sw_cpu.swap_regions(cpu, faces)
        gpu = cp.asarray(img)
        sw_gpu.swap(gpu, faces)
        gpu_host = gpu.get()
        x0, y0 = regions[0].origin
        h, w = regions[0].mask.shape
        worst_face = min(worst_face, psnr(gpu_host[y0:y0 + h, x0:x0 + w], cpu[y0:y0 + h, x0:x0 + w]))
        worst_frame = min(worst_frame, psnr(gpu_host, cpu))
        # The swap really happened on the GPU too: the face changed.
        assert np.abs(gpu_host[y0:y0 + h, x0:x0 + w].astype(int) - img[y0:y0 + h, x0:x0 + w]).mean() > 5
    analyser.close()
    print(f"worst PSNR GPU vs CPU: face region {worst_face:.1f} dB, frame {worst_frame:.1f} dB")
    assert worst_face >= 40.0
