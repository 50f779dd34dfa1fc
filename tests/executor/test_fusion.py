"""What the executor fuses (wse/fusion.py): a tail that is the only reader of its producer's first output,
where nothing else needs that output; in-place roundings, provider groups, known maxima; and attention's
transposes left uncopied, whose training steps keep their bits."""
from __future__ import annotations

import dataclasses

import pytest

from cerebras_tf import ir
from cerebras_tf.wse.fusion import fused_pairs


def _kernel(kid: int, kind: str, inputs: list[int], outputs: list[int], **kw) -> ir.Kernel:
    return ir.Kernel(id=kid, kind=kind, inputs=inputs, outputs=outputs, attrs={}, **kw)


def _pairs(kernels: list[ir.Kernel], keep: set[int] = frozenset()) -> dict[int, str]:
    return {pid: tail.kind for pid, tail in fused_pairs(kernels, ir.readers(kernels), keep).items()}


def test_a_relu_that_alone_reads_a_bias_add_is_fused_even_with_kernels_between():
    kernels = [_kernel(0, "bias_add", [1, 2], [3]), _kernel(1, "mul", [1, 1], [4]), _kernel(2, "relu", [3], [5])]
    assert _pairs(kernels) == {0: "relu"}


def test_no_fusion_when_the_intermediate_has_another_reader_is_kept_or_the_kind_pair_is_unknown():
    shared = [_kernel(0, "bias_add", [1, 2], [3]), _kernel(1, "relu", [3], [4]), _kernel(2, "neg", [3], [5])]
    assert _pairs(shared) == {}
    kept = [_kernel(0, "bias_add", [1, 2], [3]), _kernel(1, "relu", [3], [4])]
    assert _pairs(kept, keep={3}) == {}
    other = [_kernel(0, "add", [1, 2], [3]), _kernel(1, "relu", [3], [4])]
    assert _pairs(other) == {}


def test_no_fusion_of_a_guarded_kernel_or_a_tail_in_another_phase():
    guarded = [_kernel(0, "bias_add", [1, 2], [3]), _kernel(1, "relu", [3], [4], guard=9)]
    assert _pairs(guarded) == {}
    producer_only = [_kernel(0, "fused_batch_norm", [1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11])]
    readers = {6: [1]}  # read by a kernel of another phase
    assert fused_pairs(producer_only, readers, set()) == {}


def test_a_tail_reads_after_the_intermediate_exactly_the_producer_inputs_its_pair_names():
    """max_pool_grad(x, y, g) -> relu_grad(dx, x): fused only when the relu_grad's features are x."""
    def pool_grad(features: int) -> list[ir.Kernel]:
        return [_kernel(0, "max_pool_grad", [1, 2, 3], [4]), _kernel(1, "relu_grad", [4, features], [5])]
    assert _pairs(pool_grad(features=1)) == {0: "relu_grad"}
    assert _pairs(pool_grad(features=2)) == {}  # the pooled output, not what was pooled
    assert _pairs(pool_grad(features=7)) == {}
    swapped = [_kernel(0, "max_pool_grad", [1, 2, 3], [4]), _kernel(1, "relu_grad", [1, 4], [5])]
    assert _pairs(swapped) == {}


