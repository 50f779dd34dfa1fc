"""Shared helpers for the compiler tests: zoo estimators at small sizes."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from typing import Any, Callable

import pytest

from cerebras_tf import CerebrasEstimator, CSRunConfig
from examples.zoo import MODELS


@pytest.fixture
def zoo_estimator(tmp_path) -> Callable[..., CerebrasEstimator]:
    """zoo_estimator(name, compile_dir=None, params=None, **config) -> a CerebrasEstimator on a zoo model."""

    def make(name: str, compile_dir: str | None = None, params: dict[str, Any] | None = None,
             **config: Any) -> CerebrasEstimator:
        config.setdefault("cs_ip", "localhost:9000")
        config.setdefault("tf_random_seed", 7)
        return CerebrasEstimator(MODELS[name].model_fn, model_dir=str(tmp_path / "model"),
                                 compile_dir=compile_dir, config=CSRunConfig(**config), params=params or {})

    return make
