"""Chains of elementwise kernels (wse/chains.py): which kernels form one, and that a chain's generated loop
gives the bits of its kernels run one by one (each op, each broadcast, NaN/inf/-0/subnormals), up to the
payload of a NaN; and that whole training steps with chains give the variables, losses and outputs of the
same steps without them, bit for bit."""
from __future__ import annotations

import itertools
import math
import os
import re
import time

import numpy as np
import pytest

from cerebras_tf import ir
from cerebras_tf.amp import GradScaler
from cerebras_tf.wse import chains as chains_module
from cerebras_tf.wse import denormals, threads
from cerebras_tf.wse.chains import fuse_chains, use_chains
from cerebras_tf.wse.executor import Executor
from cerebras_tf.wse.kernels import KERNELS, KernelContext, _jit, eigen_tanh
from cerebras_tf.wse.kernels.half import round_half

pytestmark = pytest.mark.skipif(not _jit.enabled(), reason="chains need numba's loops")

SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-40,
                     3.4e38, -3.4e38, 65504.0, 65520.0, -65519.0, 6e-8, 1e-8, 0.1, 1.0000001, 2.0 ** -126],
                    np.float32)
NEGATIVE_NAN = np.array([0xFFC00001], np.uint32).view(np.float32)[0]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, where any NaN equals any NaN (the payload a NaN carries through is the hardware's)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(nan_a, nan_b)
                and np.array_equal(a[~nan_a].view(np.uint32), b[~nan_b].view(np.uint32)))


class _Builder:
    """Tensors and kernels of a test phase."""

    def __init__(self) -> None:
        self.tensors: list[ir.Tensor] = []
        self.kernels: list[ir.Kernel] = []
        self.values: dict[int, np.ndarray] = {}
        self.constants: dict[int, np.ndarray] = {}

    def tensor(self, shape, dtype: str = "float32", value=None, const: bool = False) -> int:
        tid = len(self.tensors)
        self.tensors.append(ir.Tensor(tid, list(shape), dtype, f"t{tid}", ir.Const() if const else None))
        if value is not None:
            self.values[tid] = np.asarray(value, np.bool_ if dtype == "bool" else np.float32).reshape(shape)
            if const:
                self.constants[tid] = self.values[tid]
        return tid

    def kernel(self, kind: str, inputs: list[int], shape=None, dtype: str = "float32", **kw) -> int:
        out = self.tensor(self.tensors[inputs[0]].shape if shape is None else shape, dtype)
        attrs = kw.pop("attrs", {})
        self.kernels.append(ir.Kernel(len(self.kernels), kind, inputs, [out], attrs, **kw))
        return out

    def chains(self, keep=(), half: str = "float32", **kw) -> list[chains_module.Chain]:
        return fuse_chains(self.kernels, ir.readers(self.kernels), set(keep), tensors=self.tensors, half_dtype=half,
                           constants=self.constants, **kw)

    def reference(self, half: str) -> dict[int, np.ndarray]:
        """Every tensor, from the kernels one by one (as the executor runs them unfused)."""
        values = dict(self.values)
        with np.errstate(all="ignore"):
            for k in self.kernels:
                inputs = [values[t] for t in k.inputs]
                if k.kind == "to_half":
                    out = [inputs[0] if half == "float32" else round_half(inputs[0], half)]
                else:
                    out = KERNELS[k.kind](inputs, k.attrs, KernelContext())
                values[k.outputs[0]] = out[0]
        return values


def _run(chain: chains_module.Chain, values: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    with np.errstate(all="ignore"):
        return dict(zip(chain.outputs, chain.fn([values[t] for t in chain.inputs], {}, KernelContext())))


def _check_one_chain(b: _Builder, keep, half: str = "float32") -> chains_module.Chain:
    found = b.chains(keep=keep, half=half)
    assert len(found) == 1 and [k.id for k in found[0].kernels] == [k.id for k in b.kernels], found
    chain = found[0]
    reference = b.reference(half)
    for tid, value in _run(chain, b.values).items():
        assert _same_bits(value, reference[tid]), (tid, value, reference[tid], chain.source)
    return chain


def _pairs(shape_out, kind: str):
    """x (the output's shape) and y (`kind`: f, s, r, c) covering every pair of SPECIALS, then random values."""
    rng = np.random.default_rng(7)
    size = math.prod(shape_out)
    x = rng.standard_normal(size).astype(np.float32)
    cols = shape_out[-1]
    y_shape = {"f": shape_out, "s": (), "r": (cols,), "c": (*shape_out[:-1], 1),
               "g": (shape_out[0], *[1] * (len(shape_out) - 2), cols)}[kind]  # a mask [batch, 1, .., keys]
    y = rng.standard_normal(math.prod(y_shape)).astype(np.float32)
    pairs = list(itertools.product(SPECIALS, SPECIALS))
    if kind == "f":
        n = min(len(pairs), size)
        x[:n], y[:n] = zip(*pairs[:n])
    elif kind == "r":  # every row meets the row vector: specials in both
        x[: len(SPECIALS) * cols: cols] = SPECIALS[: size // cols]
        y[: len(SPECIALS)] = SPECIALS[: y.size]
    else:
        x[: len(SPECIALS)] = SPECIALS
        y[: len(SPECIALS)] = SPECIALS[: y.size]
    x[-1] = NEGATIVE_NAN
    return x.reshape(shape_out), y.reshape(y_shape)


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "squared_difference"]
COMPARE = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]


@pytest.mark.parametrize("kind", BINARY + COMPARE)
@pytest.mark.parametrize("broadcast,shape", [(b, s) for s in [(23, 23), (3, 5, 40), (2, 3, 4, 40)] for b in "fsrcg"
                                             if b != "g" or len(s) > 2])  # g: rows grouped under leading dims