def test_a_tail_may_take_a_tensor_of_its_own_that_exists_where_the_producer_runs():
    """avg_pool_grad(g) -> relu_grad(dx, features): the fused kernel takes the features after g (Fused.tail_takes),
    when they are made before the avg_pool_grad (or outside the phase), not after it."""
    from cerebras_tf.wse.fusion import taken_by_tail
    pool_grad = [_kernel(0, "relu", [9], [1]), _kernel(1, "avg_pool_grad", [2], [3]),
                 _kernel(2, "relu_grad", [3, 1], [4])]
    assert _pairs(pool_grad) == {1: "relu_grad"}
    assert taken_by_tail(pool_grad[1], pool_grad[2]) == [1]
    assert _pairs(pool_grad[1:]) == {1: "relu_grad"}  # the features made in an earlier phase
    late = [_kernel(1, "avg_pool_grad", [2], [3]), _kernel(0, "relu", [9], [1]), _kernel(2, "relu_grad", [3, 1], [4])]
    assert _pairs(late) == {}  # the features do not exist yet where the avg_pool_grad runs
    no_features = [_kernel(1, "avg_pool_grad", [2], [3]), _kernel(2, "relu_grad", [3], [4])]
    assert _pairs(no_features) == {}
    assert taken_by_tail(_kernel(0, "bias_add", [1, 2], [3]), _kernel(1, "relu", [3], [4])) == []


def _conv_block(relu_readers: tuple[str, ...] = ("avg_pool", "relu_grad"), **pool_kw) -> list[ir.Kernel]:
    """bias_add(1, 2) -> relu -> the relu output's readers (an avg_pool; the relu_grad fused into avg_pool_grad;
    any other kind reading it)."""
    kernels = [_kernel(0, "bias_add", [1, 2], [3]), _kernel(1, "relu", [3], [4])]
    for i, kind in enumerate(relu_readers):
        if kind == "avg_pool":
            kernels.append(_kernel(10 + i, "avg_pool", [4], [5], **pool_kw))
        elif kind == "relu_grad":
            kernels += [_kernel(20 + i, "avg_pool_grad", [6], [7]), _kernel(30 + i, "relu_grad", [7, 4], [8])]
        else:
            kernels.append(_kernel(40 + i, kind, [4], [9 + i]))
    return kernels


def _folds(kernels: list[ir.Kernel], keep: set[int] = frozenset()) -> list[tuple[int, ...]]:
    from cerebras_tf.wse.fusion import bias_relu_pools
    readers = ir.readers(kernels)
    return [(f.bias_add.id, f.relu.id, f.pool.id, f.grad.id, f.relu_grad.id, *f.taken)
            for f in bias_relu_pools(kernels, readers, keep, fused_pairs(kernels, readers, keep))]


def test_a_bias_relu_that_only_an_average_pool_and_its_gradient_read_is_folded_into_them():
    """fusion.bias_relu_pools: the pool and the gradient's relu_grad take (x, bias) instead of the relu's output,
    where nothing else reads it, it is not kept, the pool is unguarded and the formats agree."""
    assert _folds(_conv_block()) == [(0, 1, 10, 21, 31, 1, 2)]
    assert _folds(_conv_block(("avg_pool", "relu_grad", "neg"))) == []  # a third reader
    assert _folds(_conv_block(("avg_pool",))) == []  # no gradient
    assert _folds(_conv_block(("avg_pool", "relu_grad")), keep={4}) == []
    assert _folds(_conv_block(guard=9)) == []
    block = _conv_block()
    block[0] = dataclasses.replace(block[0], attrs={"data_format": "NCHW"})
    assert _folds(block) == []  # the bias along another axis than the pool's channels
    max_pooled = [dataclasses.replace(k, kind="max_pool") if k.kind == "avg_pool" else k for k in _conv_block()]
    assert _folds(max_pooled) == []


