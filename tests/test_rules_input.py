"""CS-system rules on input_fn and its dataset (rules 1-5 and 11)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from estimator import EstimatorSpec, ModeKeys
from cerebras_tf import errors


NOT_A_DATASET = "[Unsupported TensorFlow] Input function must return a tf.data.Dataset"
INCONSISTENT_BATCH = (
    "[Unsupported TensorFlow] Inconsistent batch sizes detected. To ensure a fixed batch size across all steps, "
    "set `drop_remainder=True` when batching your Dataset in the input function."
)


def _train(estimator, input_fn):
    return lambda: estimator.train(input_fn, max_steps=5)


# --------------------------------------------------------------------------- rule 1


def test_input_fn_must_return_a_dataset(make_estimator, make_input_fn, assert_refused, input_fn_lines):
    estimator = make_estimator()
    input_fn = make_input_fn(dataset=False)  # (features, labels) tensors: fine for tf.estimator, not for the CS
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, input_fn),
                   NOT_A_DATASET, f"Where: {input_fn_lines['tensors']}\n", "returned tuple")


# --------------------------------------------------------------------------- rule 2


@pytest.mark.parametrize("element, structure, problem", [
    ("sparse", "(SparseTensorSpec(float32[4,4]), float32[4,1])", "features is a SparseTensor"),
    ("ragged", "(RaggedTensorSpec(float32[4,4]), float32[4,1])", "features is a RaggedTensor"),
    ("string_features", "(string[4,4], float32[4,1])", "features is a string tensor"),
    ("string_labels", "(float32[4,4], string[4,1])", "labels is a string tensor"),
    # tf.estimator itself cannot split this element: the rule is still what gets reported.
    ("triple", "(float32[4,4], float32[4,1], float32[4])", "an element must be (features, labels) or features alone"),
])
def test_element_structure_must_be_features_and_labels_tensors(
        make_estimator, make_input_fn, assert_refused, element, structure, problem):
    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, make_input_fn(element=element)),
                   f"Unsupported dataset element structure {structure}: {problem}")


@pytest.mark.parametrize("element", ["dict", "nested"])
def test_features_may_be_a_dict_or_a_nested_tuple_of_dense_tensors(make_estimator, make_input_fn, element):
    make_estimator().compile(make_input_fn(element=element), validate_only=True)


def _nest_input_fn(features, labels="dense"):
    """input_fn(params) over 8 examples of the given per-example features nest and labels
    ("dense": a float32 [1] tensor, "dict": {"y": it, "w": ones}, None: features alone)."""
    y = np.arange(8, dtype=np.float32).reshape(8, 1)
    label_values = {"dense": y, "dict": {"y": y, "w": np.ones(8, np.float32)}, None: None}[labels]

    def input_fn(params):
        element = features if label_values is None else (features, label_values)
        return tf.data.Dataset.from_tensor_slices(element).repeat().batch(4, drop_remainder=True)

    return input_fn


def _nest_model_fn(features, labels, mode, params):
    """Sums every float feature through one dense layer; its loss reads labels (a tensor, or a dict's "y")."""
    leaves = [tf.cast(tf.reshape(leaf, [4, -1]), tf.float32) for leaf in tf.nest.flatten(features)]
    predictions = tf.compat.v1.layers.dense(tf.concat(leaves, axis=1), 1, name="out")
    target = labels["y"] if isinstance(labels, dict) else labels
    target = predictions if target is None else target
    loss = tf.compat.v1.losses.mean_squared_error(target, predictions)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op, predictions=predictions)


_IDS = np.arange(8 * 3, dtype=np.int32).reshape(8, 3) % 5
_X = np.ones((8, 2), np.float32)


@pytest.mark.parametrize("features, labels", [
    ({"input_ids": _IDS, "input_mask": _X}, "dense"),
    ({"input_ids": _IDS, "input_mask": _X}, "dict"),
    ({"input_ids": _IDS, "input_mask": _X}, None),  # a dict alone is features, with labels None
    (((_X, _IDS), {"mask": _X}), "dense"),  # nested tuples and dicts
])
def test_nests_of_dense_tensors_pass_every_rule_and_compile(make_estimator, features, labels):
    estimator = make_estimator(_nest_model_fn)
    estimator.compile(_nest_input_fn(features, labels), validate_only=True)