def test_each_binary_op_and_broadcast_gives_the_bits_of_the_kernel(kind, broadcast, shape):
    x, y = _pairs(shape, broadcast)
    for a, c in ((x, y), (y, x)) if broadcast == "f" else ((x, y),):
        b = _Builder()
        first = b.kernel(kind, [b.tensor(a.shape, value=a), b.tensor(c.shape, value=c)], shape=shape,
                         dtype="bool" if kind in COMPARE else "float32")
        if kind in COMPARE:
            b.kernel("logical_not", [first], dtype="bool")
        else:
            b.kernel("neg", [first])
        _check_one_chain(b, keep={first})


@pytest.mark.parametrize("kind", ["neg", "abs", "square", "sqrt", "reciprocal", "rsqrt", "relu", "tanh"])
def test_each_unary_op_gives_the_bits_of_the_kernel(kind):
    x, _ = _pairs((40, 23), "f")
    b = _Builder()
    first = b.kernel(kind, [b.tensor(x.shape, value=x)])
    b.kernel("neg", [first])
    _check_one_chain(b, keep={first})


@pytest.mark.parametrize("form", eigen_tanh.FORMS)
def test_tanh_in_either_of_tfs_forms_gives_the_bits_of_the_kernel(form, monkeypatch):
    monkeypatch.setattr(eigen_tanh, "FORM", form)
    x, _ = _pairs((40, 23), "f")
    x.reshape(-1)[-8:] = [0.0004, -0.00039999998, 7.9053111, -7.90739, 9.0, 1e-38, -20.0, 0.3]
    b = _Builder()
    first = b.kernel("tanh", [b.tensor(x.shape, value=x)])
    b.kernel("neg", [first])
    _check_one_chain(b, keep={first})


@pytest.mark.parametrize("kind", ["tanh_grad", "sigmoid_grad", "rsqrt_grad", "sqrt_grad", "reciprocal_grad",
                                  "relu_grad"])
def test_each_gradient_op_gives_the_bits_of_the_kernel(kind):
    x, y = _pairs((23, 23), "f")
    for a, c in ((x, y), (y, x)):
        b = _Builder()
        first = b.kernel(kind, [b.tensor(a.shape, value=a), b.tensor(c.shape, value=c)])
        b.kernel("neg", [first])
        _check_one_chain(b, keep={first})


def test_relu_turns_minus_zero_to_plus_zero_and_keeps_nan():
    b = _Builder()
    x = b.tensor((4,), value=[-0.0, np.nan, -1.0, 2.0])
    first = b.kernel("relu", [x])
    b.kernel("mul", [first, b.tensor((), value=1.0)])
    chain = _check_one_chain(b, keep={first})
    out = _run(chain, b.values)[first]
    assert out.view(np.uint32)[0] == 0 and np.isnan(out[1]) and out[2] == 0 and out[3] == 2


@pytest.mark.parametrize("exponent", [0.5, 2.0, 3.0, -1.0])
def test_pow_by_a_constant_takes_the_kernels_rewritten_form(exponent):
    x, _ = _pairs((40, 23), "f")
    b = _Builder()
    first = b.kernel("pow", [b.tensor(x.shape, value=x), b.tensor((), value=exponent, const=True)])
    b.kernel("neg", [first])
    _check_one_chain(b, keep={first})


def test_pow_by_another_exponent_is_not_a_member():
    b = _Builder()
    first = b.kernel("pow", [b.tensor((4,), value=np.ones(4)), b.tensor((), value=1.5, const=True)])
    b.kernel("neg", [first])
    assert b.chains() == []


@pytest.mark.parametrize("cond_kind", ["f", "s", "r", "c"])
def test_select_comparisons_logic_and_add_n(cond_kind):
    rng = np.random.default_rng(3)
    x, y = _pairs((23, 23), "f")
    cond_shape = {"f": (23, 23), "s": (), "r": (23,), "c": (23, 1)}[cond_kind]
    b = _Builder()
    tx, ty = b.tensor(x.shape, value=x), b.tensor(y.shape, value=y)
    cond = b.tensor(cond_shape, "bool", value=rng.random(cond_shape) < 0.5)
    ge = b.kernel("greater_equal", [tx, ty], dtype="bool")
    both = b.kernel("logical_and", [ge, cond], shape=(23, 23), dtype="bool")
    either = b.kernel("logical_or", [both, cond], shape=(23, 23), dtype="bool")
    picked = b.kernel("select", [either, tx, ty])
    total = b.kernel("add_n", [picked, tx, ty, picked])
    _check_one_chain(b, keep={ge, both, picked, total})


@pytest.mark.parametrize("half", ["float16", "bfloat16", "cbfloat16", "float32"])
def test_to_half_after_an_elementwise_producer_rounds_as_the_executor_does(half):
    rng = np.random.default_rng(5)
    x = np.concatenate([SPECIALS, rng.standard_normal(500).astype(np.float32) * np.float32(1e4),
                        (rng.standard_normal(500) * 1e-6).astype(np.float32),
                        np.array([65519.99, 65520.0, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, NEGATIVE_NAN,
                                  4290772992.0, 3.3895e38], np.float32)])
    b = _Builder()
    first = b.kernel("mul", [b.tensor(x.shape, value=x), b.tensor((), value=1.0)])
    rounded = b.kernel("to_half", [first], dtype=ir.HALF)
    _check_one_chain(b, keep={rounded}, half=half)