def test_a_batch_norm_relu_that_only_its_tap_keeping_max_pool_and_the_gradient_read_is_pooled_in_its_unit():
    """fusion.batch_norm_relu_pools: where the relu's output is read only by a max_pool, that pool's gradient (as
    its orig_input) and the relu_grad fused into it, the pool and gradient sharing WinningTaps with the
    relu_grad, both NHWC; not with a fourth reader, a kept output, a pool without taps or other formats."""
    from cerebras_tf.wse.fusion import batch_norm_relu_pools
    from cerebras_tf.wse.kernels.pool import WinningTaps

    def block(extra: tuple[ir.Kernel, ...] = (), bn_format: str = "NHWC") -> list[ir.Kernel]:
        return [ir.Kernel(id=0, kind="fused_batch_norm", inputs=[1, 2, 3, 4, 5], outputs=[6, 7, 8, 9, 10, 11],
                          attrs={"data_format": bn_format}),
                _kernel(1, "relu", [6], [12]), _kernel(2, "max_pool", [12], [13]),
                _kernel(3, "max_pool_grad", [12, 13, 14], [15]), _kernel(4, "relu_grad", [15, 12], [16]), *extra]

    def found(kernels: list[ir.Kernel], keep: set[int] = frozenset(), relu_grad: bool = True,
              shared: bool = True) -> list[tuple[int, ...]]:
        readers = ir.readers(kernels)
        taps = WinningTaps(relu_grad=relu_grad)
        sharing = {2: taps, 3: taps if shared else WinningTaps(relu_grad=relu_grad)}
        return [(f.batch_norm.id, f.relu.id, f.pool.id, f.grad.id, f.relu_grad.id) for f in batch_norm_relu_pools(
            kernels, readers, keep, fused_pairs(kernels, readers, keep), sharing)]
    assert found(block()) == [(0, 1, 2, 3, 4)]
    assert found(block((_kernel(5, "neg", [12], [17]),))) == []  # another reader
    assert found(block(), keep={12}) == []
    assert found(block(), relu_grad=False) == []  # taps that route a gradient not relu'd
    assert found(block(), shared=False) == []
    assert found(block(bn_format="NCHW")) == []


def test_the_half_rounding_of_a_normalized_pools_output_runs_in_its_unit_where_only_the_gradient_also_reads_it():
    """BatchNormReluPool.rounding: the to_half of the pool's output where, the pool's gradient aside (it takes
    the taps), it alone reads it; not with another reader, a kept output, a guard or a kernel other than a
    to_half."""
    from cerebras_tf.wse.fusion import batch_norm_relu_pools
    from cerebras_tf.wse.kernels.pool import WinningTaps

    def rounding(extra: tuple[ir.Kernel, ...], keep: set[int] = frozenset()) -> int | None:
        kernels = [ir.Kernel(id=0, kind="fused_batch_norm", inputs=[1, 2, 3, 4, 5], outputs=[6, 7, 8, 9, 10, 11],
                             attrs={"data_format": "NHWC"}),
                   _kernel(1, "relu", [6], [12]), _kernel(2, "max_pool", [12], [13]), *extra,
                   _kernel(3, "max_pool_grad", [12, 13, 14], [15]), _kernel(4, "relu_grad", [15, 12], [16])]
        readers = ir.readers(kernels)
        taps = WinningTaps(relu_grad=True)
        pools = batch_norm_relu_pools(kernels, readers, keep, fused_pairs(kernels, readers, keep), {2: taps, 3: taps})
        assert len(pools) == 1
        return None if pools[0].rounding is None else pools[0].rounding.id
    assert rounding((_kernel(5, "to_half", [13], [17]),)) == 5
    assert rounding(()) is None
    assert rounding((_kernel(5, "to_half", [13], [17]), _kernel(6, "neg", [13], [18]))) is None  # another reader
    assert rounding((_kernel(5, "to_half", [13], [17]),), keep={13}) is None
    assert rounding((_kernel(5, "to_half", [13], [17], guard=9),)) is None
    assert rounding((_kernel(5, "neg", [13], [17]),)) is None