@pytest.mark.parametrize("component, path, what", [
    (lambda: tf.sparse.from_dense(_X), "features['tokens']", "a SparseTensor"),
    (lambda: tf.RaggedTensor.from_tensor(_X), "features['tokens']", "a RaggedTensor"),
    (lambda: _IDS.astype(str), "features['tokens']", "a string tensor"),
])
def test_sparse_ragged_and_string_components_of_a_nest_are_refused_by_path(
        make_estimator, assert_refused, component, path, what):
    estimator = make_estimator(_nest_model_fn)

    def input_fn(params):
        ds = tf.data.Dataset.from_tensor_slices(({"input_ids": _IDS, "tokens": component()}, {"y": _X}))
        return ds.repeat().batch(4, drop_remainder=True)

    error = assert_refused(estimator, errors.InputFunctionError,
                           lambda: estimator.compile(input_fn, validate_only=True),
                           "Unsupported dataset element structure", f"{path} is {what}",
                           "Features and labels must be dense numeric tensors, or dicts/tuples of them")
    problem = str(error).split("Unsupported dataset element structure")[1].split(":", 1)[1].split(".")[0]
    assert "input_ids" not in problem


def test_a_string_label_inside_a_dict_is_named_by_its_path(make_estimator, assert_refused):
    estimator = make_estimator(_nest_model_fn)

    def input_fn(params):
        labels = {"y": _X, "name": np.array([str(i) for i in range(8)])}
        return tf.data.Dataset.from_tensor_slices(({"x": _X}, labels)).repeat().batch(4, drop_remainder=True)

    assert_refused(estimator, errors.InputFunctionError, lambda: estimator.compile(input_fn, validate_only=True),
                   "labels['name'] is a string tensor", "encode the strings as integer ids")


def test_a_dict_whose_batch_is_not_fixed_keeps_the_batch_error(make_estimator, assert_refused):
    estimator = make_estimator(_nest_model_fn)

    def input_fn(params):
        ds = tf.data.Dataset.from_tensor_slices(({"input_ids": _IDS, "input_mask": _X}, _X))
        return ds.repeat().batch(4)  # no drop_remainder

    assert_refused(estimator, errors.InputFunctionError, lambda: estimator.compile(input_fn, validate_only=True),
                   INCONSISTENT_BATCH, "'input_ids': int32[?,3]")


def test_a_model_fn_that_cannot_take_the_element_still_gets_the_structure_error(
        make_estimator, make_input_fn, assert_refused):
    def model_fn(features, labels, mode, params):
        raise TypeError(f"this model wants a tensor, got {type(features).__name__}")

    estimator = make_estimator(model_fn)
    error = assert_refused(estimator, errors.InputFunctionError,
                           lambda: estimator.compile(make_input_fn(element="sparse"), validate_only=True),
                           "Unsupported dataset element structure (SparseTensorSpec(float32[4,4]), float32[4,1])")
    assert isinstance(error.__context__, TypeError)  # the model_fn failure stays visible in the traceback


# --------------------------------------------------------------------------- rule 3


def test_batch_without_drop_remainder_is_refused_at_the_batch_call(
        make_estimator, make_input_fn, assert_refused, input_fn_lines):
    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, make_input_fn(drop_remainder=False)),
                   INCONSISTENT_BATCH, f"Where: {input_fn_lines['batch']}", "float32[?,4]")


# --------------------------------------------------------------------------- rule 4


def test_finite_repeat_is_refused_for_training_at_the_repeat_call(
        make_estimator, make_input_fn, assert_refused, input_fn_lines):
    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, make_input_fn(repeat=2)),
                   "The training Dataset must repeat indefinitely, but it has a finite repeat(count)",
                   f"Where: {input_fn_lines['repeat']}", "repeat() with the default count=None")


