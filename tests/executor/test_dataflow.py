"""The dataflow scheduler (cerebras_tf/wse/dataflow.py): its dependency graph, side-by-side runs, errors, drops,
and the executor on the zoo transformer giving the bits of one kernel at a time."""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable

import numpy as np
import pytest

from cerebras_tf.wse import dataflow, memory, threads
from cerebras_tf.wse.dataflow import Access, Schedule


def _waits_for(schedule: Schedule) -> list[set[int]]:
    before: list[set[int]] = [set() for _ in schedule.waits]
    for unit, later in enumerate(schedule.dependents):
        for index in later:
            before[index].add(unit)
    return before


def test_the_graph_orders_data_variables_and_refusals():
    units = [
        Access(reads=[], outputs=[10]),                                  # 0: produces t10
        Access(reads=[10], outputs=[11], reads_vars={"w"}),              # 1: reads w (or a view of it)
        Access(reads=[], outputs=[12], reads_vars={"w"}),                # 2: reads w
        Access(reads=[11], outputs=[], writes_vars={"w"}),               # 3: writes w after both reads
        Access(reads=[], outputs=[13], reads_vars={"w"}),                # 4: reads what 3 wrote
        Access(reads=[], outputs=[14], checks_input=True),               # 5: may refuse its input
        Access(reads=[], outputs=[15]),                                  # 6: independent
        Access(reads=[], outputs=[], writes_vars={"v"}),                 # 7: writes only after 5 could refuse
        Access(reads=[], outputs=[], writes_vars={"w"}),                 # 8: writes w after 3's write, 4's read
    ]
    before = _waits_for(Schedule.build(units, droppable=set()))
    assert before == [set(), {0}, set(), {1, 2}, {3}, set(), set(), {5}, {3, 4, 5}]


def test_ready_units_start_longest_path_first():
    # 0 -> 1 -> 2 is the critical path (3 units of cost 1); 3 is alone with cost 2; 4 and 5 cost nothing
    units = [Access(reads=[], outputs=[10], cost=1.0), Access(reads=[10], outputs=[11], cost=1.0),
             Access(reads=[11], outputs=[12], cost=1.0), Access(reads=[], outputs=[13], cost=2.0),
             Access(reads=[], outputs=[14]), Access(reads=[], outputs=[15])]
    schedule = Schedule.build(units, set())
    assert schedule.rank == (3.0, 2.0, 1.0, 2.0, 0.0, 0.0)
    started: list[int] = []
    dataflow._Run(schedule, started.append, lambda i, r: None, lambda t: None).work()  # one thread: the order
    assert started == [0, 1, 3, 2, 4, 5]  # among equal ranks (1 and 3), program order
    without_costs = Schedule.build([dataclasses.replace(u, cost=0.0) for u in units], set())
    started.clear()
    dataflow._Run(without_costs, started.append, lambda i, r: None, lambda t: None).work()
    assert started == [0, 1, 2, 3, 4, 5]  # program order


def test_a_tensor_is_dropped_when_every_reader_has_finished_whatever_the_order():
    units = [Access(reads=[], outputs=[1]), Access(reads=[1], outputs=[2]), Access(reads=[1], outputs=[3])]
    schedule = Schedule.build(units, droppable={1})
    release = threading.Event()
    dropped: list[int] = []
    finished: list[int] = []

    def compute(index: int) -> int:
        if index == 1:  # the first reader in program order finishes last
            assert release.wait(10), "unit 2 never ran beside unit 1"
        if index == 2:
            release.set()
        return index

    def complete(index: int, result: int) -> None:
        finished.append(index)

    def drop(tensor: int) -> None:
        assert set(finished) >= {1, 2}, f"tensor {tensor} dropped while a reader had not finished: {finished}"
        dropped.append(tensor)

    dataflow.run(schedule, compute, complete, drop, threads_to_use=2)
    assert finished[-1] == 1 and dropped == [1]


