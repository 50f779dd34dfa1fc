"""The host-kernel providers against each other: numpy/OpenBLAS and TensorFlow's own kernels.

Where the arithmetic is the same the results are bit-identical: on integer-valued float32
operands every product and partial sum is exact, so any summation order gives the same bits,
and a mismatch can only be a wrong tap, padding, stride or layout. On general float32 operands
the two sum the products in different orders (OpenBLAS vs oneDNN blocking; im2col vs TF's
direct convolutions), so results differ by a few float32 ulps of the sum: test_linalg.py holds
both to TF's results within the float32 parity tolerance. Calls TF's CPU kernels refuse
(integer operands, dilated gradients, cropping paddings) run the numpy code on both: identical.
"""
from __future__ import annotations

import numpy as np
import pytest

from cerebras_tf import ir
from cerebras_tf.run import host_kernels_tf
from cerebras_tf.run.host_kernels_tf import TENSORFLOW_HOST_KERNELS as TF_KERNELS
from cerebras_tf.wse.kernels import NUMPY_HOST_KERNELS as NP_KERNELS
from cerebras_tf.wse.kernels import DENSE_KINDS, HostKernels
from cerebras_tf.wse.memory import empty_aligned

from test_linalg import CONV_CASES, DW_CASES, _attrs


def _ints(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.integers(-4, 5, size=shape).astype(np.float32)


def _dense_cases(rng: np.random.Generator):
    """(name, provider field, operands, attrs) for every dense kernel, on exact (integer-valued) operands."""
    for ta in (False, True):
        for tb in (False, True):
            a, b = _ints(rng, (40, 64) if ta else (64, 40)), _ints(rng, (24, 40) if tb else (40, 24))
            yield f"matmul-{ta}-{tb}", "matmul", [a, b], {"transpose_a": ta, "transpose_b": tb}
    yield "matmul-256x784x500", "matmul", [_ints(rng, (256, 784)), _ints(rng, (784, 500))], {}
    for adj in ((False, False), (True, False), (False, True)):
        a = _ints(rng, (3, 1, 6, 5) if adj[0] else (3, 1, 5, 6))
        b = _ints(rng, (4, 7, 6) if adj[1] else (4, 6, 7))
        yield f"batch_matmul-{adj}", "batch_matmul", [a, b], {"adj_x": adj[0], "adj_y": adj[1]}
    for i, (xs, fs, strides, padding, dil, explicit) in enumerate(CONV_CASES):
        attrs = _attrs(strides, padding, dil, explicit)
        x, f = _ints(rng, xs), _ints(rng, fs)
        dy = _ints(rng, NP_KERNELS.conv2d([x, f], attrs).shape)
        yield f"conv{i}", "conv2d", [x, f], attrs
        yield f"conv{i}", "conv2d_backprop_input", [f, dy], {**attrs, "input_sizes": list(xs)}
        yield f"conv{i}", "conv2d_backprop_filter", [x, dy], {**attrs, "filter_sizes": list(fs)}
    for i, (xs, fs, strides, padding) in enumerate(DW_CASES):
        attrs = {"strides": [1, *strides, 1], "padding": padding}
        x, f = _ints(rng, xs), _ints(rng, fs)
        dy = _ints(rng, NP_KERNELS.depthwise_conv2d([x, f], attrs).shape)
        yield f"dw{i}", "depthwise_conv2d", [x, f], attrs
        yield f"dw{i}", "depthwise_conv2d_backprop_input", [f, dy], {**attrs, "input_sizes": list(xs)}
        yield f"dw{i}", "depthwise_conv2d_backprop_filter", [x, dy], {**attrs, "filter_sizes": list(fs)}


CASES = list(_dense_cases(np.random.default_rng(7)))


@pytest.mark.parametrize("name,field,inputs,attrs", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_providers_are_bit_identical_where_the_arithmetic_is_exact(name, field, inputs, attrs):
    ours = getattr(NP_KERNELS, field)(inputs, attrs)
    theirs = getattr(TF_KERNELS, field)(inputs, attrs)
    assert ours.dtype == theirs.dtype == np.float32
    np.testing.assert_array_equal(ours, theirs)


def _refusing() -> HostKernels:
    def refuse(inputs, attrs):
        raise AssertionError("fell back to numpy")
    return HostKernels("refusing", **{kind: refuse for kind in DENSE_KINDS})


@pytest.mark.parametrize("name,field,inputs,attrs", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_the_tensorflow_provider_runs_tensorflow_unless_tf_refuses_the_call(name, field, inputs, attrs,
                                                                            monkeypatch):
    """...or it is a small matmul (SMALL_MATMUL_MACS: numpy's, on one OpenBLAS thread)."""
    monkeypatch.setattr(host_kernels_tf, "_numpy", _refusing())
    dilated = attrs.get("dilations", [1, 1, 1, 1]) != [1, 1, 1, 1]
    columns = inputs[1].shape[0 if attrs.get("transpose_b") else 1] if field == "matmul" else 0
    small = field == "matmul" and inputs[0].size * columns <= host_kernels_tf.SMALL_MATMUL_MACS
    if (dilated and "backprop" in field) or small:  # TF's CPU conv gradients refuse dilations
        with pytest.raises(AssertionError, match="fell back"):
            getattr(TF_KERNELS, field)(inputs, attrs)
    else:
        getattr(TF_KERNELS, field)(inputs, attrs)


def test_integer_matmul_stays_on_numpy_and_is_exact(rng):
    a = rng.integers(-1000, 1000, size=(6, 9)).astype(np.int32)
    b = rng.integers(-1000, 1000, size=(9, 4)).astype(np.int32)
    np.testing.assert_array_equal(TF_KERNELS.matmul([a, b], {}), a @ b)


def _laid_out(x: np.ndarray, layout: str) -> np.ndarray:
    """x's values in memory of the given layout."""
    if layout == "unaligned":  # 4 bytes off a 64-byte boundary: TF aborts the process on such a tensor
        buffer = empty_aligned((x.size + 1,), x.dtype)
        y = buffer[1:].reshape(x.shape)
    elif layout == "fortran":
        y = np.asfortranarray(np.empty_like(x))
    else:
        y = empty_aligned(x.shape, x.dtype)
    y[...] = x
    if layout == "read-only":
        y.flags.writeable = False
    return y


@pytest.mark.parametrize("layout", ["aligned", "unaligned", "fortran", "read-only"])
def test_tensorflow_matmuls_take_any_operand_memory_and_give_a_writable_result(rng, layout):
    import tensorflow as tf

    a, b = rng.standard_normal((256, 400)).astype(np.float32), rng.standard_normal((200, 400)).astype(np.float32)
    assert 256 * 400 * 200 > host_kernels_tf.SMALL_MATMUL_MACS  # TF's call, not OpenBLAS's
    theirs = tf.raw_ops.MatMul(a=a, b=b, transpose_b=True).numpy()
    ours = TF_KERNELS.matmul([_laid_out(a, layout), _laid_out(b, layout)], {"transpose_b": True})
    np.testing.assert_array_equal(ours, theirs)  # TF's own kernel on the same values: the same bits
    ours[0, 0] = 0.0  # the executor may write into a kernel's result
    x, y = rng.standard_normal((2, 3, 5, 4)).astype(np.float32), rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    np.testing.assert_array_equal(TF_KERNELS.batch_matmul([_laid_out(x, layout), _laid_out(y, layout)], {}),
                                  tf.raw_ops.BatchMatMulV2(x=x, y=y).numpy())


def test_nchw_convolutions_match_nhwc_on_tensorflow(rng):
    x, f = _ints(rng, (2, 7, 7, 3)), _ints(rng, (3, 3, 3, 4))
    nhwc = {"strides": [1, 2, 2, 1], "padding": "EXPLICIT", "explicit_paddings": [0, 0, 1, 0, 2, 1, 0, 0]}
    nchw = {"strides": [1, 1, 2, 2], "padding": "EXPLICIT", "explicit_paddings": [0, 0, 0, 0, 1, 0, 2, 1],
            "data_format": "NCHW"}
    y = TF_KERNELS.conv2d([x, f], nhwc)
    np.testing.assert_array_equal(TF_KERNELS.conv2d([x.transpose(0, 3, 1, 2), f], nchw).transpose(0, 2, 3, 1), y)
    dy = _ints(rng, y.shape)
    dx = TF_KERNELS.conv2d_backprop_input([f, dy.transpose(0, 3, 1, 2)], {**nchw, "input_sizes": [2, 3, 7, 7]})
    np.testing.assert_array_equal(dx.transpose(0, 2, 3, 1), NP_KERNELS.conv2d_backprop_input(
        [f, dy], {**nhwc, "input_sizes": [2, 7, 7, 3]}))
    df = TF_KERNELS.conv2d_backprop_filter([x.transpose(0, 3, 1, 2), dy.transpose(0, 3, 1, 2)],
                                           {**nchw, "filter_sizes": [3, 3, 3, 4]})
    np.testing.assert_array_equal(df, NP_KERNELS.conv2d_backprop_filter([x, dy],
                                                                        {**nhwc, "filter_sizes": [3, 3, 3, 4]}))


def _program(*kinds: str) -> ir.Program:
    kernels = [ir.Kernel(i, kind, [], [], {}) for i, kind in enumerate(kinds)]
    return ir.Program(mode="train", tensors=[], kernels=kernels, variables=[], inputs={}, outputs={})


def test_auto_takes_tensorflow_for_a_program_with_convolutions_and_numpy_otherwise():
    assert host_kernels_tf.host_kernels_for(_program("matmul", "conv2d_backprop_filter")) is TF_KERNELS
    assert host_kernels_tf.host_kernels_for(_program("matmul", "depthwise_conv2d", "relu")) is TF_KERNELS
    assert host_kernels_tf.host_kernels_for(_program("matmul", "batch_matmul", "relu")) is NP_KERNELS
    assert host_kernels_tf.host_kernels_for(_program("matmul"), "tensorflow") is TF_KERNELS
    assert host_kernels_tf.host_kernels_for(_program("conv2d"), "numpy") is NP_KERNELS


def test_the_system_provider_is_auto_unless_the_environment_names_another(monkeypatch):
    mlp, cnn = _program("matmul"), _program("conv2d", "matmul")
    monkeypatch.delenv(host_kernels_tf.ENV_VAR, raising=False)
    assert host_kernels_tf.system_host_kernels(mlp) is NP_KERNELS
    assert host_kernels_tf.system_host_kernels(cnn) is TF_KERNELS
    monkeypatch.setenv(host_kernels_tf.ENV_VAR, "numpy")
    assert host_kernels_tf.system_host_kernels(cnn) is NP_KERNELS
    monkeypatch.setenv(host_kernels_tf.ENV_VAR, "TensorFlow")
    assert host_kernels_tf.system_host_kernels(mlp) is TF_KERNELS
    monkeypatch.setenv(host_kernels_tf.ENV_VAR, "mkl")
    with pytest.raises(ValueError, match="CEREBRAS_TF_HOST_KERNELS='mkl': expected one of auto, numpy, tensorflow"):
        host_kernels_tf.system_host_kernels(mlp)


@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (True, False), (False, True)])
def test_tensorflow_provider_runs_a_small_matmul_on_one_openblas_thread(rng, transpose_a, transpose_b):
    """A matmul of at most SMALL_MATMUL_MACS multiply-adds (the zoo CNN's 64x4096x10 dense layer and its two
    gradients) is numpy's on one OpenBLAS thread: its bits, and OpenBLAS's thread count is restored after;
    one just bigger is TF's MatMul."""
    import tensorflow as tf
    import threadpoolctl

    from cerebras_tf.wse import threads

    def operands(m: int, k: int, n: int) -> list[np.ndarray]:
        a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
        return [a, b]
    attrs = {"transpose_a": transpose_a, "transpose_b": transpose_b}
    small = operands(64, 4096, 10)
    blas = threadpoolctl.ThreadpoolController().select(user_api="blas")
    before = [lib.num_threads for lib in blas.lib_controllers]
    with threads.one_blas_thread():
        expected = NP_KERNELS.matmul(small, attrs)
    np.testing.assert_array_equal(TF_KERNELS.matmul(small, attrs), expected)
    assert [lib.num_threads for lib in threadpoolctl.ThreadpoolController().select(
        user_api="blas").lib_controllers] == before
    together = TF_KERNELS.together([("matmul", small, attrs), ("matmul", small, attrs)])
    np.testing.assert_array_equal(together[0], expected)
    np.testing.assert_array_equal(together[1], expected)
    big = operands(64, 4096, 65)  # 17M multiply-adds
    np.testing.assert_array_equal(TF_KERNELS.matmul(big, attrs),
                                  tf.raw_ops.MatMul(a=big[0], b=big[1], **attrs).numpy())


def test_tensorflow_runs_kernels_together_with_the_bits_of_one_by_one(rng):
    """A convolution's input and filter gradients (and a dense layer's two) in one TF graph: TF's executor
    may run them at once, each result is the one its own call gives; with an operand TF refuses (integers),
    every kernel runs one by one."""
    x = rng.standard_normal((4, 9, 9, 5)).astype(np.float32)
    f = rng.standard_normal((3, 3, 5, 6)).astype(np.float32)
    dy = rng.standard_normal((4, 9, 9, 6)).astype(np.float32)
    attrs = _attrs([1, 1], "SAME", [1, 1], None)
    members = [("conv2d_backprop_input", [f, dy], {**attrs, "input_sizes": [4, 9, 9, 5]}),
               ("conv2d_backprop_filter", [x, dy], {**attrs, "filter_sizes": [3, 3, 5, 6]}),
               ("matmul", [dy.reshape(-1, 6), f.reshape(-1, 6)], {"transpose_b": True})]
    together = TF_KERNELS.together(members)
    assert len(together) == 3
    for (field, inputs, member_attrs), result in zip(members, together):
        np.testing.assert_array_equal(result, getattr(TF_KERNELS, field)(inputs, member_attrs), err_msg=field)
    a = rng.integers(-9, 9, size=(6, 5)).astype(np.int32)
    mixed = TF_KERNELS.together([("matmul", [a, a.T], {}), members[0]])
    np.testing.assert_array_equal(mixed[0], a @ a.T)
    np.testing.assert_array_equal(mixed[1], together[0])


def test_kernels_together_keep_each_kinds_dtype_contract(rng):
    """float16 operands multiply in float32 and each result comes back in its data operand's dtype, as the
    kernels one by one give it; a provider without `together` is refused by name."""
    from cerebras_tf.wse.kernels import KERNELS, KernelContext
    from cerebras_tf.wse.kernels.linalg import provided_together

    a = rng.standard_normal((8, 5)).astype(np.float16)
    b = rng.standard_normal((5, 3)).astype(np.float16)
    members = [("matmul", [a, b], {}), ("matmul", [a.T.copy(), a], {})]
    ctx = KernelContext(host_kernels=TF_KERNELS)
    results = provided_together(members, ctx)
    for (kind, inputs, attrs), result in zip(members, results):
        alone = KERNELS[kind](inputs, attrs, ctx)[0]
        assert result.dtype == alone.dtype == np.float16
        np.testing.assert_array_equal(result, alone)
    with pytest.raises(ValueError, match="'numpy' take no kernels together"):
        provided_together(members, KernelContext(host_kernels=NP_KERNELS))


@pytest.mark.parametrize("held", [False, True], ids=["openblas-threads", "split-by-matrices"])
@pytest.mark.parametrize("shape", [(8, 128, 4, 64), (3, 17, 5, 9)])
def test_numpy_batch_matmul_reads_and_writes_strided_matrices_with_the_bits_of_contiguous_ones(held, shape, rng):
    """Attention's operands as the executor hands them on (fusion.lazy_transposes: the heads' transposes as
    views) and its result laid out for the transpose that reads it (out_perm): the same bits as contiguous
    operands and result, split across threads or not."""
    import contextlib

    from cerebras_tf.wse import threads

    b, t, h, d = shape
    heads = [rng.standard_normal((b, t, h, d), dtype=np.float32).transpose(0, 2, 1, 3) for _ in range(3)]
    q, k, v = heads
    p = rng.standard_normal((b, h, t, t), dtype=np.float32)
    with threads.one_blas_thread() if held else contextlib.nullcontext():
        scores = NP_KERNELS.batch_matmul([q, k], {"adj_y": True})
        assert scores.flags.c_contiguous
        np.testing.assert_array_equal(
            scores, NP_KERNELS.batch_matmul([np.ascontiguousarray(q), np.ascontiguousarray(k)], {"adj_y": True}))
        context = NP_KERNELS.batch_matmul([p, v], {"out_perm": (0, 2, 1, 3)})
        heads_layout = np.transpose(context, (0, 2, 1, 3))
        assert heads_layout.flags.c_contiguous and heads_layout.ctypes.data % 64 == 0
        np.testing.assert_array_equal(context, NP_KERNELS.batch_matmul([p, np.ascontiguousarray(v)], {}))
        grad = NP_KERNELS.batch_matmul([p, q], {"adj_x": True, "out_perm": (0, 2, 1, 3)})
        np.testing.assert_array_equal(grad, NP_KERNELS.batch_matmul([p, np.ascontiguousarray(q)], {"adj_x": True}))


def test_tensorflow_batch_matmul_takes_strided_operands_and_ignores_the_layout_it_is_asked_for(rng):
    q, k = (rng.standard_normal((2, 16, 3, 8), dtype=np.float32).transpose(0, 2, 1, 3) for _ in range(2))
    expected = TF_KERNELS.batch_matmul([np.ascontiguousarray(q), np.ascontiguousarray(k)], {"adj_y": True})
    np.testing.assert_array_equal(TF_KERNELS.batch_matmul([q, k], {"adj_y": True, "out_perm": (0, 2, 1, 3)}),
                                  expected)


def test_a_calls_plan_is_made_once_per_attrs_object_and_shapes_and_follows_new_values(rng, monkeypatch):
    """The TF provider resolves a call (TF's or numpy's, the graph, the operands' layout) on its first call with
    given attrs (the object) and operand shapes, then reuses it: new operand values give the results a fresh
    call gives; other shapes, other attrs with other values, and an attrs dict equal to one seen before each
    get a plan of their own, so no reuse can take another call's attrs (NCHW, padding, strides)."""
    made = []
    plan = host_kernels_tf._plan
    monkeypatch.setattr(host_kernels_tf, "_plan", lambda members: made.append(members) or plan(members))
    monkeypatch.setattr(host_kernels_tf, "_plans", host_kernels_tf._Plans())
    same = {"strides": [1, 1, 1, 1], "padding": "SAME", "data_format": "NCHW"}
    valid = {"strides": [1, 1, 2, 2], "padding": "VALID", "data_format": "NCHW"}
    f = _ints(rng, (3, 3, 5, 6))
    for attrs, shape in ((same, (2, 5, 9, 9)), (same, (2, 5, 9, 9)), (valid, (2, 5, 9, 9)), (same, (3, 5, 7, 7)),
                         (dict(same), (2, 5, 9, 9))):
        x = _ints(rng, shape)
        np.testing.assert_array_equal(TF_KERNELS.conv2d([x, f], attrs), NP_KERNELS.conv2d([x, f], attrs))
    assert len(made) == 4  # the second call reused the first one's plan
    a, plain = _ints(rng, (6, 5)), {}
    for _ in range(2):  # a call TF refuses (integers) and a small matmul on OpenBLAS are planned once too
        np.testing.assert_array_equal(TF_KERNELS.matmul([a.astype(np.int32), a.T.astype(np.int32)], plain), a @ a.T)
        np.testing.assert_array_equal(TF_KERNELS.matmul([a, a.T], plain), a @ a.T)
    assert len(made) == 6