def test_a_half_rounding_that_alone_reads_a_new_array_rounds_it_in_place():
    from cerebras_tf.wse.fusion import rounding_pairs

    def pairs(kernels: list[ir.Kernel], keep: set[int] = frozenset(), exclude=()) -> dict[int, str]:
        return {pid: t.kind for pid, t in rounding_pairs(kernels, ir.readers(kernels), keep, exclude).items()}
    assert pairs([_kernel(0, "matmul", [1, 2], [3]), _kernel(1, "neg", [1], [4]), _kernel(2, "to_half", [3], [5])]) \
        == {0: "to_half"}
    assert pairs([_kernel(0, "avg_pool", [1], [3]), _kernel(1, "to_half", [3], [4])]) == {0: "to_half"}
    assert pairs([_kernel(0, "reshape", [1], [3]), _kernel(1, "to_half", [3], [4])]) == {}  # a view of its input
    assert pairs([_kernel(0, "matmul", [1, 2], [3]), _kernel(1, "to_half", [3], [4]), _kernel(2, "neg", [3], [5])]) \
        == {}  # another reader needs the unrounded values
    assert pairs([_kernel(0, "matmul", [1, 2], [3]), _kernel(1, "to_half", [3], [4])], keep={3}) == {}
    assert pairs([_kernel(0, "matmul", [1, 2], [3]), _kernel(1, "to_half", [3], [4], guard=9)]) == {}
    assert pairs([_kernel(0, "matmul", [1, 2], [3]), _kernel(1, "to_half", [3], [4])], exclude={1}) == {}


def test_adjacent_independent_dense_kernels_are_grouped_for_one_provider_call():
    from cerebras_tf.wse.fusion import dense_groups

    def groups(kernels: list[ir.Kernel], exclude=()) -> dict[int, int]:
        return {first: second.id for first, second in dense_groups(kernels, exclude).items()}
    input_and_filter_grads = [_kernel(0, "conv2d_backprop_input", [1, 2], [3]),
                              _kernel(1, "conv2d_backprop_filter", [4, 2], [5])]
    assert groups(input_and_filter_grads) == {0: 1}
    assert groups(input_and_filter_grads, exclude={1}) == {}
    three = [*input_and_filter_grads, _kernel(2, "matmul", [6, 7], [8])]
    assert groups(three) == {0: 1}  # pairs only, in order
    dependent = [_kernel(0, "matmul", [1, 2], [3]), _kernel(1, "matmul", [3, 2], [4])]
    assert groups(dependent) == {}
    apart = [_kernel(0, "matmul", [1, 2], [3]), _kernel(1, "neg", [1], [4]), _kernel(2, "matmul", [1, 2], [5])]
    assert groups(apart) == {}  # the kernel between might read the first's output
    assert groups([_kernel(0, "matmul", [1, 2], [3]), _kernel(1, "matmul", [1, 2], [4], guard=9)]) == {}
    assert groups([_kernel(0, "relu", [1], [3]), _kernel(1, "matmul", [1, 2], [4])]) == {}


def test_a_half_rounding_right_after_a_bias_gradient_of_the_same_tensor_runs_beside_it():
    from cerebras_tf.wse.fusion import roundings_beside_sums

    def groups(kernels: list[ir.Kernel], exclude=()) -> dict[int, int]:
        return {first: second.id for first, second in roundings_beside_sums(kernels, exclude).items()}
    sum_then_round = [_kernel(0, "bias_add_grad", [1], [2]), _kernel(1, "to_half", [1], [3])]
    assert groups(sum_then_round) == {0: 1}
    assert groups([_kernel(0, "relu", [9], [1]), *sum_then_round, _kernel(2, "neg", [1], [4])]) == {0: 1}
    assert groups(sum_then_round, exclude={1}) == {}
    assert groups(sum_then_round[::-1]) == {}  # the rounding first: it is not beside a sum that follows
    assert groups([_kernel(0, "bias_add_grad", [1], [2]), _kernel(1, "to_half", [2], [3])]) == {}  # of the sum
    apart = [sum_then_round[0], _kernel(2, "neg", [1], [4]), _kernel(1, "to_half", [1], [3])]
    assert groups(apart) == {}  # run at the to_half's place: nothing may lie between
    assert groups([_kernel(0, "sum", [1], [2]), _kernel(1, "to_half", [1], [3])]) == {}  # no such kernel
    assert groups([sum_then_round[0], _kernel(1, "to_half", [1], [3], guard=9)]) == {}