@pytest.mark.parametrize("threads_to_use", [1, 2])
def test_the_first_error_in_program_order_is_raised_and_nothing_after_it_starts(threads_to_use):
    units = [Access(reads=[], outputs=[i]) for i in range(8)]
    started: list[int] = []
    lock = threading.Lock()

    def compute(index: int) -> int:
        with lock:
            started.append(index)
        if index in (3, 5):
            raise ValueError(f"unit {index}")
        return index

    with pytest.raises(ValueError, match="unit 3"):
        dataflow.run(Schedule.build(units, set()), compute, lambda i, r: None, lambda t: None, threads_to_use)
    assert set(range(4)) <= set(started)  # every unit before the error ran
    if threads_to_use == 1:
        assert started == [0, 1, 2, 3]
    else:  # beside unit 3, at most the one next to it started
        assert set(started) <= set(range(5))


def test_in_program_order_each_tensor_is_dropped_after_its_last_reader():
    units = [Access(reads=[], outputs=[1]), Access(reads=[1], outputs=[2]), Access(reads=[1, 2], outputs=[3]),
             Access(reads=[3], outputs=[4]), Access(reads=[], outputs=[5])]
    schedule = Schedule.build(units, droppable={1, 2, 3})
    assert schedule.drops_in_order() == ((), (), (1, 2), (3,), ())
    dropped: list[tuple[int, int]] = []
    finished: list[int] = []
    dataflow.run(schedule, lambda i: i, lambda i, r: finished.append(i), lambda t: dropped.append((len(finished), t)))
    assert dropped == [(3, 1), (3, 2), (4, 3)]  # right after units 2, 2 and 3 finished


def test_the_executors_in_order_run_leaves_what_the_scheduler_leaves():
    """One thread (Executor._run_in_order, wiring resolved per layout) and two (dataflow.run): the same values
    and the same tensors dropped after a phase."""
    from cerebras_tf import ir
    from cerebras_tf.wse.executor import Executor
    tensors = [ir.Tensor(i, [8, 8], "float32", f"t{i}") for i in range(5)]
    kernels = [ir.Kernel(0, "neg", [0], [1], {}), ir.Kernel(1, "abs", [1], [2], {}),
               ir.Kernel(2, "add", [1, 2], [3], {}), ir.Kernel(3, "mul", [3, 3], [4], {})]
    program = ir.Program(mode="eval", tensors=tensors, kernels=kernels, variables=[], inputs={"features": 0},
                         outputs={"predictions": 4})
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    left = []
    for count in (1, 2):
        executor = Executor(program, {}, threads=count)
        executor._threads_now = count
        values = {0: x}
        executor._run(executor._step_layout, 0, values, 0, None)
        left.append(values)
    assert left[0].keys() == left[1].keys() == {4}  # the output kept; the input, 1, 2 and 3 dropped
    for t in left[0]:
        np.testing.assert_array_equal(left[0][t], left[1][t])
    np.testing.assert_array_equal(left[0][4], np.square(-x + np.abs(-x)))


def test_steps_take_big_buffers_from_the_executors_pool_until_one_thread_is_chosen(monkeypatch):
    """While the ThreadChoice tries one thread and two, every step pools its big arrays (a one-thread trial step
    on malloc's heap would grow that heap beside the pool); once it has chosen one thread the pool is let go."""
    from cerebras_tf import ir
    from cerebras_tf.wse.executor import Executor
    monkeypatch.setattr(memory, "POOLED_BYTES", 4096)
    tensors = [ir.Tensor(i, [64, 64], "float32", f"t{i}") for i in range(3)]
    kernels = [ir.Kernel(0, "softmax", [0], [1], {}), ir.Kernel(1, "matmul", [1, 1], [2], {})]
    program = ir.Program(mode="eval", tensors=tensors, kernels=kernels, variables=[], inputs={"features": 0},
                         outputs={"predictions": 2})
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    executor = Executor(program, {})
    executor._threads = trial = dataflow.ThreadChoice((1, 2))
    trial._steps = trial.WARMUP  # past the warm-up: the trial's rounds start with one thread
    assert trial.next() == 1 and trial.chosen is None
    pooled = executor.step(x).outputs["predictions"]
    assert executor._pool.nbytes >= 64 * 64 * 4  # softmax's output at least
    executor._threads = dataflow.ThreadChoice((1,))
    np.testing.assert_array_equal(executor.step(x).outputs["predictions"], pooled)
    assert executor._pool.nbytes == 0