def test_scalar_chains_and_the_layer_norm_broadcasts():
    """Scalars only (a learning-rate schedule), and x * (rsqrt-column * gamma-row) - ... as layer norm's."""
    b = _Builder()
    step = b.tensor((), value=7.0)
    lr = b.kernel("mul", [step, b.tensor((), value=1e-3)])
    assert len(b.chains(keep={b.kernel("minimum", [lr, b.tensor((), value=5e-3)])})) == 1
    rng = np.random.default_rng(1)
    b = _Builder()
    x = b.tensor((6, 8), value=rng.standard_normal((6, 8)))
    rstd = b.tensor((6, 1), value=rng.random((6, 1)))
    mean = b.tensor((6, 1), value=rng.standard_normal((6, 1)))
    scale = b.kernel("mul", [rstd, b.tensor((8,), value=rng.standard_normal(8))], shape=(6, 8))
    scaled = b.kernel("mul", [x, scale])
    shift = b.kernel("mul", [mean, scale], shape=(6, 8))
    centred = b.kernel("sub", [b.tensor((8,), value=rng.standard_normal(8)), shift], shape=(6, 8))
    _check_one_chain(b, keep={scale, b.kernel("add", [scaled, centred])})


def test_a_tile_of_size_one_axes_is_read_broadcast_and_never_stored():
    """A mean's gradient: tile([rows, 1] to [rows, cols]) / n. The chain reads the column; the tiled array is
    never made. A tile that repeats an axis longer than 1 is not a member."""
    b = _Builder()
    column = b.tensor((6, 1), value=np.arange(6) / 7)
    scalar = b.tensor((1,), value=[3.0])
    tiled = b.kernel("tile", [column], shape=(6, 5), attrs={"multiples": [1, 5]})
    out = b.kernel("div", [tiled, b.tensor((), value=5.0)])
    total = b.kernel("mul", [b.kernel("tile", [scalar], shape=(4,), attrs={"multiples": [4]}),
                             b.tensor((4,), value=np.arange(4))])
    found = b.chains(keep={out, total})
    assert [[k.kind for k in c.kernels] for c in found] == [["tile", "div"], ["tile", "mul"]]
    assert found[0].inputs[0] == column and found[0].outputs == [out]
    reference = b.reference("float32")
    for chain in found:
        for tid, value in _run(chain, b.values).items():
            assert _same_bits(value, reference[tid])
    repeats = _Builder()
    rows = repeats.tensor((2, 3), value=np.arange(6))
    repeated = repeats.kernel("tile", [rows], shape=(4, 3), attrs={"multiples": [2, 1]})
    assert repeats.chains(keep={repeats.kernel("neg", [repeated])}) == []


def test_a_member_output_read_later_outside_the_chain_is_exported_and_others_are_not():
    b = _Builder()
    x, y = b.tensor((5, 3), value=np.arange(15)), b.tensor((5, 3), value=np.ones(15))
    s = b.kernel("add", [x, y])
    p = b.kernel("mul", [s, s])
    n = b.kernel("neg", [p])
    b.kernel("sum", [s], shape=())  # after the chain: s is an output of it
    (chain,) = b.chains(keep={n})
    assert [k.kind for k in chain.kernels] == ["add", "mul", "neg"]
    assert chain.inputs == [x, y] and chain.outputs == [s, n]  # p is never stored


def test_a_kernel_between_that_reads_a_member_output_brings_a_later_member_to_the_chain_or_stops_it():
    b = _Builder()
    x = b.tensor((5, 3), value=np.arange(15))
    s = b.kernel("add", [x, x])
    b.kernel("sum", [s], shape=())  # reads s before the mul: the mul (all it reads exists) runs with the add
    p = b.kernel("mul", [s, x])
    n = b.kernel("neg", [p])
    (chain,) = b.chains(keep={n})
    assert [k.kind for k in chain.kernels] == ["add", "mul", "neg"] and chain.place.kind == "add"
    assert chain.inputs == [x] and chain.outputs == [s, n]
    reference = b.reference("float32")
    assert all(_same_bits(value, reference[tid]) for tid, value in _run(chain, b.values).items())

    b = _Builder()
    x = b.tensor((5, 3), value=np.arange(15))
    s = b.kernel("add", [x, x])
    b.kernel("sum", [s], shape=())
    e = b.kernel("exp", [x])  # made after the add: the mul cannot run there
    p = b.kernel("mul", [s, e])
    (chain,) = b.chains(keep={b.kernel("neg", [p])})
    assert [k.kind for k in chain.kernels] == ["mul", "neg"] and chain.inputs == [s, e]
    assert chain.place is chain.kernels[-1]


def test_a_lone_kernel_that_numpy_runs_in_several_passes_is_a_chain_of_its_own():
    b = _Builder()
    x, m = b.tensor((6, 5), value=np.arange(30) / 7), b.tensor((6, 1), value=np.arange(6) / 3)
    d = b.kernel("squared_difference", [x, m])  # a layer norm's variance term: one loop, not np.square(x - m)
    b.kernel("sum", [d], shape=())
    g = b.kernel("rsqrt_grad", [x, x])
    b.kernel("sum", [g], shape=())
    b.kernel("sum", [b.kernel("add", [x, x])], shape=())  # one pass in numpy already: no chain
    found = b.chains()
    assert [[k.kind for k in c.kernels] for c in found] == [["squared_difference"], ["rsqrt_grad"]]
    reference = b.reference("float32")
    for chain in found:
        for tid, value in _run(chain, b.values).items():
            assert _same_bits(value, reference[tid])


def test_what_is_not_a_member():
    b = _Builder()
    x = b.tensor((4, 4), value=np.ones(16))
    b.kernel("exp", [b.kernel("add", [x, x])])  # exp: numpy's SIMD bits are not libm's
    g = b.tensor((), "bool", value=True)
    b.kernel("neg", [b.kernel("add", [x, x], guard=g)])  # guarded
    b.kernel("neg", [b.kernel("add", [b.tensor((4, 4), "int32"), b.tensor((4, 4), "int32")], dtype="int32")])
    mask = b.tensor((4, 1, 1, 4), value=np.ones(16))  # neither a row nor a column of [4, 4, 4, 4]
    b.kernel("neg", [b.kernel("add", [b.tensor((4, 4, 4, 4)), mask])])
    b.kernel("neg", [b.kernel("add", [x, x]), ], shape=(4, 4))
    found = b.chains(exclude={len(b.kernels) - 2})  # the last pair's producer is in a fused pair
    assert found == []