def test_a_max_pool_grad_knows_its_maxima_when_orig_output_is_the_max_pool_of_orig_input():
    from cerebras_tf.wse.fusion import known_maxima
    attrs = {"ksize": [1, 2, 2, 1], "strides": [1, 2, 2, 1], "padding": "VALID", "data_format": "NHWC"}

    def program(pool_input: int = 1, pool_attrs=attrs, **pool_kw) -> list[ir.Kernel]:
        return [ir.Kernel(0, "max_pool", [pool_input], [2], dict(pool_attrs), **pool_kw),
                ir.Kernel(1, "neg", [2], [3], {}),
                ir.Kernel(2, "max_pool_grad", [1, 2, 3], [4], dict(attrs))]
    assert known_maxima(program()) == {2}
    assert known_maxima(program(pool_input=7)) == set()  # the max pool of another tensor
    assert known_maxima(program(pool_attrs={**attrs, "padding": "SAME"})) == set()
    assert known_maxima(program(guard=9)) == set()  # a pool that may not run
    not_pooled = [ir.Kernel(1, "neg", [1], [2], {}), ir.Kernel(2, "max_pool_grad", [1, 2, 3], [4], dict(attrs))]
    assert known_maxima(not_pooled) == set()


def test_a_max_pool_keeps_its_winning_taps_for_its_only_gradient_where_the_windows_do_not_overlap():
    """fusion.winning_taps: the pool and its known-maxima gradient share one WinningTaps (relu_grad when one
    is fused into the gradient); not for overlapping windows, a pool two gradients read, a gradient whose
    maxima are not known, another dtype, or without numba."""
    from cerebras_tf.wse.fusion import winning_taps
    from cerebras_tf.wse.kernels import _jit
    attrs = {"ksize": [1, 2, 2, 1], "strides": [1, 2, 2, 1], "padding": "VALID", "data_format": "NHWC"}
    tensors = [ir.Tensor(0, [], "float32", "t0"), ir.Tensor(1, [2, 8, 8, 3], "float32", "x"),
               ir.Tensor(2, [2, 4, 4, 3], "float32", "y"), ir.Tensor(3, [2, 4, 4, 3], "float32", "dy"),
               ir.Tensor(4, [2, 8, 8, 3], "float32", "dx"), ir.Tensor(5, [2, 8, 8, 3], "float32", "dx2"),
               ir.Tensor(6, [2, 4, 4, 3], "float64", "dy64")]

    def program(pool_attrs=attrs, dy: int = 3) -> list[ir.Kernel]:
        return [ir.Kernel(0, "max_pool", [1], [2], dict(pool_attrs)),
                ir.Kernel(1, "max_pool_grad", [1, 2, dy], [4], dict(pool_attrs))]
    relu_grad = ir.Kernel(2, "relu_grad", [4, 1], [5], {})

    def shared(kernels: list[ir.Kernel], known: set[int], tails=None) -> dict[int, bool]:
        found = winning_taps(kernels, known, tails or {}, tensors)
        if found:
            assert found[0] is found[1]
        return {kid: taps.relu_grad for kid, taps in found.items()}
    with _jit.use_jit(True):
        assert shared(program(), {1}) == {0: False, 1: False}
        assert shared(program(), {1}, {1: relu_grad}) == {0: True, 1: True}
        assert shared(program({**attrs, "strides": [1, 3, 3, 1]}), {1}) == {0: False, 1: False}  # gaps
        assert shared(program(), set()) == {}  # maxima not known
        assert shared(program({**attrs, "ksize": [1, 3, 3, 1], "padding": "SAME"}), {1}) == {}  # overlapping
        assert shared(program(dy=6), {1}) == {}  # a gradient of another dtype
        two = [*program(), ir.Kernel(3, "max_pool_grad", [1, 2, 3], [5], dict(attrs))]
        assert shared(two, {1, 3}) == {}
    with _jit.use_jit(False):
        assert shared(program(), {1}) == {}


