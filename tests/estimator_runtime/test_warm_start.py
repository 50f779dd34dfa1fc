"""Warm start in the runtime: a regex, a list of names, a checkpoint path; the same selection as tf.estimator."""
from __future__ import annotations

import numpy as np
import pytest

from estimator import runtime
from tests.estimator_runtime.runtime_models import dense_model_fn, input_fn

VARIABLES = ("hidden/kernel", "hidden/bias", "output/kernel", "output/bias")


def _trained_source(tmp_path) -> str:
    source = runtime.Estimator(dense_model_fn(runtime, layers=False), model_dir=str(tmp_path / "source"),
                               config=runtime.RunConfig(tf_random_seed=3), params={"lr": 0.05})
    source.train(input_fn(), steps=20)
    return source.model_dir


def _start(api, model_dir, warm_start_from) -> dict[str, np.ndarray]:
    """The variables after one step at learning rate 0: where training starts from."""
    target = api.Estimator(dense_model_fn(api, layers=False), model_dir=str(model_dir),
                           config=api.RunConfig(tf_random_seed=11), params={"lr": 0.0},
                           warm_start_from=warm_start_from)
    target.train(input_fn(), steps=1)
    return {name: target.get_variable_value(name) for name in VARIABLES}


@pytest.mark.parametrize("selection, warmed", [
    ("hidden.*", {"hidden/kernel", "hidden/bias"}),  # a regex over the trainable variables
    (["output/kernel"], {"output/kernel"}),  # a list of names
    (None, set(VARIABLES)),  # a checkpoint path alone: every trainable variable
])
def test_warm_start_takes_exactly_the_selected_variables_from_the_checkpoint(tmp_path, selection, warmed):
    source_dir = _trained_source(tmp_path)
    source = {name: runtime.Estimator(dense_model_fn(runtime, layers=False), model_dir=source_dir)
              .get_variable_value(name) for name in VARIABLES}
    warm_start_from = source_dir if selection is None else runtime.WarmStartSettings(source_dir, selection)
    started = _start(runtime, tmp_path / "warm", warm_start_from)
    fresh = _start(runtime, tmp_path / "fresh", None)
    for name in VARIABLES:
        expected = source[name] if name in warmed else fresh[name]
        np.testing.assert_array_equal(started[name], expected, err_msg=name)
    assert not np.array_equal(source["output/kernel"], fresh["output/kernel"])  # the test can tell them apart


def test_the_selection_is_tf_estimators(tmp_path):
    tf_estimator = pytest.importorskip("tensorflow_estimator.python.estimator.estimator_lib")
    source_dir = _trained_source(tmp_path)
    for selection in ("hidden.*", ["output/kernel"]):
        ours = _start(runtime, tmp_path / f"ours{selection!s:.6}",
                      runtime.WarmStartSettings(source_dir, selection))
        theirs = _start(tf_estimator, tmp_path / f"theirs{selection!s:.6}",
                        tf_estimator.WarmStartSettings(source_dir, selection))
        for name in VARIABLES:
            np.testing.assert_array_equal(ours[name], theirs[name], err_msg=f"{selection}: {name}")
