"""Shared fixtures for the product tests: the public-domain portraits and one analyser per session."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from swapstream.config import Config, load_config
from swapstream.demo import astronaut, grace_hopper, render_target_frame
from swapstream.face.analyser import FaceAnalyser
from swapstream.types import Face


@pytest.fixture(scope="session")
def portraits() -> dict[str, np.ndarray]:
    return {"astronaut": astronaut(), "grace_hopper": grace_hopper()}


@pytest.fixture(scope="session")
def config() -> Config:
    return load_config()


@pytest.fixture(scope="session")
def analyser(config: Config) -> Iterator[FaceAnalyser]:
    a = FaceAnalyser(config)
    yield a
    a.close()


@pytest.fixture(scope="session")
def target(portraits: dict[str, np.ndarray]) -> np.ndarray:
    """The occlusion and hands tests' target: the demo clip's first frame (Grace Hopper, 720p)."""
    return render_target_frame(portraits["grace_hopper"], 0.0)


@pytest.fixture(scope="session")
def source(portraits: dict[str, np.ndarray], analyser: FaceAnalyser) -> tuple[np.ndarray, Face]:
    """The occlusion and hands tests' source face: the astronaut portrait and its face."""
    img = portraits["astronaut"]
    return img, analyser.analyse_image(img)[0]