def _transpose(kid: int, inputs: list[int], outputs: list[int], perm=(0, 2, 1, 3), **kw) -> ir.Kernel:
    return ir.Kernel(id=kid, kind="transpose", inputs=inputs, outputs=outputs, attrs={"perm": list(perm)}, **kw)


def test_a_transpose_only_batch_matmuls_read_hands_on_a_view():
    """Attention's heads: q and k transposed for scores = q k^T (through a to_half each, as the compiler puts
    them before a matmul); a transpose any other kernel reads, that moves the last axis, or that is kept or
    guarded is copied."""
    from cerebras_tf.wse.fusion import lazy_transposes

    def lazy(kernels: list[ir.Kernel], keep: set[int] = frozenset()) -> set[int]:
        return lazy_transposes(kernels, ir.readers(kernels), keep)
    attention = [_transpose(0, [1], [2]), _transpose(1, [3], [4]), _kernel(2, "to_half", [2], [5]),
                 _kernel(3, "to_half", [4], [6]), _kernel(4, "batch_matmul", [5, 6], [7]),
                 _kernel(5, "batch_matmul", [7, 2], [8])]
    assert lazy(attention) == {0, 1}
    assert lazy(attention, keep={2}) == {1}
    assert lazy(attention, keep={6}) == {0}  # kept past the to_half
    assert lazy([*attention, _kernel(6, "neg", [5], [9])]) == {1}  # another reader after the to_half
    assert lazy([*attention, _kernel(6, "reshape", [4], [9])]) == {0}
    assert lazy([_transpose(0, [1], [2], perm=(0, 1, 3, 2)), _kernel(1, "batch_matmul", [2, 2], [3])]) == set()
    assert lazy([_transpose(0, [1], [2], perm=(1, 0)), _kernel(1, "batch_matmul", [2, 2], [3])]) == set()
    assert lazy([_transpose(0, [1], [2], guard=9), _kernel(1, "batch_matmul", [2, 2], [3])]) == set()
    assert lazy([_transpose(0, [1], [2]), _kernel(1, "batch_matmul", [2, 2], [3], guard=9)]) == set()
    assert lazy([_transpose(0, [1], [2])]) == set()  # no reader: nothing to gain


def test_a_batch_matmul_only_transposes_read_is_laid_out_for_them():
    """The context (probs v) and the gradients of q, k, v: batch_matmuls whose result the transpose back to
    the heads' layout alone reads."""
    from cerebras_tf.wse.fusion import transposed_outputs

    def laid_out(kernels: list[ir.Kernel], keep: set[int] = frozenset()) -> dict[int, tuple[int, ...]]:
        return transposed_outputs(kernels, ir.readers(kernels), keep)
    context = [_kernel(0, "batch_matmul", [1, 2], [3]), _transpose(1, [3], [4]), _kernel(2, "reshape", [4], [5])]
    assert laid_out(context) == {0: (0, 2, 1, 3)}
    assert laid_out([*context, _transpose(3, [3], [6])]) == {0: (0, 2, 1, 3)}  # two transposes, one perm
    assert laid_out([*context, _transpose(3, [3], [6], perm=(0, 1, 3, 2))]) == {}
    assert laid_out([*context, _kernel(3, "neg", [3], [6])]) == {}
    assert laid_out(context, keep={3}) == {}
    assert laid_out([_kernel(0, "batch_matmul", [1, 2], [3]), _transpose(1, [3], [4], perm=(0, 1, 3, 2))]) == {}
    assert laid_out([_kernel(0, "batch_matmul", [1, 2], [3], guard=9), _transpose(1, [3], [4])]) == {}
    assert laid_out([_kernel(0, "batch_matmul", [1, 2], [3]), _transpose(1, [3], [4], guard=9)]) == {}
    assert laid_out([_kernel(0, "matmul", [1, 2], [3]), _transpose(1, [3], [4])]) == {}


