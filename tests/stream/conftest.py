"""Shared fixtures for the product tests: the public-domain portraits and one analyser per session."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from swapstream.config import Config, load_config
from swapstream.demo import astronaut, grace_hopper
from swapstream.face.analyser import FaceAnalyser


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