def test_a_member_reading_a_variable_view_is_not_moved_past_a_variable_write():
    def build() -> tuple[_Builder, set[int]]:
        b = _Builder()
        v = b.tensor((4,), value=np.ones(4))  # a shared read_variable's output: the variable's array itself
        m = b.kernel("mul", [v, v])
        b.kernels.append(ir.Kernel(len(b.kernels), "assign_variable", [b.tensor((4,), value=np.zeros(4))], [], {},
                                   vars=["v"]))
        return b, {b.kernel("neg", [m])}
    b, keep = build()
    assert len(b.chains(keep=keep)) == 1
    b, keep = build()
    (chain,) = b.chains(keep=keep, volatile={0})  # the neg comes to the mul, before the write
    assert chain.place.kind == "mul"

    b = _Builder()  # nor brought before one
    v = b.tensor((4,), value=np.ones(4))
    s = b.kernel("add", [b.tensor((4,), value=np.ones(4))] * 2)
    b.kernel("sum", [s], shape=())  # between the add and the mul: the mul would run at the add's place
    b.kernels.append(ir.Kernel(len(b.kernels), "assign_variable", [b.tensor((4,), value=np.zeros(4))], [], {},
                               vars=["v"]))
    keep = {b.kernel("mul", [s, v])}
    assert [[k.kind for k in c.kernels] for c in b.chains(keep=keep)] == [["add", "mul"]]
    assert b.chains(keep=keep, volatile={v}) == []


def test_a_slot_decay_that_only_the_update_reads_moves_into_the_update_phase():
    """m * beta1 (role forward: it needs no gradient) joins the optimizer phase, before its first reader."""
    b = _Builder()
    m = b.tensor((4,))
    read = ir.Kernel(0, "read_variable", [], [m], {}, vars=["m"])
    decay = ir.Kernel(1, "mul", [b.tensor((), value=0.9, const=True), m], [b.tensor((4,))], {})
    batch = ir.Kernel(2, "mul", [b.tensor((4,)), m], [b.tensor((4,))], {})  # reads the batch: stays
    seed = ir.Kernel(3, "neg", [decay.outputs[0]], [b.tensor((4,))], {}, role="optimizer")
    update = ir.Kernel(4, "add", [decay.outputs[0], batch.outputs[0]], [b.tensor((4,))], {}, role="optimizer")
    phases = ([read, decay, batch], [seed, update], [])
    forward, optimizer, step = chains_module.defer_to_update(phases, b.tensors, keep=set())
    assert forward == [read, batch] and optimizer == [decay, seed, update] and step == []
    assert chains_module.defer_to_update(phases, b.tensors, keep={decay.outputs[0]}) == phases


def test_one_compile_per_structure():
    b = _Builder()
    first = b.kernel("add", [b.tensor((3,), value=np.ones(3)), b.tensor((), value=1.0)])
    keep = {b.kernel("sqrt", [first])}
    one, two = b.chains(keep=keep)[0], b.chains(keep=keep)[0]
    assert one.source == two.source
    assert chains_module._compiled(one.source) is chains_module._compiled(two.source)


def test_loops_are_kept_as_files_for_numbas_disk_cache(tmp_path, monkeypatch):
    """The generated source goes to the cache dir (numba caches its machine code beside it); where no file
    can be written, the loop is compiled from memory and still runs."""
    def chain() -> chains_module.Chain:
        b = _Builder()
        first = b.kernel("sub", [b.tensor((3,), value=[1.0, 2.0, 4.0]), b.tensor((), value=1.0)])
        (found,) = b.chains(keep={b.kernel("sqrt", [first])})
        assert _run(found, b.values)[found.outputs[0]].tolist() == [0.0, 1.0, float(np.sqrt(np.float32(3.0)))]
        return found

    monkeypatch.setenv(chains_module.CACHE_ENV_VAR, str(tmp_path / "chains"))
    monkeypatch.setattr(chains_module, "_compiled_loops", {})
    source = chain().source
    (path,) = (tmp_path / "chains" / chains_module._CODEGEN_STAMP).glob("chain_*.py")
    assert path.read_text() == source
    assert list((tmp_path / "chains" / chains_module._CODEGEN_STAMP / "__pycache__").glob("*.nbi"))
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(chains_module.CACHE_ENV_VAR, str(tmp_path / "file" / "chains"))
    monkeypatch.setattr(chains_module, "_compiled_loops", {})
    chain()


def test_loops_of_other_code_generations_are_removed_once_unused_for_two_weeks(tmp_path, monkeypatch):
    """The cache keeps one directory per code generation; another generation's (and the flat files of
    versions before the directories) go when they have not changed for STALE_AFTER_SECONDS, what is recent
    or not the cache's own stays."""
    root = tmp_path / "chains"
    old_generation, recent_generation = root / ("0" * 16), root / ("1" * 16)
    for directory in (old_generation / "__pycache__", recent_generation, root / "__pycache__"):
        directory.mkdir(parents=True)
    (old_generation / "chain_aa.py").write_text("")
    (old_generation / "__pycache__" / "chain_aa.nbi").write_text("")
    legacy, legacy_cache = root / "chain_bb.py", root / "__pycache__" / "chain_bb.loop-1.py311.nbi"
    unrelated, not_a_generation = root / "notes.txt", root / "keep-this-dir"
    for path in (legacy, legacy_cache, unrelated):
        path.write_text("")
    not_a_generation.mkdir()
    month_ago = time.time() - 30 * 24 * 3600
    for path in (old_generation, legacy, legacy_cache, unrelated, not_a_generation):
        os.utime(path, (month_ago, month_ago))
    monkeypatch.setenv(chains_module.CACHE_ENV_VAR, str(root))
    monkeypatch.setattr(chains_module, "_compiled_loops", {})
    monkeypatch.setattr(chains_module, "_pruned", set())
    b = _Builder()
    first = b.kernel("mul", [b.tensor((3,), value=[1.0, 2.0, 4.0]), b.tensor((), value=3.0)])
    (found,) = b.chains(keep={b.kernel("neg", [first])})
    assert _run(found, b.values)[found.outputs[0]].tolist() == [-3.0, -6.0, -12.0]
    assert not old_generation.exists() and not legacy.exists() and not legacy_cache.exists()
    assert recent_generation.exists() and unrelated.exists() and not_a_generation.exists()
    assert list((root / chains_module._CODEGEN_STAMP).glob("chain_*.py"))