def test_missing_repeat_is_refused_for_training_by_compile_even_without_a_cs_ip(
        make_estimator, make_input_fn, assert_refused):
    estimator = make_estimator(cs_ip=None)  # compile() checks every rule whatever the target
    assert_refused(estimator, errors.InputFunctionError,
                   lambda: estimator.compile(make_input_fn(repeat=False), validate_only=True),
                   "The training Dataset must repeat indefinitely, but it has no repeat()")


@pytest.mark.parametrize("repeat", [2, False])
def test_finite_data_is_fine_for_evaluation(make_estimator, make_input_fn, assert_refused, repeat):
    estimator = make_estimator()
    estimator.compile(make_input_fn(repeat=repeat), mode=ModeKeys.EVAL, validate_only=True)
    assert_refused(estimator, errors.RunArgumentError,  # every rule passed: only the checkpoint is missing
                   lambda: estimator.evaluate(make_input_fn(repeat=repeat), steps=2, use_cs=True),
                   "evaluate() on the CS system found no checkpoint")


# --------------------------------------------------------------------------- rule 5


@pytest.fixture(params=["(params, mode)", "(mode, config)", "()", "(batch_size)", "(config, params)"])
def badly_signed_input_fn(request, make_input_fn):
    """(input_fn, its signature as the error shows it): each serves a good dataset but cannot be called as
    input_fn(params)."""
    good = make_input_fn()

    def with_mode(params, mode):
        return good(params)

    def mode_and_config(mode, config):
        return good({"batch_size": 4})

    def no_arguments():
        return good({"batch_size": 4})

    def batch_size_only(batch_size):
        return good({"batch_size": batch_size})

    def params_second(config=None, params=None):  # input_fn(params) would bind config
        return good(params)

    functions = {"(params, mode)": with_mode, "(mode, config)": mode_and_config, "()": no_arguments,
                 "(batch_size)": batch_size_only, "(config, params)": params_second}
    return functions[request.param], request.param


def test_input_fn_takes_only_params(make_estimator, assert_refused, defined_at, badly_signed_input_fn):
    input_fn, signature = badly_signed_input_fn
    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, input_fn),
                   "The input function only takes a single dictionary parameter, params;",
                   f"{input_fn.__name__} takes {signature}", f"Where: {defined_at(input_fn)}")


def test_a_second_parameter_without_a_default_is_named_in_the_fix(make_estimator, make_input_fn, assert_refused):
    good = make_input_fn()

    def input_fn(params, mode):
        return good(params)

    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError, lambda: estimator.compile(input_fn, validate_only=True),
                   "input_fn takes (params, mode)", "give mode a default value (e.g. `mode=None`)")


def _zoo_style(make_input_fn):
    good = make_input_fn()

    def train_input_fn(params, input_context=None):  # the Model Zoo's signature
        assert input_context is None
        return good(params)

    def with_var_args(params, *args, **kwargs):
        return good(params)

    def keyword_only_extra(params, *, mode=None):
        return good(params)

    return [train_input_fn, with_var_args, keyword_only_extra]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_input_fn_with_defaulted_extra_parameters_is_accepted(make_estimator, make_input_fn, index):
    """The CS system passes params only: other parameters are fine when they have defaults (or are *args)."""
    input_fn = _zoo_style(make_input_fn)[index]
    make_estimator().compile(input_fn, validate_only=True)


def test_the_signature_rule_and_the_estimators_call_agree():
    from cerebras_tf import precheck
    from cerebras_tf.rules import input as input_rules

    def zoo(params, input_context=None):
        pass

    def with_mode(params, mode):
        pass

    def nothing():
        pass

    def only_kwargs(**kwargs):
        pass

    assert not input_rules.check_input_fn_signature(zoo) and precheck._estimator_can_call(zoo)
    # The Estimator can call it (so every other problem is found too), the CS system cannot.
    assert input_rules.check_input_fn_signature(with_mode) and precheck._estimator_can_call(with_mode)
    for fn in (nothing, only_kwargs):
        assert input_rules.check_input_fn_signature(fn)
    assert input_rules.unfilled_input_fn_parameters(with_mode, input_rules.CS_INPUT_FN_ARGS) == ["mode"]
    assert input_rules.unfilled_input_fn_parameters(nothing, input_rules.CS_INPUT_FN_ARGS) == ["params"]