def test_an_inline_unit_runs_on_the_thread_that_settles_its_last_dependency():
    """Views (Access.inline) never go through the ready heap: the thread that settles the unit they wait for
    runs them there and then, a chain of them too; their results, drops and errors are any unit's."""
    units = [Access(reads=[], outputs=[1]), Access(reads=[1], outputs=[2], inline=True),  # 0 -> view 1
             Access(reads=[2], outputs=[3], inline=True), Access(reads=[3], outputs=[4]),  # -> view 2 -> 3
             Access(reads=[], outputs=[5]), Access(reads=[5], outputs=[6], inline=True)]  # 4 -> view 5
    schedule = Schedule.build(units, droppable={1, 2, 3, 5})
    assert schedule.inline == {1, 2, 5}
    ran_on: dict[int, int] = {}
    in_settle = threading.local()
    results: dict[int, int] = {}
    dropped: list[int] = []

    def compute(index: int) -> int:
        ran_on[index] = threading.get_ident()
        assert (index in schedule.inline) == getattr(in_settle, "on", False)
        return index * 10

    def complete(index: int, result: int) -> None:
        results[index] = result
        in_settle.on = True  # what this thread computes before it takes its next unit is inline

    state = dataflow._Run(schedule, compute, complete, dropped.append)
    original_take = state._take

    def take() -> object:
        in_settle.on = False
        return original_take()
    state._take = take  # type: ignore[method-assign]
    state.work()
    assert results == {i: i * 10 for i in range(6)}
    assert sorted(dropped) == [1, 2, 3, 5]
    assert ran_on[1] == ran_on[2] == ran_on[0] and ran_on[5] == ran_on[4]

    def failing(index: int) -> int:
        if index == 2:
            raise ValueError("view 2")
        return index
    with pytest.raises(ValueError, match="view 2"):
        dataflow.run(schedule, failing, lambda i, r: None, lambda t: None, threads_to_use=2)