# ---- whole steps ------------------------------------------------------------------------------------------

def _model(tmp_path, name: str):
    import tensorflow as tf  # noqa: F401  (the model functions build TF graphs)
    from estimator import ModeKeys

    from cerebras_tf import CerebrasEstimator, CSRunConfig
    from cerebras_tf.compiler import initial
    from cerebras_tf.precheck import precheck

    if name == "mlp":
        from benchmarks.bench_models import mlp_input_fn as input_fn
        from benchmarks.bench_models import mlp_model_fn as model_fn
        params: dict = {}
    elif name == "cnn":
        from examples.zoo.cnn import input_fn, model_fn
        params = {"batch_size": 8, "image_size": 12, "filters": [4, 8, 8], "num_examples": 64}
    else:
        from examples.zoo.transformer import input_fn, model_fn
        params = {}
    estimator = CerebrasEstimator(model_fn, model_dir=str(tmp_path / "model"),
                                  config=CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1), params=params)
    model = precheck(estimator, input_fn, ModeKeys.TRAIN)
    program = estimator.compile(input_fn).program
    batches = [batch for batch, _ in zip(input_fn(params).as_numpy_iterator(), range(3))]
    return program, initial.initial_values(model, program), batches


@pytest.mark.parametrize("half_dtype", ["float32", "float16"], indirect=True)
@pytest.mark.parametrize("name,fused", [("transformer", 100), ("cnn", 10), ("mlp", 0)])
def test_steps_with_chains_give_the_bits_of_steps_without(tmp_path, name, fused, half_dtype):
    from cerebras_tf.wse.executor import Executor

    program, start, batches = _model(tmp_path, name)
    runs = []
    for on in (True, False):
        with use_chains(on):
            executor = Executor(program, start, grad_scaler=GradScaler(loss_scale="dynamic"))
        members = sum(len(p.chain.kernels) for plan in executor._plans for p in plan if p.chain is not None)
        assert members >= fused if on else members == 0
        if on and name == "transformer" and half_dtype == "float16":  # an add_n's rounding, read after a
            assert any(p.chain.place is not p.chain.kernels[-1]  # bias_add_grad: runs with the add_n
                       for plan in executor._plans for p in plan if p.chain is not None)
        results = [executor.step(features, labels) for features, labels in batches]
        runs.append((results, executor.variables()))
    (with_chains, variables), (without, reference) = runs
    for a, b in zip(with_chains, without):
        assert a.finite == b.finite and a.loss_scale == b.loss_scale
        assert a.outputs.keys() == b.outputs.keys()
        for key in a.outputs:
            assert _same_bits(a.outputs[key], b.outputs[key]), key
    for key, value in variables.items():
        assert _same_bits(value, reference[key]), key


def test_data_parallel_steps_with_chains_give_the_bits_of_steps_without(tmp_path):
    from cerebras_tf.wse.executor import Executor

    program, start, batches = _model(tmp_path, "transformer")
    runs = []
    for on in (True, False):
        with use_chains(on):
            executor = Executor(program, start, grad_scaler=GradScaler(loss_scale="dynamic"))
        results = [executor.step_systems([batches[0], batches[1]]), executor.step_systems([batches[2], batches[0]])]
        runs.append(([r.outputs for r in results], executor.variables()))
    for a, b in zip(runs[0][0], runs[1][0]):
        for key in a:
            assert _same_bits(a[key], b[key]), key
    for key, value in runs[0][1].items():
        assert _same_bits(value, runs[1][1][key]), key


def test_chain_intermediates_are_never_stored(tmp_path):
    """In a transformer step, the tensors only a chain's members read are no planned unit's output and no
    unit's input: the executor stores only units' outputs (wse/dataflow.py's `complete`), so they never take
    memory beyond the loop that computes them."""
    program, start, batches = _model(tmp_path, "transformer")
    with use_chains(True):
        executor = Executor(program, start)
    units = [p for plan in executor._plans for p in plan]
    internal = {k.outputs[0] for p in units if p.chain is not None for k in p.chain.kernels} - {
        t for p in units for t in p.outputs}
    assert len(internal) > 100
    assert not internal & {t for p in units for t in p.reads}
    executor.step(*batches[0])  # and the step runs


def test_the_adam_chains_write_the_transformers_variables_in_place(tmp_path):
    """Each weight's Adam-with-weight-decay chain writes m, v and the weight straight into their arrays (the
    assign_variable kernels it feeds are absorbed: no new array, no copy); the steps' bits are checked against
    the kernels one by one in test_steps_with_chains_give_the_bits_of_steps_without."""
    program, start, batches = _model(tmp_path, "transformer")
    with use_chains(True):
        executor = Executor(program, start)
    absorbed = [a for plan in executor._plans for p in plan for a in p.absorbed]
    assigns = [k for k in program.kernels if k.kind == "assign_variable"]
    assert len(absorbed) >= 0.9 * len(assigns) and all(a.kind == "assign_variable" for a in absorbed)
    variables = executor._variables
    before = {name: variables[name] for name in variables}
    executor.step(*batches[0])
    assert all(variables[name] is before[name] for name in before)  # the same arrays, written in place


