"""The weight streaming execution model (cerebras_tf.wse.streaming): per-layer timing, memory checks, systems."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks.reference_models import transformer
from cerebras_tf.errors import FabricCapacityError
from cerebras_tf.wse.fabric import WSE2, small_fabric
from cerebras_tf.wse.placement import LayerCost
from cerebras_tf.wse.streaming import MemoryX, stream

RATE = WSE2.sustained_flops_per_sec("half")
BANDWIDTH = 150e9


def _layer(name: str, params: int, flops_per_sample: float, stash: float = 1000.0) -> LayerCost:
    return LayerCost(name, flops_fwd=flops_per_sample, flops_bwd=2 * flops_per_sample, weight_bytes=4 * params,
                     optimizer_state_bytes=8 * params, activation_bytes=stash)


def test_each_pass_takes_the_slower_of_its_compute_and_its_streaming():
    big_matmul = _layer("compute_bound", params=1_000_000, flops_per_sample=1e12)
    embedding = _layer("stream_bound", params=100_000_000, flops_per_sample=1e6)
    report = stream([big_matmul, embedding], WSE2, batch_size=64)
    compute, streamed = report.layers
    assert compute.compute_fwd_seconds == pytest.approx(64 * 1e12 / RATE)
    assert compute.stream_fwd_seconds == pytest.approx(2 * 1_000_000 / BANDWIDTH)  # half-width weights in
    assert compute.stream_bwd_seconds == pytest.approx((2 + 4) * 1_000_000 / BANDWIDTH)  # again, + fp32 gradients
    assert compute.bound == "compute" and streamed.bound == "weight_streaming"
    assert streamed.seconds == pytest.approx(streamed.stream_fwd_seconds + streamed.stream_bwd_seconds)
    assert report.step_seconds == pytest.approx(compute.seconds + streamed.seconds)
    assert report.estimated_samples_per_sec == pytest.approx(64 / report.step_seconds)
    assert "'stream_bound'" in report.notes[0] and "larger batch per system" in report.notes[0]
    assert report.memoryx_bytes == 12 * 101_000_000


def test_more_systems_split_the_batch_and_not_the_weight_traffic():
    layers = transformer(layers=4, seq=256, hidden=1024, heads=16, vocab=8192, batch=64)
    one = stream(layers, WSE2, batch_size=64)
    four = stream(layers, WSE2, batch_size=64, num_systems=4)
    assert four.batch_per_system == 16
    for a, b in zip(one.layers, four.layers):
        assert b.compute_fwd_seconds == pytest.approx(a.compute_fwd_seconds / 4)
        assert b.stream_fwd_seconds == a.stream_fwd_seconds and b.stream_bwd_seconds == a.stream_bwd_seconds
    assert one.estimated_samples_per_sec < four.estimated_samples_per_sec < 4 * one.estimated_samples_per_sec + 1e-6
    with pytest.raises(ValueError, match="split evenly over 3 systems"):
        stream(layers, WSE2, batch_size=64, num_systems=3)


def test_a_batch_whose_activations_do_not_fit_runs_as_micro_batches():
    fabric = small_fabric(10, 10, sram_bytes_per_pe=1000)  # 100 KB of SRAM
    layers = [_layer(f"l{i}", params=1000, flops_per_sample=1e6, stash=1000.0) for i in range(4)]
    whole = stream(layers, fabric, batch_size=20)  # 20 x 4 KB + 2 x 2 KB of weights in flight
    assert whole.micro_batches == 1 and whole.wafer_bytes == 20 * 4000 + 2 * 2000
    assert whole.max_batch_per_system == (100_000 - 4000) // 4000 == 24
    split = stream(layers, fabric, batch_size=48)  # 48 do not fit in one pass: 2 micro-batches of 24
    assert split.micro_batches == 2 and split.wafer_bytes == 24 * 4000 + 2 * 2000 and not split.recompute
    for a, b in zip(whole.layers, split.layers):
        assert b.compute_fwd_seconds == pytest.approx(a.compute_fwd_seconds * 48 / 20)  # the same compute
        assert b.stream_fwd_seconds == pytest.approx(2 * a.stream_fwd_seconds)  # the weights stream twice
        assert b.stream_bwd_seconds == pytest.approx(2 * a.stream_bwd_seconds)  # and the gradients go out twice
    assert split.memoryx_bytes == whole.memoryx_bytes + 4 * 4000  # MemoryX adds up the gradients (float32)
    assert "2 micro-batches of at most 24" in split.notes[-1]
    assert "2 micro-batches" in split.render_table()
    assert stream(layers, fabric, batch_size=48, num_systems=2).micro_batches == 1  # 24 per system fit


def test_a_sample_that_does_not_fit_even_recomputed_is_refused():
    fabric = small_fabric(10, 10, sram_bytes_per_pe=1000)  # 100 KB of SRAM
    layers = [LayerCost(f"l{i}", flops_fwd=1e6, flops_bwd=2e6, weight_bytes=4000, activation_bytes=60_000,
                        output_bytes=50_000) for i in range(3)]
    with pytest.raises(FabricCapacityError, match="one sample stashes .* even recomputing") as caught:
        stream(layers, fabric, batch_size=1)
    assert "shorter sequence" in caught.value.fix
    assert caught.value.bytes_needed > caught.value.bytes_available == 100_000


def test_weights_and_optimizer_state_must_fit_in_memoryx():
    layers = [_layer("huge", params=10_000_000, flops_per_sample=1e9)]
    with pytest.raises(FabricCapacityError, match="MemoryX holds 100 MB") as caught:
        stream(layers, WSE2, batch_size=8, memoryx=MemoryX(capacity_bytes=100e6))
    assert caught.value.bytes_needed == 12 * 10_000_000


def test_the_report_renders_and_serialises():
    report = stream(transformer(layers=2, seq=128, hidden=256, heads=4, vocab=1000, batch=32), WSE2, batch_size=32)
    text = report.render_table()
    assert text.startswith("Weight streaming on 1 system x WSE-2") and "block1_ffn_down_ln" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["execution_strategy"] == "weight_streaming" and len(data["layers"]) == len(report.layers)
    assert data["slowest_layer"] == report.slowest_layer


def test_recomputation_is_chosen_where_streaming_the_weights_again_costs_more():
    fabric = small_fabric(10, 10, sram_bytes_per_pe=1000)  # 100 KB of SRAM
    layers = [LayerCost(f"l{i}", flops_fwd=1e6, flops_bwd=2e6, weight_bytes=4000, activation_bytes=10_000,
                        output_bytes=100) for i in range(4)]
    slow_link = MemoryX(stream_bytes_per_sec=1e6)  # weights take far longer to stream than the layers compute
    kept = stream(layers, fabric, batch_size=2, memoryx=slow_link)  # 2 x 40 KB: everything stays
    assert not kept.recompute and kept.micro_batches == 1 and kept.wafer_bytes == 2 * 40_000 + 2 * 2000
    # 4 x 40 KB do not fit; 4 x (10 KB + 300 B + 10 KB) do, and cost less than streaming everything twice
    recomputed = stream(layers, fabric, batch_size=4, memoryx=slow_link)
    assert recomputed.recompute and recomputed.micro_batches == 1
    assert recomputed.wafer_bytes == 4 * (10_000 + 300 + 10_000) + 2 * 2000 and recomputed.checkpoints == 4
    assert "4 checkpoint layers" in recomputed.notes[-1]
    for a, b in zip(kept.layers, recomputed.layers):  # the backward pass runs the forward again
        assert b.compute_bwd_seconds == pytest.approx(2 * a.compute_bwd_seconds * (3e6 / 2e6))
        assert b.compute_fwd_seconds == pytest.approx(2 * a.compute_fwd_seconds)
    assert recomputed.max_batch_per_system == (100_000 - 4000) // 20_300
    assert stream(layers, fabric, batch_size=4).micro_batches == 2  # a fast link: 2 passes cost less
    assert stream(layers, fabric, batch_size=5, memoryx=slow_link).micro_batches == 2  # 5 fit in no one pass


def test_the_checkpoints_need_the_least_memory_a_search_of_every_choice_finds():
    import itertools
    import random

    from cerebras_tf.wse.streaming import _least_checkpointed

    rng = random.Random(7)
    for _ in range(40):
        n = rng.randint(1, 9)
        layers = [LayerCost(f"l{i}", flops_fwd=1.0, activation_bytes=rng.choice([1, 4, 16, 64]) * 1000.0,
                            output_bytes=rng.choice([1, 2, 50]) * 1000.0) for i in range(n)]
        stash = [float(layer.activation_bytes) for layer in layers]
        kept = [stash[0]] + [layer.sent_bytes for layer in layers[:-1]]
        exact = math.inf
        for chosen in itertools.product([False, True], repeat=n - 1):
            cuts = [0] + [i + 1 for i, c in enumerate(chosen) if c] + [n]
            memory = sum(kept[c] for c in cuts[:-1]) + max(sum(stash[a:b]) for a, b in zip(cuts, cuts[1:]))
            exact = min(exact, memory)
        found = _least_checkpointed(layers).per_sample_bytes
        # the segment bound comes from a geometric grid: at most one grid step (< 5% here) above the optimum
        assert exact <= found <= exact + 0.05 * max(sum(stash), 1.0)


def test_a_gpt3_xl_batch_fits_a_wse2_as_cerebras_ran_it():
    """R1.8's GPT-3 XL config ran 66 samples of 2,048 tokens per CS-2 in one pass: the checkpoints must fall
    between the blocks, not on the attention scores (16 heads x 2048^2 per sample each)."""
    layers = transformer(layers=24, seq=2048, hidden=2048, heads=16, vocab=50257, batch=66)
    one_pass = stream(layers, WSE2, batch_size=66, memoryx=MemoryX(stream_bytes_per_sec=15e9))  # a second
    assert one_pass.micro_batches == 1 and one_pass.recompute  # pass would cost more than recomputing
    assert one_pass.wafer_bytes <= WSE2.total_sram_bytes and one_pass.max_batch_per_system >= 66
    chosen = stream(layers, WSE2, batch_size=66)  # with the real link: whichever plan is faster, and fits
    assert chosen.wafer_bytes <= WSE2.total_sram_bytes


def test_the_picture_is_a_png_of_every_layer(tmp_path):
    report = stream(transformer(layers=2, seq=128, hidden=256, heads=4, vocab=1000, batch=32), WSE2, batch_size=32)
    data = report.to_png(str(tmp_path / "streaming.png"))
    assert data.startswith(b"\x89PNG") and (tmp_path / "streaming.png").read_bytes() == data
    assert report.to_png() == data  # deterministic