def test_units_run_side_by_side_and_blas_keeps_one_thread_meanwhile():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    units = [Access(reads=[], outputs=[0]), Access(reads=[], outputs=[1])]
    other_started = [threading.Event(), threading.Event()]
    blas_threads: list[int] = []

    def compute(index: int) -> int:
        other_started[index].set()
        assert other_started[1 - index].wait(10), "the two independent units did not run at once"
        blas_threads.extend(info["num_threads"] for info in threadpoolctl.threadpool_info()
                            if info["user_api"] == "blas")
        return index

    before = [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]
    with threads.one_blas_thread():
        dataflow.run(Schedule.build(units, set()), compute, lambda i, r: None, lambda t: None, 2)
    assert blas_threads and set(blas_threads) == {1}
    assert [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"] == before


def test_a_split_kernels_blocks_are_shared_by_the_free_thread(monkeypatch):
    """A kernel's split_range inside a side-by-side run: its range in blocks (2 per core), every block once,
    and the idle thread takes some of them."""
    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    done: list[tuple[int, int, str]] = []
    lock = threading.Lock()
    joined = threading.Event()

    def work(lo: int, hi: int) -> None:
        name = threading.current_thread().name
        with lock:
            done.append((lo, hi, name))
        if name != done[0][2]:
            joined.set()
        elif lo == 0:
            joined.wait(10)  # the first block waits until the other thread has taken one

    units = [Access(reads=[], outputs=[0], cost=1.0), Access(reads=[], outputs=[1])]  # two: a helper thread runs
    dataflow.run(Schedule.build(units, set()), lambda i: threads.split_range(100, work, 10) if i == 0 else None,
                 lambda i, r: None, lambda t: None, 2)
    assert sorted((lo, hi) for lo, hi, _ in done) == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert len({name for _, _, name in done}) == 2
    assert not hasattr(threads._local, "share") or threads._local.share is None  # nothing shared after the run


def test_an_error_in_a_shared_block_is_its_kernels_error_and_every_block_finishes(monkeypatch):
    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    done: list[int] = []

    def work(lo: int, hi: int) -> None:
        time.sleep(0.01)
        if lo == 25:
            raise ValueError("block 25:50 refused")
        done.append(lo)

    units = [Access(reads=[], outputs=[0]), Access(reads=[0], outputs=[1])]
    later: list[int] = []

    def compute(index: int) -> None:
        if index == 0:
            threads.split_range(100, work, 10)
        else:
            later.append(index)
    with pytest.raises(ValueError, match="block 25:50 refused"):
        dataflow.run(Schedule.build(units, set()), compute, lambda i, r: None, lambda t: None, 2)
    assert sorted(done) == [0, 50, 75] and later == []


@pytest.mark.parametrize("shape,attrs", [((512, 256, 512), {}), ((100, 300, 1000), {}), ((37, 512, 999), {}),
                                         ((513, 257, 129), {"transpose_a": True})])
def test_a_matmuls_fixed_blocks_give_the_same_bits_however_the_threads_run_them(shape, attrs, monkeypatch):
    """A big single-threaded sgemm is cut into blocks fixed by its shape (host_numpy._blocks), whose bits (with
    some of OpenBLAS's kernels not those of the whole product) are the same shared by the executor's threads,
    on the pool, one after another beside another kernel, and on a host of 1, 2 or 8 cores."""
    from cerebras_tf.wse.kernels import host_numpy

    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if attrs.get("transpose_a") else (m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    lhs = a.T if attrs.get("transpose_a") else a
    rows = m >= n
    bounds = host_numpy._blocks(m if rows else n, (n if rows else m) * k)
    assert len(bounds) - 1 == 2  # below 2 * BLOCK_PRODUCTS
    blocks: list[int] = []
    share = dataflow._Run._share

    def counted(self, cut, work, rank):
        blocks.append(len(cut) - 1)
        share(self, cut, work, rank)
    monkeypatch.setattr(dataflow._Run, "_share", counted)
    with threads.one_blas_thread():
        parts = [lhs[lo:hi] @ b if rows else lhs @ b[:, lo:hi] for lo, hi in zip(bounds, bounds[1:])]
        expected = np.concatenate(parts, axis=0 if rows else 1)
        got: list[np.ndarray] = []
        dataflow.run(Schedule.build([Access(reads=[], outputs=[0]), Access(reads=[], outputs=[1])], set()),
                     lambda i: host_numpy.matmul([a, b], attrs) if i == 0 else None,
                     lambda i, r: got.append(r) if i == 0 else None, lambda t: None, 2)
        assert blocks == [len(bounds) - 1]  # shared by the run's threads
        np.testing.assert_array_equal(got[0], expected)
        for cores in (1, 2, 8):
            monkeypatch.setattr(threads, "host_threads", lambda cores=cores: cores)
            np.testing.assert_array_equal(host_numpy.matmul([a, b], attrs), expected)  # on the pool
        threads.kernels_beside(1)
        try:
            np.testing.assert_array_equal(host_numpy.matmul([a, b], attrs), expected)  # here, one after another
        finally:
            threads.kernels_beside(0)


def test_a_big_matmul_is_cut_into_blocks_of_about_block_products_by_its_shape_alone():
    """host_numpy._blocks: two blocks up to 2 * BLOCK_PRODUCTS multiply-adds, then one more per BLOCK_PRODUCTS up
    to MAX_SPLIT_BLOCKS, never more than the rows (or columns) cut; contiguous bounds covering them all."""
    from cerebras_tf.wse.kernels import host_numpy

    block, most = host_numpy.BLOCK_PRODUCTS, host_numpy.MAX_SPLIT_BLOCKS
    for size, per_unit, count in ((1024, 256 * 1024, 2), (160, 256 * 256, 2), (4096, block // 4096 * 5, 5),
                                  (8192, block, most), (3, block, 3), (1000, host_numpy.MIN_SPLIT_PRODUCTS // 1000, 2)):
        bounds = host_numpy._blocks(size, per_unit)
        assert len(bounds) - 1 == count, (size, per_unit)
        assert bounds[0] == 0 and bounds[-1] == size and all(lo < hi for lo, hi in zip(bounds, bounds[1:]))


def test_the_thread_counts_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(dataflow.ENV_VAR, "1")
    assert dataflow.thread_choices() == (1,)
    monkeypatch.delenv(dataflow.ENV_VAR)
    assert dataflow.thread_choices() == tuple(sorted({1, threads.host_threads()}))
    for bad in ("two", "0"):
        monkeypatch.setenv(dataflow.ENV_VAR, bad)
        with pytest.raises(ValueError, match=dataflow.ENV_VAR):
            dataflow.thread_choices()


def test_a_provider_whose_library_keeps_its_threads_on_the_cores_runs_one_kernel_at_a_time(monkeypatch):
    """With TF's kernels (HostKernels.spinning_pool) the executor runs one kernel at a time from the first step,
    as where dense kernels dominate; with numpy's it measures one thread against every core."""
    from cerebras_tf import ir
    from cerebras_tf.wse.executor import Executor
    from cerebras_tf.wse.kernels import NUMPY_HOST_KERNELS
    monkeypatch.delenv(dataflow.ENV_VAR, raising=False)
    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    tensors = [ir.Tensor(0, [64, 64], "float32", "x"), ir.Tensor(1, [64, 64], "float32", "y")]
    program = ir.Program(mode="eval", tensors=tensors, kernels=[ir.Kernel(0, "neg", [0], [1], {})], variables=[],
                         inputs={"features": 0}, outputs={"predictions": 1})
    assert Executor(program, {}).threads is None  # measuring 1 against 2
    spinning = dataclasses.replace(NUMPY_HOST_KERNELS, spinning_pool=True)
    assert Executor(program, {}, host_kernels=spinning).threads == 1
    monkeypatch.setenv(dataflow.ENV_VAR, "2")
    assert Executor(program, {}, host_kernels=spinning).threads == 1  # one at a time all the same
    monkeypatch.setenv(dataflow.ENV_VAR, "two")  # no thread count: refused here too, not ignored
    with pytest.raises(ValueError, match=dataflow.ENV_VAR):
        Executor(program, {}, host_kernels=spinning)


def test_the_choice_keeps_the_count_whose_steps_were_faster():
    choice = dataflow.ThreadChoice((1, 2))
    seconds = {1: 0.010, 2: 0.006}
    given = []
    warmup = dataflow.ThreadChoice.WARMUP
    for _ in range(warmup + 2 * dataflow.ThreadChoice.TRIALS):
        count = choice.next()
        given.append(count)
        choice.record(count, 5.0 if len(given) <= warmup else seconds[count])  # the warm-up (compiling) not counted
    assert given == [2] * warmup + [1, 2] * dataflow.ThreadChoice.TRIALS
    assert choice.chosen == 2 and choice.next() == 2
    slow_side_by_side = dataflow.ThreadChoice((1, 2))
    for step in range(warmup + 2 * dataflow.ThreadChoice.TRIALS):
        count = slow_side_by_side.next()
        slow_side_by_side.record(count, {1: 0.004, 2: 0.009}[count] if step >= warmup else 0.0)
    assert slow_side_by_side.chosen == 1
    assert dataflow.ThreadChoice((2,)).chosen == 2  # a count given: nothing measured


def test_the_choice_compares_the_steps_of_one_round():
    """A slow spell of the machine that hits two one-thread steps more than two-thread ones does not make two
    threads look faster: each round's steps are compared with each other."""
    choice = dataflow.ThreadChoice((1, 2))
    trials = dataflow.ThreadChoice.TRIALS
    slow = {1: set(range(trials // 2 + 1)), 2: set(range(trials // 2 - 1))}  # rounds a spell slowed
    for _ in range(dataflow.ThreadChoice.WARMUP):
        choice.record(choice.next(), 0.0)
    for step in range(2 * trials):
        count, round_ = choice.next(), step // 2
        choice.record(count, (0.010 if count == 1 else 0.0105) * (3 if round_ in slow[count] else 1))
    assert sorted(choice._times[2])[trials // 2] < sorted(choice._times[1])[trials // 2]  # the medians mislead
    assert choice.chosen == 1


def _rounds_until_chosen(choice: dataflow.ThreadChoice, two_faster: Callable[[int], bool]) -> int:
    """Run `choice`'s warm-up, then rounds where two threads take 0.009 s against one thread's 0.010 when
    `two_faster(round)` (else 0.011), until it chooses; how many rounds that took."""
    for _ in range(dataflow.ThreadChoice.WARMUP):
        choice.record(choice.next(), 0.0)
    rounds = 0
    while choice.chosen is None:
        for _ in range(2):
            count = choice.next()
            choice.record(count, 0.010 if count == 1 else (0.009 if two_faster(rounds) else 0.011))
        rounds += 1
        assert rounds <= dataflow.ThreadChoice.MAX_TRIALS
    return rounds


def test_an_unclear_choice_takes_more_rounds():
    """Two threads faster in 8 of the first 12 rounds is no clear win (a sign test wants 10): rounds go on
    until it is (12 of 16), and where it never is, MAX_TRIALS rounds' median shares decide."""
    trials = dataflow.ThreadChoice.TRIALS
    assert _rounds_until_chosen(dataflow.ThreadChoice((1, 2)), lambda r: True) == trials
    unclear = dataflow.ThreadChoice((1, 2))
    assert _rounds_until_chosen(unclear, lambda r: r % 3 != 0 or r >= trials) == 16
    assert unclear.chosen == 2
    even = dataflow.ThreadChoice((1, 2))  # two faster in 3 rounds of 5: never clear, its median share < 1
    assert _rounds_until_chosen(even, lambda r: r % 5 < 3) == dataflow.ThreadChoice.MAX_TRIALS
    assert even.chosen == 2
    assert even.next() == 2


_SMALL_TRANSFORMER = {"batch_size": 4, "vocab_size": 300, "hidden_size": 64, "num_layers": 2, "num_heads": 2,
                      "intermediate_size": 128, "seq_length": 32, "max_predictions": 5, "num_examples": 16}


@pytest.mark.parametrize("model,half_dtype", [("transformer", "float16"), ("transformer", "float32"),
                                              ("mlp", "float32")])
def test_side_by_side_gives_the_bits_of_one_kernel_at_a_time(tmp_path, monkeypatch, model, half_dtype):
    """The zoo's BERT-style encoder (its own Adam with weight decay in raw ops, masked-LM gather, dropout) and
    the benchmark MLP at its real size (784-500-300-10, batch 256: OpenBLAS's own two threads sum its
    256x784x500 product in another order than one thread, so how many OpenBLAS uses is fixed per program,
    never by the executor's thread count) for a few steps with dynamic loss scaling: losses, outputs and
    every variable equal bit for bit on one thread and on two. On two, arrays from 4 KiB take their buffers
    from the executor's pool (memory.BufferPool; 256 KiB in use, which the small transformer's arrays are not),
    so a buffer handed out again while an array still used it would show."""
    from estimator import ModeKeys

    from benchmarks import bench_models
    from cerebras_tf import CerebrasEstimator, CSRunConfig
    from cerebras_tf.amp import GradScaler
    from cerebras_tf.compiler import initial
    from cerebras_tf.precheck import precheck
    from cerebras_tf.wse.executor import Executor, dense_bound
    from examples.zoo import transformer

    if model == "transformer":
        model_fn, input_fn, params = transformer.model_fn, transformer.input_fn, _SMALL_TRANSFORMER
    else:
        model_fn, input_fn, params = bench_models.model(model)
    estimator = CerebrasEstimator(model_fn, model_dir=str(tmp_path / "model"),
                                  config=CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1), params=params)
    captured = precheck(estimator, input_fn, ModeKeys.TRAIN)
    program = estimator.compile(input_fn).program
    assert dense_bound(program) == (model == "mlp")  # the MLP keeps OpenBLAS's own threads
    start = initial.initial_values(captured, program)
    batches = list(input_fn(params).take(4).as_numpy_iterator())
    monkeypatch.setattr(memory, "POOLED_BYTES", 4096)
    runs = []
    for count in (2, 1):
        executor = Executor(program, start, grad_scaler=GradScaler(loss_scale="dynamic"), half_dtype=half_dtype,
                            threads=count)
        if model == "transformer":  # its reshapes, uncopied transposes (and float32's to_halfs) run inline
            layout = executor._step_layout
            inline = {layout.plans[0][i].kernel.kind for i in layout.schedules[0].inline}
            assert inline == {"reshape", "transpose"} | ({"to_half"} if half_dtype == "float32" else set())
        outputs = [executor.step(features, labels).outputs for features, labels in batches]
        assert (executor._pool.nbytes > 0) == (count > 1)  # pooled on two threads; one thread leaves it to malloc
        runs.append((outputs, executor.variables()))
    (outputs, variables), (expected_outputs, expected_variables) = runs
    for step, (got, expected) in enumerate(zip(outputs, expected_outputs)):
        assert got.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=f"step {step}: {key}")
    assert variables.keys() == expected_variables.keys()
    for name, value in expected_variables.items():
        np.testing.assert_array_equal(variables[name], value, err_msg=name)


def test_a_failure_outside_the_units_is_raised_and_the_helpers_stay_usable():
    units = [Access(reads=[], outputs=[i]) for i in range(6)]

    def complete(index: int, result: int) -> None:
        if index == 2:
            raise RuntimeError("bookkeeping broke")

    with pytest.raises(RuntimeError, match="bookkeeping broke"):
        dataflow.run(Schedule.build(units, set()), lambda i: i, complete, lambda t: None, 2)
    done: list[int] = []
    dataflow.run(Schedule.build(units, set()), lambda i: i, lambda i, r: done.append(i), lambda t: None, 2)
    assert sorted(done) == list(range(6))


def _run_in_a_thread(schedule: Schedule, compute, threads_to_use: int = 2) -> BaseException | None:
    """dataflow.run on a daemon thread (so a hang fails the test instead of stopping the suite): what it raised."""
    raised: list[BaseException | None] = [None]

    def target() -> None:
        try:
            dataflow.run(schedule, compute, lambda i, r: None, lambda t: None, threads_to_use)
        except BaseException as error:  # noqa: BLE001 - the test looks at it
            raised[0] = error
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the run hung"
    return raised[0]


@pytest.mark.parametrize("where", ["unit", "shared block"])
def test_an_interrupt_in_a_unit_or_a_shared_block_stops_the_run_and_the_helpers_stay_usable(where, monkeypatch):
    """A KeyboardInterrupt (Ctrl-C) inside a kernel on either thread: the run raises it instead of waiting
    forever for the unit it abandoned, and no block of an interrupted split is handed out afterwards."""
    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    started: list[int] = []
    kernels_thread: list[threading.Thread] = []

    def work(lo: int, hi: int) -> None:
        started.append(lo)
        if threading.current_thread() is kernels_thread[0]:
            raise KeyboardInterrupt  # at once, in the first block the kernel's own thread takes
        time.sleep(0.02)

    def compute(index: int) -> int:
        time.sleep(0.005)
        if index == 1:
            if where == "unit":
                raise KeyboardInterrupt
            kernels_thread.append(threading.current_thread())
            threads.split_range(1000, work, 1)
        return index

    units = [Access(reads=[], outputs=[i]) for i in range(6)]
    assert isinstance(_run_in_a_thread(Schedule.build(units, set()), compute), KeyboardInterrupt)
    if where == "shared block":
        assert len(started) <= 2  # the interrupted block and at most one the other thread took before
    done: list[int] = []
    dataflow.run(Schedule.build(units, set()), lambda i: i, lambda i, r: done.append(i), lambda t: None, 2)
    assert sorted(done) == list(range(6))


def test_a_forked_child_starts_its_own_helpers():
    import multiprocessing

    units = [Access(reads=[], outputs=[i]) for i in range(4)]
    dataflow.run(Schedule.build(units, set()), lambda i: i, lambda i, r: None, lambda t: None, 2)  # helpers exist

    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        done = pool.apply_async(_run_four_units).get(timeout=60)
    assert done == [0, 1, 2, 3]


def _run_four_units() -> list[int]:
    done: list[int] = []
    units = [Access(reads=[], outputs=[i]) for i in range(4)]
    dataflow.run(Schedule.build(units, set()), lambda i: i, lambda i, r: done.append(i), lambda t: None, 2)
    return sorted(done)