@pytest.mark.parametrize("half_dtype", ["float32", "float16"], indirect=True)
def test_transformer_steps_with_attentions_transposes_uncopied_give_the_bits_of_steps_with_copies(
        tmp_path, half_dtype, monkeypatch):
    from cerebras_tf.amp import GradScaler
    from cerebras_tf.wse import executor as executor_module

    from test_chains import _model

    program, start, batches = _model(tmp_path, "transformer")
    runs = []
    for uncopied in (True, False):
        if not uncopied:
            monkeypatch.setattr(executor_module, "lazy_transposes", lambda *args: set())
            monkeypatch.setattr(executor_module, "transposed_outputs", lambda *args: {})
        executor = executor_module.Executor(program, start, grad_scaler=GradScaler(loss_scale="dynamic"))
        applied = len(executor._lazy_transposes) + len(executor._out_perms)
        assert applied >= 8 if uncopied else applied == 0  # per layer: q, k, v, the context, their gradients
        results = [executor.step(features, labels) for features, labels in batches]
        runs.append((results, executor.variables()))
    _assert_same_bits(*runs)


def _assert_same_bits(run: tuple, reference: tuple) -> None:
    """Two runs' (step results, variables after them): the same outputs and variables, bit for bit."""
    from test_chains import _same_bits
    for a, b in zip(run[0], reference[0]):
        assert a.finite == b.finite and a.outputs.keys() == b.outputs.keys()
        for key in a.outputs:
            assert _same_bits(a.outputs[key], b.outputs[key]), key
    for key, value in run[1].items():
        assert _same_bits(value, reference[1][key]), key


def _folded_units(plan: list, fold: str) -> list[int]:
    """What a fold changes in the zoo CNN's first phase: the bias_add units and the inputs the average pool
    and its gradient take (bias_relu_pools); the inputs of the max pool's gradient (batch_norm_relu_pools)."""
    if fold == "bias_relu_pools":
        return [[p.kernel.kind for p in plan].count("bias_add"),
                *(len(p.inputs) for p in plan if p.kernel.kind in ("avg_pool", "avg_pool_grad"))]
    return [len(p.inputs) for p in plan if p.kernel.kind == "max_pool_grad"]


@pytest.mark.parametrize("half_dtype", ["float32", "float16"], indirect=True)
@pytest.mark.parametrize("provider", ["numpy", "tensorflow"])
@pytest.mark.parametrize("fold,folded,unfolded", [("bias_relu_pools", [1, 2, 3], [2, 1, 2]),
                                                  ("batch_norm_relu_pools", [1], [3])])
def test_cnn_steps_with_a_relu_output_never_stored_give_the_bits_of_steps_without(
        tmp_path, half_dtype, provider, fold, folded, unfolded, monkeypatch):
    """The zoo CNN's conv2 block (bias_add -> relu folded into its avg_pool and the pool's gradient) and its
    bn1 block (fused_batch_norm -> relu pooled in the batch norm's unit, the gradient from the taps alone):
    the same losses, outputs and variables with the relu's output never stored as with it."""
    from cerebras_tf.amp import GradScaler
    from cerebras_tf.run.host_kernels_tf import PROVIDERS
    from cerebras_tf.wse import executor as executor_module

    from test_chains import _model

    program, start, batches = _model(tmp_path, "cnn")
    runs = []
    for expected in (folded, unfolded):
        if expected is unfolded:
            monkeypatch.setattr(executor_module, fold, lambda *args: [])
        executor = executor_module.Executor(program, start, grad_scaler=GradScaler(loss_scale="dynamic"),
                                            host_kernels=PROVIDERS[provider])
        assert _folded_units(executor._plans[0], fold) == expected
        runs.append(([executor.step(features, labels) for features, labels in batches], executor.variables()))
    _assert_same_bits(*runs)