@pytest.mark.parametrize("row", [False, True], ids=["flat", "rows"])
def test_outputs_written_into_the_inputs_they_are_run_a_loop_that_takes_each_array_once(monkeypatch, row):
    """Where a chain writes outputs into variables (attrs["into"]) that it also reads, twice even (an Adam update
    reads its weight for the weight decay and for the update), its loop takes each array once and writes into
    the array it read (LLVM leaves a loop whose arrays overlap scalar): the bits of the kernels one by one."""
    rng = np.random.default_rng(11)
    shape = [5, 67]
    b = _Builder()
    m = b.tensor(shape, value=rng.standard_normal(shape))
    g = b.tensor(shape, value=np.concatenate([SPECIALS, rng.standard_normal(5 * 67 - len(SPECIALS))]))
    w = b.tensor(shape, value=rng.standard_normal(shape))
    w_again = b.tensor(shape, value=b.values[w])
    rate = b.tensor([67] if row else [], value=rng.standard_normal(67) if row else 0.5, const=True)
    new_m = b.kernel("add", [b.kernel("mul", [m, rate]), g])
    new_w = b.kernel("sub", [w, b.kernel("mul", [new_m, w_again])])
    chain = _check_one_chain(b, keep=[new_m, new_w])
    assert chain.outputs == [new_m, new_w]
    reference = b.reference("float32")
    variables = [b.values[m].copy(), b.values[w].copy()]
    arrays = {m: variables[0], g: b.values[g], w: variables[1], w_again: variables[1], rate: b.values[rate]}
    compiled = []
    real = chains_module._compiled
    monkeypatch.setattr(chains_module, "_compiled", lambda source: compiled.append(source) or real(source))
    with np.errstate(all="ignore"):
        assert chain.fn([arrays[t] for t in chain.inputs], {"into": [0, 1]}, KernelContext(variables=variables)) == []
    assert _same_bits(variables[0], reference[new_m]) and _same_bits(variables[1], reference[new_w])
    (source,) = compiled  # the loop for these arrays: m, g, w (once), rate, and no output of its own
    weights = [chain.inputs.index(w), chain.inputs.index(w_again)]
    once = [f"a{i}" for i in range(len(chain.inputs)) if i != max(weights)]
    assert source.split("def loop(")[1].split(")")[0].split(", ") == [*once, "lo", "hi"]
    stores = re.findall(r"(\w+)\[[^\]]*\] = t\d+", source)  # element stores: out[e] = t3
    assert sorted(stores) == sorted([f"a{chain.inputs.index(m)}", f"a{min(weights)}"]), source


def test_same_arrays_finds_the_inputs_an_output_or_another_input_is():
    x, y, z = (np.zeros((2, 3), np.float32) for _ in range(3))
    kinds, dtypes = ["f", "f", "f", "s"], [np.dtype(np.float32)] * 4
    scalar = np.zeros(1, np.float32)
    assert chains_module._same_arrays([x, y, z, scalar], kinds, dtypes, [np.zeros((2, 3), np.float32)]) == ()
    assert chains_module._same_arrays([x, y, x, scalar], kinds, dtypes, [z, y]) == (0, 1, 0, 3, -1, 1)
    # only arrays the loop reads as they are: not a strided view, not another dtype, not one read broadcast
    assert chains_module._same_arrays([x.T, y], ["f", "f"], dtypes[:2], [x.T]) == ()
    half = np.zeros((2, 3), np.float16)
    assert chains_module._same_arrays([half], ["f"], dtypes[:1], [half]) == ()
    assert chains_module._same_arrays([x, y], ["r", "f"], dtypes[:2], [x]) == ()


def _matmul_then_chain(also_read: bool) -> ir.Program:
    """m = x @ w (a new array each step), then z = m * 2 + 1 (a chain); with `also_read`, n = exp(m) too, after
    the chain (exp is no chain member)."""
    tensors = [ir.Tensor(0, [4, 3], "float32", "features"), ir.Tensor(1, [3, 5], "float32", "w", ir.Const(0.5)),
               ir.Tensor(2, [4, 5], "float32", "m"), ir.Tensor(3, [], "float32", "two", ir.Const(2.0)),
               ir.Tensor(4, [4, 5], "float32", "y"), ir.Tensor(5, [], "float32", "one", ir.Const(1.0)),
               ir.Tensor(6, [4, 5], "float32", "z"), ir.Tensor(7, [4, 5], "float32", "n")]
    kernels = [ir.Kernel(0, "matmul", [0, 1], [2], {"transpose_a": False, "transpose_b": False}),
               ir.Kernel(1, "mul", [2, 3], [4], {}), ir.Kernel(2, "add", [4, 5], [6], {})]
    outputs = {"predictions/z": 6}
    if also_read:
        kernels.append(ir.Kernel(3, "exp", [2], [7], {}))
        outputs["predictions/n"] = 7
    return ir.Program(mode="infer", tensors=tensors, kernels=kernels, variables=[], inputs={"features": 0},
                      outputs=outputs)


def _arrays_made_by_the_matmul(executor: Executor) -> list[np.ndarray]:
    """The list the executor's one matmul unit appends each array it makes to, from now on."""
    (matmul,) = [p for plan in executor._plans for p in plan if p.kernel.kind == "matmul"]
    made: list[np.ndarray] = []
    real = matmul.fn
    matmul.fn = lambda inputs, attrs, ctx: made.extend(real(inputs, attrs, ctx)) or made[-1:]
    return made


