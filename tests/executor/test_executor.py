"""The numpy executor runs compiled training programs with TensorFlow's numerics."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from estimator import EstimatorSpec
from cerebras_tf import CerebrasEstimator, CSRunConfig, ir
from cerebras_tf.amp import GradScaler, round_to_half
from cerebras_tf.compiler import initial
from cerebras_tf.run.host_kernels_tf import TENSORFLOW_HOST_KERNELS
from cerebras_tf.precheck import precheck
from cerebras_tf.wse.executor import Executor
from cerebras_tf.wse.kernels import KERNELS, NUMPY_HOST_KERNELS
from estimator import ModeKeys

BATCH, STEPS = 16, 12
PROVIDERS = pytest.mark.parametrize("host_kernels", [NUMPY_HOST_KERNELS, TENSORFLOW_HOST_KERNELS], ids=lambda p: p.name)


def _input_fn(params):
    rng = np.random.RandomState(0)
    x = rng.randn(256, 10).astype(np.float32)
    y = (x[:, :3].sum(axis=1) > 0).astype(np.int32) + (x[:, 3] > 1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)


def _model_fn(features, labels, mode, params):
    init = tf.compat.v1.glorot_uniform_initializer(seed=3)
    hidden = tf.compat.v1.layers.dense(features, 32, activation=tf.nn.relu, kernel_initializer=init, name="fc1")
    hidden = tf.compat.v1.layers.dense(hidden, 16, activation=tf.nn.tanh, kernel_initializer=init, name="fc2")
    logits = tf.compat.v1.layers.dense(hidden, 3, kernel_initializer=init, name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = params.get("optimizer", "adam")
    opt = (tf.compat.v1.train.AdamOptimizer(0.01) if optimizer == "adam"
           else tf.compat.v1.train.MomentumOptimizer(0.05, 0.9))
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


def _compiled(tmp_path, casts: bool, optimizer: str = "adam", model_fn=_model_fn, input_fn=_input_fn,
              params=None):
    estimator = CerebrasEstimator(model_fn, model_dir=str(tmp_path / "model"),
                                  config=CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1),
                                  params=params or {"optimizer": optimizer})
    model = precheck(estimator, input_fn, ModeKeys.TRAIN)
    result = estimator.compile(input_fn, validate_only=not casts)
    return model, result.program, initial.initial_values(model, result.program)


def _tensorflow_reference(model, steps: int):
    """Run the captured graph itself in TF: the batches it drew, its losses and final variables."""
    graph = model.graph
    with graph.as_default():
        iterator_init = [op for op in graph.get_operations() if op.type == "MakeIterator"]
        variables = tf.compat.v1.global_variables()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run([tf.compat.v1.global_variables_initializer(), iterator_init])
            runs = [session.run([model.features, model.labels, model.spec.loss, model.spec.train_op])
                    for _ in range(steps)]
            final = dict(zip([v.op.name for v in variables], session.run(variables)))
    return [(f, l) for f, l, _, _ in runs], [loss for _, _, loss, _ in runs], final


@PROVIDERS
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_float32_training_matches_tensorflow_step_by_step(tmp_path, optimizer, host_kernels):
    model, program, start = _compiled(tmp_path, casts=False, optimizer=optimizer)
    batches, tf_losses, tf_final = _tensorflow_reference(model, STEPS)
    executor = Executor(program, start, host_kernels=host_kernels)
    losses = [executor.step(f, l).loss for f, l in batches]
    np.testing.assert_allclose(losses, tf_losses, rtol=1e-5)
    final = executor.variables()
    assert executor.global_step == STEPS
    for name, value in tf_final.items():
        np.testing.assert_allclose(final[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@PROVIDERS
def test_float32_cnn_training_matches_tensorflow_step_by_step(tmp_path, host_kernels):
    """The zoo CNN (convolutions and both their gradients, batch norm, pooling, Momentum) on each
    host-kernel provider: the convolutions' float32 results stay within the parity tolerance of TF's.
    Four steps: the two sides sum in different orders, and once a last-bit difference flips a max-pool
    near-tie the trajectories part by ~1e-4 a step (seen once, in a suite run, at step 5 of 12)."""
    from examples.zoo import cnn
    params = {"batch_size": 8, "image_size": 12, "filters": [4, 8, 8], "num_examples": 64}
    model, program, start = _compiled(tmp_path, casts=False, model_fn=cnn.model_fn, input_fn=cnn.input_fn,
                                      params=params)
    assert {"conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"} <= {k.kind for k in program.kernels}
    batches, tf_losses, tf_final = _tensorflow_reference(model, 4)
    executor = Executor(program, start, host_kernels=host_kernels)
    losses = [executor.step(f, l).loss for f, l in batches]
    np.testing.assert_allclose(losses, tf_losses, rtol=1e-5)
    final = executor.variables()
    for name, value in tf_final.items():
        # float32 rounding relative to each variable's scale: a momentum slot is a sum of gradients, and
        # its elements that nearly cancel keep the sum's absolute rounding error, not a relative one
        atol = 1e-6 + 1e-5 * float(np.abs(value).max())
        np.testing.assert_allclose(final[name], value, rtol=1e-5, atol=atol, err_msg=name)


@pytest.mark.parametrize("provider", ["tensorflow", "numpy"])
def test_kernels_side_by_side_give_the_results_of_one_at_a_time(tmp_path, provider):
    """Kernels whose inputs are ready run at once on two threads (wse/dataflow.py); the weights, loss-scale
    state and losses after a few float16 steps are those of running every kernel in turn, bit for bit."""
    from examples.zoo import cnn
    params = {"batch_size": 8, "image_size": 12, "filters": [4, 8, 8], "num_examples": 64}
    model, program, start = _compiled(tmp_path, casts=True, model_fn=cnn.model_fn, input_fn=cnn.input_fn,
                                      params=params)
    batches = [b for b, _ in zip(cnn.input_fn(params).as_numpy_iterator(), range(4))]
    host_kernels = TENSORFLOW_HOST_KERNELS if provider == "tensorflow" else None
    finals, losses = [], []
    for threads in (2, 1):
        executor = Executor(program, start, grad_scaler=GradScaler(loss_scale="dynamic"), host_kernels=host_kernels,
                            threads=threads)
        losses.append([executor.step(features, labels).outputs["loss"] for features, labels in batches])
        finals.append(executor.variables())
    np.testing.assert_array_equal(losses[0], losses[1])
    for name, value in finals[0].items():
        np.testing.assert_array_equal(value, finals[1][name], err_msg=name)


def test_half_precision_rounds_matmul_inputs_and_still_learns(tmp_path):
    model, program, start = _compiled(tmp_path, casts=True)
    assert any(k.kind == "to_half" for k in program.kernels)
    batches, tf_losses, _ = _tensorflow_reference(model, 40)
    executor = Executor(program, start, grad_scaler=GradScaler(loss_scale="dynamic"), half_dtype="float16")
    losses = [executor.step(f, l).loss for f, l in batches]
    assert losses[0] == pytest.approx(tf_losses[0], rel=1e-2)  # only rounding differs
    assert not np.allclose(losses[:5], tf_losses[:5], rtol=1e-7)  # ... but it does differ
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])


def test_an_overflowing_step_changes_no_weight_and_lowers_the_scale(tmp_path):
    model, program, start = _compiled(tmp_path, casts=True)
    batches, _, _ = _tensorflow_reference(model, 3)
    scaler = GradScaler(loss_scale="dynamic", init_scale=2.0**15, steps_per_increase=1000)
    executor = Executor(program, start, grad_scaler=scaler, half_dtype="float16")
    executor.step(*batches[0])
    before = executor.variables()
    features, labels = batches[1]
    result = executor.step(np.full_like(features, 6e4), labels)  # float16 activations overflow
    assert not result.finite
    after = executor.variables()
    changed = [name for name in before if not np.array_equal(before[name], after[name])]
    assert changed == [program.global_step]  # only the step counter moved
    assert scaler.scale == 2.0**14
    assert executor.step(*batches[2]).finite  # training goes on


def test_wrong_batch_shape_is_refused_with_the_compiled_shape(tmp_path):
    _, program, start = _compiled(tmp_path, casts=False)
    with pytest.raises(ValueError, match=r"features has shape \[3, 10\].*\[16, 10\]"):
        Executor(program, start).step(np.zeros((3, 10), np.float32), np.zeros(3, np.int32))


def test_round_to_half_is_what_to_half_kernels_apply():
    x = np.array([1.0 + 2.0**-12, 65519.0, 1e-8], np.float32)
    np.testing.assert_array_equal(round_to_half(x, "float16"), x.astype(np.float16).astype(np.float32))


def test_the_gradient_seed_drives_every_gradient(tmp_path):
    """Loss scaling multiplies the seed: with a doubled seed, the first momentum update doubles exactly."""
    model, program, start = _compiled(tmp_path, casts=False, optimizer="momentum")
    batches, _, _ = _tensorflow_reference(model, 1)
    plain = Executor(program, start)
    plain.step(*batches[0])
    program.kernels[program.gradient_seed].attrs["value"] = 2.0
    doubled = Executor(program, start)
    doubled.step(*batches[0])
    for variable in program.variables:
        if variable.role == "trainable":
            delta = plain.variables()[variable.name] - start[variable.name]
            np.testing.assert_allclose(doubled.variables()[variable.name] - start[variable.name], 2 * delta,
                                       rtol=1e-4, atol=1e-7, err_msg=variable.name)
            assert np.abs(delta).max() > 0


def test_fused_relus_give_the_results_of_the_kernels_one_at_a_time(tmp_path, monkeypatch):
    """The zoo CNN's fused_batch_norm -> relu, max_pool_grad and avg_pool_grad -> relu_grad run fused, its bias_add
    -> relu runs folded into the average pool and its gradient (bias_relu_pools), its max pool in the batch
    norm's unit where it keeps its winning taps (batch_norm_relu_pools), with the half rounding of its output
    as the pool writes it (BatchNormReluPool.rounding), the half rounding after its avg_pool rounds its output
    in place and the one after fused_batch_norm_grad as the kernel writes dx
    (fused.ROUNDED_AS_WRITTEN; in place after it in the second run), the one of its conv block's gradient beside
    that gradient's bias_add_grad (fused.ROUNDED_BESIDE) (wse/fusion.py), and the max_pool_grad
    routes its gradients by the winning taps its max pool kept
    (winning_taps), or reads its window maxima from the pool's output (known_maxima); the losses and weights
    after a few float16 steps are those of the unfused kernels, bit for bit."""
    from cerebras_tf.wse import executor as executor_module
    from cerebras_tf.wse.fusion import WITH_KNOWN_MAXIMA
    from cerebras_tf.wse.kernels.pool import WinningTaps
    from examples.zoo import cnn
    params = {"batch_size": 8, "image_size": 12, "filters": [4, 8, 8], "num_examples": 64}
    model, program, start = _compiled(tmp_path, casts=True, model_fn=cnn.model_fn, input_fn=cnn.input_fn,
                                      params=params)
    batches = [b for b, _ in zip(cnn.input_fn(params).as_numpy_iterator(), range(4))]
    runs = []
    for fuse in ("taps", "maxima", "none"):
        if fuse != "taps":
            monkeypatch.setattr(executor_module, "winning_taps", lambda *args, **kw: {})
            monkeypatch.setattr(executor_module, "ROUNDED_AS_WRITTEN", {})
        if fuse == "none":
            monkeypatch.setattr(executor_module, "fused_pairs", lambda *args, **kw: {})
            monkeypatch.setattr(executor_module, "rounding_pairs", lambda *args, **kw: {})
            monkeypatch.setattr(executor_module, "known_maxima", lambda *args, **kw: set())
            monkeypatch.setattr(executor_module, "roundings_beside_sums", lambda *args, **kw: {})
        executor = Executor(program, start, grad_scaler=GradScaler(loss_scale="dynamic"))
        beside = [(p.kernel.kind, p.beside.kind) for plan in executor._plans for p in plan if p.beside]
        assert beside == ([("bias_add_grad", "to_half")] if fuse != "none" else [])
        pool_grads = [p.fn for plan in executor._plans for p in plan if p.kernel.kind == "max_pool_grad"]
        norm_grads = [p.fn.__qualname__ for plan in executor._plans for p in plan
                      if p.kernel.kind == "fused_batch_norm_grad"]
        assert norm_grads == [{"taps": "rounded_batch_norm_grad.<locals>.kernel",
                               "maxima": "Executor._rounding_in_place.<locals>.rounding",
                               "none": "fused_batch_norm_grad"}[fuse]]
        if fuse == "taps":
            taps, = set(executor._winning_taps.values())
            assert isinstance(taps, WinningTaps) and taps.relu_grad
            # the pool runs in the batch norm's unit, its gradient from the taps and its gradient input alone
            assert [len(p.inputs) for plan in executor._plans for p in plan if p.kernel.kind == "max_pool_grad"] == [1]
            # and the unit hands on the pooled output rounded: the to_half after the pool runs as no unit
            assert [program.tensors[p.outputs[0]].dtype for plan in executor._plans for p in plan
                    if p.kernel.kind == "fused_batch_norm"] == [ir.HALF]
        else:
            assert pool_grads == ([WITH_KNOWN_MAXIMA["relu_grad"]] if fuse == "maxima" else [KERNELS["max_pool_grad"]])
        fused = sorted((p.kernel.kind, p.tail.kind) for plan in executor._plans for p in plan if p.tail)
        assert fused == ([("avg_pool", "to_half"), ("avg_pool_grad", "relu_grad"),
                          ("fused_batch_norm", "max_pool" if fuse == "taps" else "relu"),
                          ("fused_batch_norm_grad", "to_half"), ("max_pool_grad", "relu_grad")]
                         if fuse != "none" else [])
        losses = [executor.step(features, labels).loss for features, labels in batches]
        runs.append((losses, executor.variables()))
    for other in runs[1:]:
        assert runs[0][0] == other[0]
        for name, value in runs[0][1].items():
            np.testing.assert_array_equal(value, other[1][name], err_msg=name)


@pytest.mark.parametrize("half_dtype", ["float32", "float16"])
def test_dense_kernels_run_together_give_the_results_of_one_by_one(tmp_path, half_dtype):
    """With TensorFlow's kernels, the zoo CNN's input and filter gradients of each convolution and its dense
    layer's two gradients each run in one provider call (fusion.dense_groups); the losses and weights after a
    few steps are those of the kernels called one by one, bit for bit."""
    import dataclasses

    from examples.zoo import cnn
    params = {"batch_size": 8, "image_size": 12, "filters": [4, 8, 8], "num_examples": 64}
    model, program, start = _compiled(tmp_path, casts=True, model_fn=cnn.model_fn, input_fn=cnn.input_fn,
                                      params=params)
    batches = [b for b, _ in zip(cnn.input_fn(params).as_numpy_iterator(), range(3))]
    runs = []
    for provider in (TENSORFLOW_HOST_KERNELS, dataclasses.replace(TENSORFLOW_HOST_KERNELS, together=None)):
        executor = Executor(program, start, half_dtype=half_dtype, host_kernels=provider)
        grouped = sorted((p.kernel.kind, p.beside.kind) for plan in executor._plans for p in plan if p.beside)
        rounded_beside = [("bias_add_grad", "to_half")] if half_dtype != "float32" else []  # not the provider's
        assert grouped == sorted([("conv2d_backprop_input", "conv2d_backprop_filter")] * 2 + [("matmul", "matmul")]
                                 + rounded_beside if provider.together else rounded_beside)
        losses = [executor.step(features, labels).loss for features, labels in batches]
        runs.append((losses, executor.variables()))
    assert runs[0][0] == runs[1][0]
    for name, value in runs[0][1].items():
        np.testing.assert_array_equal(value, runs[1][1][name], err_msg=name)


def test_the_variables_start_on_64_byte_boundaries():
    """TF's kernels (the "tensorflow" provider) copy an operand that is not 64-byte aligned, and a weight goes
    to them as it is (its to_half, with the half dtype float32, hands on the variable's own array)."""
    tensors = [ir.Tensor(0, [4, 3], "float32", "features", None)]
    variables = [ir.Variable(f"v{i}", [i + 1, 3], "float32", True, "trainable") for i in range(4)]
    program = ir.Program(mode="infer", tensors=tensors, kernels=[], variables=variables, inputs={"features": 0},
                         outputs={"predictions": 0})
    buffer = np.arange(64, dtype=np.float32)
    given = {f"v{i}": buffer[i + 1:i + 1 + 3 * (i + 1)].reshape(i + 1, 3) for i in range(4)}  # 4-60 bytes past
    executor = Executor(program, given)
    for name, value in given.items():
        assert executor._variables[name].ctypes.data % 64 == 0
        np.testing.assert_array_equal(executor._variables[name], value)
        assert executor._variables[name].dtype == np.float32 and executor._variables[name].flags.c_contiguous


@pytest.mark.parametrize("written_before_use", [False, True])
def test_a_read_of_a_variable_not_written_before_its_use_runs_as_no_unit(written_before_use):
    """y = read(v) * x. A read whose value is used before the variable's next write is the variable's own array,
    bound when the step starts (no unit runs it); with an assign v <- x between the read and its use, the read
    is a unit that copies, and y takes v's value from before the assign."""
    tensors = [ir.Tensor(0, [3], "float32", "features", None), ir.Tensor(1, [3], "float32", "v_read", None),
               ir.Tensor(2, [3], "float32", "y", None)]
    kernels = [ir.Kernel(0, "read_variable", [], [1], {}, vars=["v"])]
    if written_before_use:
        kernels.append(ir.Kernel(1, "assign_variable", [0], [], {}, role="state_update", vars=["v"]))
    kernels.append(ir.Kernel(len(kernels), "mul", [1, 0], [2], {}))
    program = ir.Program(mode="train", tensors=tensors, kernels=kernels,
                         variables=[ir.Variable("v", [3], "float32", False, "state")], inputs={"features": 0},
                         outputs={"loss": 2})
    executor = Executor(program, {"v": np.array([1, 2, 3], np.float32)})
    units = [p.kernel.kind for plan in executor._plans for p in plan]
    assert ("read_variable" in units) == written_before_use
    x = np.array([2, 2, 2], np.float32)
    for expected in ([2, 4, 6], [4, 4, 4] if written_before_use else [2, 4, 6]):
        np.testing.assert_array_equal(executor.step(x).outputs["loss"], expected)
    executor._variables["v"][...] = 5  # a bound read is the variable's array: the next step sees this
    np.testing.assert_array_equal(executor.step(x).outputs["loss"], [10, 10, 10])


def test_a_rounding_in_place_never_writes_into_an_input(monkeypatch):
    """Should a kind that rounds in place hand out its input (a transpose by the identity permutation does,
    which is why it is not such a kind), the to_half after it rounds into a new array and the batch's array
    is left as it was."""
    from cerebras_tf.wse import fusion

    monkeypatch.setattr(fusion, "ROUNDS_IN_PLACE", fusion.ROUNDS_IN_PLACE | {"transpose"})
    tensors = [ir.Tensor(0, [3, 4], "float32", "x", None), ir.Tensor(1, [3, 4], "float32", "t", None),
               ir.Tensor(2, [3, 4], "float32", "h", None)]
    kernels = [ir.Kernel(0, "transpose", [0], [1], {"perm": [0, 1]}), ir.Kernel(1, "to_half", [1], [2], {})]
    program = ir.Program(mode="eval", tensors=tensors, kernels=kernels, variables=[], inputs={"features": 0},
                         outputs={"predictions": 2})
    executor = Executor(program, {}, half_dtype="float16")
    assert [(p.kernel.kind, p.tail.kind) for plan in executor._plans for p in plan if p.tail] == [
        ("transpose", "to_half")]
    x = np.full((3, 4), 1 / 3, np.float32)
    rounded = executor.step(x).outputs["predictions"]
    assert (x == np.float32(1 / 3)).all()
    assert (rounded == np.float32(np.float16(1 / 3))).all()
