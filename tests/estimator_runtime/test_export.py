"""estimator.runtime's export_saved_model: the SavedModel, loaded back with tf.compat.v1, serves predict()'s values.

Runs on every supported TensorFlow; where tf.estimator exists (TF <= 2.15) the
same model is also exported with it and the two SavedModels are compared.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import runtime_models as models
from estimator import runtime
from estimator.runtime import Estimator, EstimatorSpec, ModeKeys

try:
    from tensorflow_estimator import estimator as tfe
except ImportError:  # TF >= 2.16
    tfe = None

needs_tf_estimator = pytest.mark.skipif(tfe is None, reason="tf.estimator is not installed (TF >= 2.16)")


def _tensor_receiver_fn(api: Any = runtime) -> Any:
    def serving_input_receiver_fn():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        return api.export.TensorServingInputReceiver(x, {"x": x})

    return serving_input_receiver_fn


def _trained(api: Any, model_dir: str, model_fn_factory: Any = models.dense_model_fn,
             input_fn: Any = None) -> Any:
    estimator = api.Estimator(model_fn_factory(api), model_dir=model_dir, config=api.RunConfig(tf_random_seed=5),
                              params={"lr": 0.05})
    estimator.train(input_fn or models.input_fn(), max_steps=6)
    return estimator


def _serve(export_dir: Any, feed: dict[str, np.ndarray], signature: str = "serving_default",
           tags: tuple[str, ...] = ("serve",)) -> dict[str, np.ndarray]:
    """Load the SavedModel into a fresh graph and session and run `signature` on `feed` (by input key)."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.load(session, list(tags), tf.compat.as_str_any(export_dir))
        sig = meta_graph.signature_def[signature]
        return session.run({key: info.name for key, info in sig.outputs.items()},
                           {sig.inputs[key].name: value for key, value in feed.items()})