# --------------------------------------------------------------------------- rule 11


@pytest.mark.parametrize("input_kwargs, config_kwargs", [
    ({"shuffle_seed": 5}, {}),  # shuffle(seed=...)
    ({}, {"tf_random_seed": 1}),  # a graph-level seed makes the unseeded shuffle deterministic too
])
def test_deterministic_shuffle_with_two_input_workers_is_refused_at_the_shuffle(
        make_estimator, make_input_fn, assert_refused, input_fn_lines, input_kwargs, config_kwargs):
    estimator = make_estimator(num_input_workers=2, **config_kwargs)
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, make_input_fn(**input_kwargs)),
                   "Deterministic shuffle seed with 2 input workers", f"Where: {input_fn_lines['shuffle']}",
                   "Each input worker must shuffle its data differently")


def test_input_workers_from_tf_config_count_for_the_shuffle_rule(
        make_estimator, make_input_fn, assert_refused, tf_config):
    tf_config.set({"cluster": {"chief": ["localhost:2222"], "worker": ["localhost:2223", "localhost:2224"]},
                   "task": {"type": "chief", "index": 0}})
    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError,
                   lambda: estimator.compile(make_input_fn(shuffle_seed=5), validate_only=True),
                   "Deterministic shuffle seed with 2 input workers")


@pytest.mark.parametrize("workers, seed", [(1, 5), (2, None)])
def test_seeded_shuffle_with_one_worker_or_unseeded_with_two_is_allowed(make_estimator, make_input_fn, workers, seed):
    make_estimator(num_input_workers=workers).compile(make_input_fn(shuffle_seed=seed), validate_only=True)


# --------------------------------------------------------------------------- rules 11-12 on input workers, run once


def _xy_input_fn(seed=None, python_function=False):
    """input_fn(params) over 64 examples shaped for the conftest model; shuffle(seed=seed); a tf.py_function
    in the pipeline with python_function=True."""
    def input_fn(params):
        x = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
        ds = tf.data.Dataset.from_tensor_slices((x, np.ones((64, 1), np.float32))).shuffle(64, seed=seed)
        if python_function:
            ds = ds.map(lambda f, y: (tf.reshape(tf.py_function(lambda v: v * 2, [f], tf.float32), [4]), y))
        return ds.batch(4, drop_remainder=True).repeat()

    return input_fn


def _no_servers(monkeypatch):
    from cerebras_tf.input_workers import InputServers, InputStream

    def refuse(*args, **kwargs):
        raise AssertionError("input reading or servers started before the input-worker rules ran")

    monkeypatch.setattr(InputStream, "_start", refuse)
    monkeypatch.setattr(InputServers, "for_cluster", refuse)


def test_fixed_shuffle_seed_with_two_workers_is_refused_before_servers_start(make_estimator, monkeypatch):
    _no_servers(monkeypatch)
    with pytest.raises(errors.InputFunctionError, match="Deterministic shuffle seed with 2 input workers") as info:
        make_estimator(num_input_workers=2).train(_xy_input_fn(seed=3), max_steps=1)
    assert "test_rules_input.py" in str(info.value)  # names the user's shuffle line


def test_a_global_seed_with_two_workers_is_refused_too(make_estimator, monkeypatch):
    """tf.random.set_seed fixes the seeds of the shuffles the input stream builds eagerly."""
    _no_servers(monkeypatch)
    tf.random.set_seed(5)
    try:
        with pytest.raises(errors.InputFunctionError, match="Deterministic shuffle seed") as info:
            make_estimator(num_input_workers=2).train(_xy_input_fn(), max_steps=1)
    finally:
        tf.random.set_seed(None)
    assert "global seed 5" in str(info.value)
    with pytest.raises(errors.InputFunctionError, match="Deterministic shuffle seed"):
        make_estimator(num_input_workers=2, tf_random_seed=11).train(_xy_input_fn(), max_steps=1)


