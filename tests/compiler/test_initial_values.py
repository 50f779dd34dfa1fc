"""Initial variable values for the executor come from TF's own initializers (same seeds, same values)."""
from __future__ import annotations

import numpy as np

from cerebras_tf.compiler import compile_model
from cerebras_tf.compiler.initial import initial_values
from cerebras_tf.precheck import precheck
from examples.zoo import mlp


def test_initial_values_match_tf_and_are_reproducible(zoo_estimator):
    est = zoo_estimator("mlp")
    model = precheck(est, mlp.input_fn, "train")
    program = compile_model(model).program
    values = initial_values(model, program)
    assert set(values) == {v.name for v in program.variables}
    for variable in program.variables:
        assert list(values[variable.name].shape) == variable.shape
        assert values[variable.name].dtype == np.dtype(variable.dtype)
    assert values["global_step"] == 0
    assert not values["dense1/kernel/Adam"].any() and values["beta1_power"] == np.float32(0.9)
    assert values["dense1/kernel"].std() > 0

    # same tf_random_seed, same op seeds: same values (dense3 uses a seeded TF initializer; Keras-style
    # initializers in dense1/dense2 draw a fresh Python seed per graph, in plain TF too)
    again = precheck(zoo_estimator("mlp"), mlp.input_fn, "train")
    np.testing.assert_array_equal(initial_values(again, program)["dense3/kernel"], values["dense3/kernel"])