@pytest.mark.parametrize("also_read", [False, True], ids=["only-the-chain-reads-it", "read-after-the-chain"])
def test_a_chain_writes_into_an_input_only_it_reads(also_read):
    """As TF's kernels forward an input's buffer: a chain writes its output into the array of an input that
    nothing else reads (made new by the matmul before it), and into a new array when a later kernel reads
    that input too, which then sees it unchanged."""
    with use_chains(True):
        executor = Executor(_matmul_then_chain(also_read), {})
    (chain,) = [p for plan in executor._plans for p in plan if p.chain is not None]
    assert chain.kernel.attrs.get("reuse") == (None if also_read else [0])
    made = _arrays_made_by_the_matmul(executor)
    x = np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32)
    outputs = executor.step(x).outputs
    m = x @ np.full((3, 5), 0.5, np.float32)
    assert _same_bits(outputs["predictions/z"], m * np.float32(2) + np.float32(1))
    assert np.shares_memory(outputs["predictions/z"], made[0]) != also_read
    if also_read:
        assert _same_bits(outputs["predictions/n"], np.exp(m)) and _same_bits(made[0], m)


@pytest.mark.parametrize("half_dtype", ["float32", "float16"], indirect=True)
def test_steps_writing_into_dead_inputs_give_the_bits_of_steps_without(tmp_path, half_dtype, monkeypatch):
    """The zoo transformer's bias_adds add into their matmul's array, and (float16) its to_halfs round the
    array they read where it is, through the reshapes and transposes between, when nothing else reads it
    (Executor._reuse_dead_inputs): the steps' outputs and variables are those of steps that write every
    result into a new array."""
    program, start, batches = _model(tmp_path, "transformer")
    runs = []
    for reuse in (True, False):
        if not reuse:
            monkeypatch.setattr(Executor, "_reuse_dead_inputs", lambda self, fresh, made_by: None)
        with use_chains(True):
            executor = Executor(program, start, grad_scaler=GradScaler(loss_scale="dynamic"))
        units = [p.kernel for plan in executor._plans for p in plan]
        into_bias = [k for k in units if k.kind == "bias_add" and k.attrs.get("reuse")]
        rounded_in_place = [k for k in units if k.kind == "to_half" and k.attrs.get("in_place")]
        assert (len(into_bias) >= 4) == reuse
        assert (len(rounded_in_place) >= 4) == (reuse and half_dtype == "float16")
        results = [executor.step(features, labels) for features, labels in batches]
        runs.append((results, executor.variables()))
    (with_reuse, variables), (without, reference) = runs
    for a, b in zip(with_reuse, without):
        assert a.outputs.keys() == b.outputs.keys()
        for key in a.outputs:
            assert _same_bits(a.outputs[key], b.outputs[key]), key
    for key, value in variables.items():
        assert _same_bits(value, reference[key]), key


@pytest.mark.parametrize("half_dtype", ["float32", "float16"], indirect=True)
def test_unscaling_the_gradients_in_their_arrays_gives_the_bits_of_the_grad_scaler(tmp_path, half_dtype,
                                                                                   monkeypatch):
    """The zoo transformer's gradients are unscaled and checked in one pass each, where they are when the step
    owns them outright (Executor._owned_gradients: the embedding's gradient, the biggest, among them), by units
    of the first phase, which its global norm's l2_losses join (Executor._early_layout): its steps' outputs,
    variables and loss scale are those of steps that unscale between the phases, into new arrays, and with
    GradScaler's own unscale_and_check (taken when it clips)."""
    program, start, batches = _model(tmp_path, "transformer")
    runs = []
    for way in ("early, in place", "between the phases", "new arrays", "grad scaler"):
        if way == "between the phases":
            monkeypatch.setattr(Executor, "_early_layout", lambda self: None)
        if way == "new arrays":
            monkeypatch.setattr(Executor, "_owned_gradients", lambda self, fresh, made_by: frozenset())
        if way == "grad scaler":
            monkeypatch.setattr(GradScaler, "clips", property(lambda self: True))
        scaler = GradScaler(loss_scale="dynamic", init_scale=2.0**15, max_loss_scale=2.0**20, steps_per_increase=2)
        with use_chains(True):
            executor = Executor(program, start, grad_scaler=scaler)
        owned = executor._unscale_in_place
        if way == "early, in place":
            assert len(owned) >= 20 and max(program.gradients, key=lambda t: program.tensors[t].size) in owned
            first = [p.kernel.kind for p in executor._step_layout.plans[0]]
            assert first.count("unscale") == len(program.gradients) == first.count("l2_loss")
        results = [executor.step(features, labels) for features, labels in batches]
        runs.append((results, executor.variables(), scaler.scale))
    (in_place, variables, scale), *others = runs
    assert scale == 2.0**16  # two finite steps doubled it
    for results, reference, reference_scale in others:
        assert reference_scale == scale
        for a, b in zip(in_place, results):
            assert a.outputs.keys() == b.outputs.keys() and a.finite and b.finite
            for key in a.outputs:
                assert _same_bits(a.outputs[key], b.outputs[key]), key
        for key, value in variables.items():
            assert _same_bits(value, reference[key]), key