def test_python_functions_are_refused_for_remote_workers(make_estimator, monkeypatch, tf_config):
    from cerebras_tf.input_workers.service import free_port

    _no_servers(monkeypatch)
    tf_config.set({"cluster": {"chief": [f"127.0.0.1:{free_port()}"],
                               "worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]},
                   "task": {"type": "chief", "index": 0}})
    estimator = make_estimator()
    with pytest.raises(errors.InputFunctionError,
                       match="tf.py_function/tf.numpy_function, which cannot run on remote") as info:
        estimator.train(_xy_input_fn(python_function=True), max_steps=1)
    assert "test_rules_input.py" in str(info.value)  # the .map(...) line that runs the Python function
    # Evaluation reads in the chief's process, and embedded workers share it: allowed.
    estimator.compile(_xy_input_fn(python_function=True), validate_only=True, mode=ModeKeys.EVAL)
    tf_config.set()  # a lone chief
    make_estimator(num_input_workers=2).compile(_xy_input_fn(python_function=True), validate_only=True)


def test_a_training_run_with_two_workers_calls_input_fn_twice_capture_and_stream(make_estimator, float32_numerics):
    """The rules run on the dataset precheck captured: the stream calls input_fn only to read it."""
    calls = []
    unseeded = _xy_input_fn()

    def counting_input_fn(params):
        calls.append(tf.executing_eagerly())
        return unseeded(params)

    make_estimator(num_input_workers=2, save_checkpoints_steps=None).train(counting_input_fn, max_steps=2)
    assert calls == [False, True]  # precheck's graph capture, then the stream (eager)


def _info(input_fn):
    from estimator import inspect_dataset

    with tf.Graph().as_default():
        return inspect_dataset(input_fn({}))


def _workers(mode, count, global_seed=None):
    from cerebras_tf.cluster import Cluster, InputPlan
    from cerebras_tf.settings import InputWorkerSettings

    return InputWorkerSettings(Cluster("localhost:2222"), InputPlan(mode, count), 120.0, global_seed)


def test_the_shuffle_seed_rule_on_a_captured_dataset():
    from cerebras_tf.rules.input import check_shuffle_seeds

    seeded, unseeded = _info(_xy_input_fn(seed=3)), _info(_xy_input_fn())
    assert check_shuffle_seeds(seeded, _workers("local", 1)) == []
    assert check_shuffle_seeds(unseeded, _workers("embedded", 2)) == []
    [problem] = check_shuffle_seeds(seeded, _workers("embedded", 2))
    assert "resolved seeds" in problem.message and "test_rules_input.py" in problem.where and problem.fix
    [problem] = check_shuffle_seeds(unseeded, _workers("cluster", 3, global_seed=7))
    assert "with 3 input workers" in problem.message and "global seed 7" in problem.message


def test_the_python_function_rule_finds_nested_functions_and_applies_to_remote_training_only():
    from cerebras_tf.rules.input import check_remote_python_functions

    def generator_input_fn(params):
        def rows():
            yield from np.ones((8, 4), np.float32)

        ds = tf.data.Dataset.from_generator(rows, output_signature=tf.TensorSpec([4], tf.float32))
        return ds.batch(4, drop_remainder=True).repeat()

    for info in (_info(_xy_input_fn(python_function=True)), _info(generator_input_fn)):
        [problem] = check_remote_python_functions(info, _workers("cluster", 2), ModeKeys.TRAIN)
        assert isinstance(problem, errors.InputFunctionError) and problem.where and problem.fix
        assert check_remote_python_functions(info, _workers("embedded", 2), ModeKeys.TRAIN) == []
        assert check_remote_python_functions(info, _workers("cluster", 2), ModeKeys.EVAL) == []
    assert check_remote_python_functions(_info(_xy_input_fn()), _workers("cluster", 2), ModeKeys.TRAIN) == []