def _signatures(export_dir: Any, tags: tuple[str, ...] = ("serve",)) -> dict[str, Any]:
    """{signature key: (method, {input key: (dtype, shape)}, {output key: (dtype, shape)})} of a SavedModel."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.load(session, list(tags), tf.compat.as_str_any(export_dir))

    def described(infos: Any) -> dict[str, Any]:
        return {key: (info.dtype, [d.size for d in info.tensor_shape.dim]) for key, info in infos.items()}

    return {key: (sig.method_name, described(sig.inputs), described(sig.outputs))
            for key, sig in meta_graph.signature_def.items()}


def _predicted(estimator: Any, input_fn: Any = models.predict_input_fn) -> dict[str, np.ndarray]:
    batches = list(estimator.predict(input_fn, yield_single_examples=False))
    return {key: np.concatenate([batch[key] for batch in batches]) for key in batches[0]}


def test_export_then_serve_equals_predict(tmp_path):
    estimator = _trained(runtime, str(tmp_path / "model"))
    export_dir = estimator.export_saved_model(str(tmp_path / "export"), _tensor_receiver_fn())
    assert isinstance(export_dir, bytes)
    path = tf.compat.as_str_any(export_dir)
    assert os.path.dirname(path) == str(tmp_path / "export") and os.path.basename(path).isdigit()
    assert sorted(os.listdir(path)) == ["saved_model.pb", "variables"]
    assert not [name for name in os.listdir(tmp_path / "export") if name.startswith("temp-")]
    served = _serve(export_dir, {"x": models.X})
    expected = _predicted(estimator)
    assert served.keys() == expected.keys() == {"y", "hidden"}
    for key in expected:
        np.testing.assert_allclose(served[key], expected[key], rtol=1e-6, atol=1e-6)


def test_export_reads_the_checkpoint_asked_for(tmp_path):
    estimator = _trained(runtime, str(tmp_path / "model"))
    first = estimator.latest_checkpoint()
    estimator.train(models.input_fn(), steps=5)
    old = _serve(estimator.export_saved_model(str(tmp_path / "old"), _tensor_receiver_fn(), checkpoint_path=first),
                 {"x": models.X})
    new = _serve(estimator.export_saved_model(str(tmp_path / "new"), _tensor_receiver_fn()), {"x": models.X})
    np.testing.assert_allclose(new["y"], _predicted(estimator)["y"], rtol=1e-6, atol=1e-6)
    assert not np.allclose(old["y"], new["y"])
    from_first = np.concatenate([b["y"] for b in estimator.predict(models.predict_input_fn, checkpoint_path=first,
                                                                   yield_single_examples=False)])
    np.testing.assert_allclose(old["y"], from_first, rtol=1e-6, atol=1e-6)


def test_raw_and_parsing_receivers_serve_dict_features(tmp_path):
    estimator = _trained(runtime, str(tmp_path / "model"), input_fn=models.dict_input_fn())
    expected = _predicted(estimator, lambda: tf.data.Dataset.from_tensor_slices(
        {"a": models.X[:, :2], "b": models.X[:, 2:]}).batch(4))
    raw_fn = runtime.build_raw_serving_input_receiver_fn(
        {"a": tf.constant(models.X[:, :2]), "b": tf.constant(models.X[:, 2:])})
    served = _serve(estimator.export_saved_model(str(tmp_path / "raw"), raw_fn), {"a": models.X[:, :2],
                                                                                  "b": models.X[:, 2:]})
    np.testing.assert_allclose(served["y"], expected["y"], rtol=1e-6, atol=1e-6)
    spec = {"a": tf.io.FixedLenFeature([2], tf.float32), "b": tf.io.FixedLenFeature([1], tf.float32)}
    parsing_fn = runtime.build_parsing_serving_input_receiver_fn(spec)
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "a": tf.train.Feature(float_list=tf.train.FloatList(value=row[:2])),
        "b": tf.train.Feature(float_list=tf.train.FloatList(value=row[2:])),
    })).SerializeToString() for row in models.X]
    served = _serve(estimator.export_saved_model(str(tmp_path / "parsing"), parsing_fn),
                    {"examples": np.array(examples, dtype=object)})
    np.testing.assert_allclose(served["y"], expected["y"], rtol=1e-6, atol=1e-6)


def _export_outputs_model_fn(features, labels, mode):
    w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.compat.v1.ones_initializer())
    y = tf.matmul(features, w)
    if mode == ModeKeys.PREDICT:
        outputs = {"serving_default": runtime.export.PredictOutput({"y": y}),
                   "doubled": runtime.export.PredictOutput({"z": 2 * y})}
        return EstimatorSpec(mode, predictions={"y": y}, export_outputs=outputs)
    loss = tf.reduce_mean(tf.square(y - labels))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops={
        "mae": tf.compat.v1.metrics.mean_absolute_error(labels, y)})


def test_signatures_come_from_export_outputs(tmp_path):
    estimator = Estimator(_export_outputs_model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(models.input_fn(), steps=2)
    export_dir = estimator.export_saved_model(str(tmp_path / "export"), _tensor_receiver_fn())
    signatures = _signatures(export_dir)
    assert sorted(signatures) == ["doubled", "serving_default"]
    assert signatures["serving_default"] == ("tensorflow/serving/predict", {"x": (tf.float32, [-1, 3])},
                                             {"y": (tf.float32, [-1, 1])})
    served = _serve(export_dir, {"x": models.X})
    np.testing.assert_allclose(served["y"], _predicted(estimator)["y"], rtol=1e-6)
    np.testing.assert_allclose(_serve(export_dir, {"x": models.X}, "doubled")["z"], 2 * served["y"], rtol=1e-6)


def test_export_errors_and_extras(tmp_path):
    estimator = Estimator(models.dense_model_fn(runtime), model_dir=str(tmp_path / "model"), params={})
    with pytest.raises(ValueError, match="^An input_receiver_fn must be defined.$"):
        estimator.export_saved_model(str(tmp_path / "export"), None)
    with pytest.raises(ValueError) as raised:
        estimator.export_saved_model(str(tmp_path / "export"), _tensor_receiver_fn())
    assert str(raised.value) == f"Couldn't find trained model at {tmp_path / 'model'}."
    assert not (tmp_path / "export").exists()
    estimator.train(models.input_fn(), steps=1)
    asset = tmp_path / "vocab.txt"
    asset.write_text("a\nb\n")
    export_dir = tf.compat.as_str_any(estimator.export_saved_model(
        str(tmp_path / "export"), _tensor_receiver_fn(), assets_extra={"sub/vocab.txt": str(asset)}, as_text=True))
    assert sorted(os.listdir(export_dir)) == ["assets.extra", "saved_model.pbtxt", "variables"]
    assert (tmp_path / "export" / os.path.basename(export_dir) / "assets.extra" / "sub" / "vocab.txt").read_text() \
        == "a\nb\n"
    np.testing.assert_allclose(_serve(export_dir, {"x": models.X})["y"], _predicted(estimator)["y"], rtol=1e-6)

    def other_model_fn(features, labels, mode, params):  # a variable the checkpoint does not have
        tf.compat.v1.get_variable("not_trained", [1])
        return models.dense_model_fn(runtime)(features, labels, mode, params)

    other = Estimator(other_model_fn, model_dir=str(tmp_path / "model"), params={})
    with pytest.raises(ValueError, match="Could not load all requested variables from checkpoint"):
        other.export_saved_model(str(tmp_path / "other"), _tensor_receiver_fn())


def test_export_all_saved_models_has_a_meta_graph_per_mode(tmp_path):
    estimator = Estimator(_export_outputs_model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(models.input_fn(), steps=2)

    def supervised_fn():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        return runtime.receivers.SupervisedInputReceiver(x, y, {"x": x, "y": y})

    export_dir = estimator.experimental_export_all_saved_models(str(tmp_path / "export"), {
        ModeKeys.TRAIN: supervised_fn, ModeKeys.EVAL: supervised_fn, ModeKeys.PREDICT: _tensor_receiver_fn()})
    assert sorted(_signatures(export_dir, ("train",))) == ["train"]
    assert sorted(_signatures(export_dir, ("eval",))) == ["eval"]
    outputs = _serve(export_dir, {"x": models.X, "y": models.Y}, "eval", ("eval",))
    assert "loss" in outputs and "metrics/mae/value" in outputs
    np.testing.assert_allclose(_serve(export_dir, {"x": models.X})["y"], _predicted(estimator)["y"], rtol=1e-6)
    with pytest.raises(ValueError, match="No valid modes for exporting found"):
        estimator.experimental_export_all_saved_models(str(tmp_path / "none"), {"bogus": supervised_fn})


@needs_tf_estimator
@pytest.mark.parametrize("receiver", ["tensor", "raw"])
def test_the_export_matches_tf_estimators(tmp_path, receiver):
    input_fn = models.input_fn() if receiver == "tensor" else models.dict_input_fn()
    feed = {"x": models.X} if receiver == "tensor" else {"a": models.X[:, :2], "b": models.X[:, 2:]}
    results = []
    for name, api in (("runtime", runtime), ("tf.estimator", tfe)):
        estimator = _trained(api, str(tmp_path / name), input_fn=input_fn)
        if receiver == "tensor":
            receiver_fn = _tensor_receiver_fn(api)
        else:
            receiver_fn = api.export.build_raw_serving_input_receiver_fn(
                {"a": tf.constant(models.X[:, :2]), "b": tf.constant(models.X[:, 2:])})
        export_dir = estimator.export_saved_model(str(tmp_path / f"{name}-export"), receiver_fn)
        results.append((sorted(os.listdir(export_dir)), _signatures(export_dir), _serve(export_dir, feed)))
    (files, signatures, served), (tf_files, tf_signatures, tf_served) = results
    assert files == tf_files
    assert signatures == tf_signatures
    for key in tf_served:
        np.testing.assert_allclose(served[key], tf_served[key], rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- receivers

_BAD_RECEIVERS = [
    ("ServingInputReceiver", lambda t: dict(features=None, receiver_tensors=t), "features must be defined."),
    ("ServingInputReceiver", lambda t: dict(features=t, receiver_tensors=None), "receiver_tensors must be defined."),
    ("ServingInputReceiver", lambda t: dict(features={"a": 1.0}, receiver_tensors=t),
     "feature a must be a Tensor, SparseTensor, or RaggedTensor."),
    ("ServingInputReceiver", lambda t: dict(features={1.5: t}, receiver_tensors=t),
     "feature keys must be strings or ints: 1.5."),
    ("ServingInputReceiver", lambda t: dict(features=t, receiver_tensors={1: t}),
     "receiver_tensor keys must be strings: 1."),
    ("ServingInputReceiver", lambda t: dict(features=t, receiver_tensors={"x": "no"}),
     "receiver_tensor x must be a Tensor, SparseTensor, or RaggedTensor."),
    ("ServingInputReceiver", lambda t: dict(features=t, receiver_tensors=t, receiver_tensors_alternatives=[t]),
     None),  # message names the list: checked by prefix below
    ("TensorServingInputReceiver", lambda t: dict(features=None, receiver_tensors=t), "features must be defined."),
    ("TensorServingInputReceiver", lambda t: dict(features={"a": t}, receiver_tensors=t),
     "feature must be a Tensor, SparseTensor, or RaggedTensor."),
]


@pytest.mark.parametrize("case", range(len(_BAD_RECEIVERS)))
def test_receivers_refuse_what_tf_estimator_refuses(case):
    cls_name, make_kwargs, message = _BAD_RECEIVERS[case]
    apis = [runtime] + ([tfe] if tfe is not None else [])
    messages = []
    for api in apis:
        with tf.Graph().as_default():
            tensor = tf.compat.v1.placeholder(tf.float32, [None, 3])
            with pytest.raises(ValueError) as raised:
                getattr(api.export, cls_name)(**make_kwargs(tensor))
            messages.append(str(raised.value))
    if message is None:
        assert messages[0].startswith("receiver_tensors_alternatives must be a dict: [")
    else:
        assert messages[0] == message
    assert len(set(messages)) == 1 or message is None, messages  # tf.estimator says the same


def test_receivers_wrap_single_tensors_as_tf_estimator_does():
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        receiver = runtime.ServingInputReceiver(x, x, {"alt": x})
        assert receiver.features == {"feature": x} and receiver.receiver_tensors == {"input": x}
        assert receiver.receiver_tensors_alternatives == {"alt": {"input": x}}
        tensor_receiver = runtime.TensorServingInputReceiver(x, {"x": x})
        assert tensor_receiver.features is x and tensor_receiver.receiver_tensors == {"x": x}
        sparse = tf.sparse.SparseTensor([[0, 0]], [1.0], [1, 3])
        assert runtime.ServingInputReceiver({"s": sparse, 7: x}, {"x": x}).features == {"s": sparse, 7: x}
        receiver = runtime.build_raw_serving_input_receiver_fn({"a": tf.zeros([4, 2])}, default_batch_size=8)()
        assert receiver.features["a"].shape.as_list() == [8, 2] and receiver.features["a"].op.type == "Placeholder"
        receiver = runtime.build_parsing_serving_input_receiver_fn({"a": tf.io.FixedLenFeature([2], tf.float32)})()
        assert list(receiver.receiver_tensors) == ["examples"]
        assert receiver.receiver_tensors["examples"].op.name == "input_example_tensor"
        assert receiver.features["a"].shape.as_list() == [None, 2]