@pytest.mark.parametrize("also_read", [False, True], ids=["dead", "read-after"])
def test_a_to_half_rounds_in_place_through_a_view_only_what_nothing_else_reads(also_read):
    """matmul -> reshape -> to_half (float16): the rounding goes into the matmul's own array, and into a new
    one when a later kernel reads the matmul's result, which then sees it unrounded."""
    tensors = [ir.Tensor(0, [4, 6], "float32", "features"), ir.Tensor(1, [6, 8], "float32", "w", ir.Const(1 / 3)),
               ir.Tensor(2, [4, 8], "float32", "m"), ir.Tensor(3, [4, 2, 4], "float32", "r"),
               ir.Tensor(4, [4, 2, 4], "float32", "h")]
    kernels = [ir.Kernel(0, "matmul", [0, 1], [2], {"transpose_a": False, "transpose_b": False}),
               ir.Kernel(1, "reshape", [2], [3], {"shape": [4, 2, 4]}), ir.Kernel(2, "to_half", [3], [4], {})]
    outputs = {"predictions/h": 4}
    if also_read:
        tensors.append(ir.Tensor(5, [4, 8], "float32", "n"))
        kernels.append(ir.Kernel(3, "neg", [2], [5], {}))
        outputs["predictions/n"] = 5
    program = ir.Program(mode="infer", tensors=tensors, kernels=kernels, variables=[], inputs={"features": 0},
                         outputs=outputs)
    with use_chains(False):
        executor = Executor(program, {}, half_dtype="float16")
    (to_half,) = [p for plan in executor._plans for p in plan if p.kernel.kind == "to_half"]
    assert to_half.kernel.attrs.get("in_place", False) != also_read
    made = _arrays_made_by_the_matmul(executor)
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    got = executor.step(x).outputs
    m = x @ np.full((6, 8), 1 / 3, np.float32)
    assert _same_bits(got["predictions/h"], m.reshape(4, 2, 4).astype(np.float16).astype(np.float32))
    assert np.shares_memory(got["predictions/h"], made[0]) != also_read
    if also_read:
        assert _same_bits(got["predictions/n"], -m) and _same_bits(made[0], m)


def _big_chain(x: np.ndarray) -> tuple[_Builder, chains_module.Chain]:
    """The chain x * 1 + 0 over x's elements."""
    b = _Builder()
    xt = b.tensor([x.size], value=x)
    one = b.tensor([], value=1.0, const=True)
    y = b.tensor([x.size], value=np.zeros(x.size, np.float32))
    b.kernel("add", [b.kernel("mul", [xt, one]), y])
    return b, _check_one_chain(b, keep=[b.kernels[-1].outputs[0]])


def test_a_big_chain_split_on_numbas_threads_gives_the_bits_of_one_thread(monkeypatch):
    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    size = threads.LOOP_MIN_ELEMENTS_PER_THREAD * 2 + 5
    if threads.loop_parts(size) < 2:
        pytest.skip("numba has no thread-safe threading layer here")
    x = np.random.default_rng(3).standard_normal(size).astype(np.float32)
    x[: len(SPECIALS)] = x[-len(SPECIALS):] = SPECIALS  # specials and subnormals in each part of the split
    x[size // 2: size // 2 + 4] = 1e-40
    b, chain = _big_chain(x)
    split = _run(chain, b.values)
    monkeypatch.setattr(threads, "loop_parts", lambda size, per=0: 1)
    alone = _run(chain, b.values)
    assert all(_same_bits(split[t], alone[t]) for t in chain.outputs)


def test_each_of_numbas_threads_flushes_denormals_as_the_kernels_thread(monkeypatch):
    """The part of a split loop that runs on a thread of numba's own flushes subnormals as the thread that
    started the kernel does (inside the executor's step), and keeps them outside it."""
    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    size = threads.LOOP_MIN_ELEMENTS_PER_THREAD * 2
    if threads.loop_parts(size) < 2:
        pytest.skip("numba has no thread-safe threading layer here")
    b, chain = _big_chain(np.full(size, 1e-40, np.float32))
    with denormals.flushing():
        (flushed,) = _run(chain, b.values).values()
    (kept,) = _run(chain, b.values).values()
    assert not flushed.any()  # both halves: the second one ran on numba's thread
    assert (kept == np.float32(1e-40)).all()


def test_loops_stay_on_the_calling_thread_beside_a_provider_whose_pool_spins(tmp_path, monkeypatch):
    """With TensorFlow's kernels (a pool that keeps spinning after each op) no chain splits on numba's threads;
    with numpy's, the big ones do."""
    import dataclasses

    from cerebras_tf.wse.executor import Executor
    from cerebras_tf.wse.kernels import NUMPY_HOST_KERNELS

    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    if threads.loop_parts(threads.LOOP_MIN_ELEMENTS_PER_THREAD * 2) < 2:
        pytest.skip("numba has no thread-safe threading layer here")
    monkeypatch.setattr(chains_module, "LOOP_MIN_ELEMENTS_PER_THREAD", 256)  # the small model's chains split
    program, start, batches = _model(tmp_path, "cnn")
    decided = []
    loop_parts = threads.loop_parts
    monkeypatch.setattr(threads, "loop_parts", lambda *args: decided.append(loop_parts(*args)) or decided[-1])
    spinning = dataclasses.replace(NUMPY_HOST_KERNELS, spinning_pool=True)
    for provider in (NUMPY_HOST_KERNELS, spinning):
        decided.clear()
        with use_chains(True):
            Executor(program, start, host_kernels=provider, threads=1).step(*batches[0])
        assert decided and max(decided) == (1 if provider.spinning_pool else 2), provider.name


@pytest.mark.parametrize("threads_to_use", [1, 2])
def test_a_step_leaves_no_reference_cycles(tmp_path, threads_to_use, monkeypatch):
    """Every array a step makes is freed when the step ends, not when the garbage collector next runs: a cycle
    through a kernel's temporaries (l2_loss's recursive closure did) keeps a step's gradients alive, and a
    collection mid-step moves them to an older generation, collected rarely (the zoo transformer's resident
    memory grew 12 MB a step)."""
    import gc

    from cerebras_tf.wse.executor import Executor
    from cerebras_tf.wse.kernels import softmax

    monkeypatch.setattr(softmax, "_SQUARES_BLOCK", 64)  # the small model's l2 losses go block by block too
    program, start, batches = _model(tmp_path, "transformer")
    executor = Executor(program, start, grad_scaler=GradScaler(loss_scale="dynamic"), threads=threads_to_use)
    executor.step(*batches[0])
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        executor.step(*batches[1])
        gc.collect()
        assert not gc.garbage, gc.garbage[:10]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
