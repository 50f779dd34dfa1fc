"""Property tests: regions never overlap, stay in the grid, hold their memory, and touch their neighbours."""
from __future__ import annotations

import numpy as np
import pytest

from cerebras_tf.errors import FabricCapacityError
from cerebras_tf.wse.fabric import small_fabric
from cerebras_tf.wse.placement import LayerCost, place


def _random_case(rng: np.random.Generator):
    width, height = (int(v) for v in rng.integers(4, 70, size=2))
    sram = int(rng.choice([256, 4096, 48 * 1024]))
    fabric = small_fabric(width, height, sram_bytes_per_pe=sram,
                          link_bytes_per_sec=float(rng.choice([1e6, 4.4e9])))
    n = int(rng.integers(1, 24))
    layers = []
    for i in range(n):
        flops = float(10 ** rng.uniform(3, 10)) * (rng.random() > 0.05)  # a few zero-FLOP layers
        memory = float(10 ** rng.uniform(0, np.log10(sram * width * height / n + 2)))
        layers.append(LayerCost(f"layer{i}", flops_fwd=flops + (i == 0), flops_bwd=2 * flops,
                                weight_bytes=memory * rng.random(), optimizer_state_bytes=memory * rng.random(),
                                activation_bytes=memory * rng.random() / (2 * n),
                                output_bytes=float(rng.uniform(0, 1e4))))
    return fabric, layers, bool(rng.random() < 0.8)


def _touch(a, b) -> bool:
    x_overlap = min(a.x + a.width, b.x + b.width) - max(a.x, b.x)
    y_overlap = min(a.y + a.height, b.y + b.height) - max(a.y, b.y)
    return (x_overlap > 0 and y_overlap == 0) or (y_overlap > 0 and x_overlap == 0)


@pytest.mark.parametrize("seed", range(8))
def test_random_placements_are_valid(seed):
    rng = np.random.default_rng(seed)
    placed = refused = 0
    for _ in range(25):
        fabric, layers, training = _random_case(rng)
        try:
            report = place(layers, fabric, training=training)
        except FabricCapacityError as error:
            refused += 1
            assert "Fabric Capacity" in str(error)
            continue
        placed += 1
        grid = np.zeros((fabric.height, fabric.width), dtype=np.int64)
        for region in report.regions:
            assert region.width >= 1 and region.height >= 1
            assert 0 <= region.x and region.x + region.width <= fabric.width
            assert 0 <= region.y and region.y + region.height <= fabric.height
            grid[region.y:region.y + region.height, region.x:region.x + region.width] += 1
            assert region.bytes <= region.pes * fabric.sram_bytes_per_pe
        assert grid.max() == 1, "regions overlap"
        assert [r.name for r in report.regions] == [layer.name for layer in layers]
        assert report.pes_used == int(grid.sum()) <= fabric.num_pes
        assert all(_touch(a, b) for a, b in zip(report.regions, report.regions[1:]))
        assert report.estimated_samples_per_sec <= report.bound_samples_per_sec * (1 + 1e-9)
        assert report.estimated_samples_per_sec > 0
    assert placed >= 10  # most random cases fit


def test_capacity_error_exactly_when_memory_does_not_fit():
    fabric = small_fabric(10, 10, sram_bytes_per_pe=100)  # 10,000 bytes in all
    fits = [LayerCost(f"l{i}", flops_fwd=1.0, weight_bytes=2400) for i in range(4)]  # 4 x 24 PEs
    assert sum(r.pes for r in place(fits, fabric).regions) <= 100
    with pytest.raises(FabricCapacityError):
        place([LayerCost(f"l{i}", flops_fwd=1.0, weight_bytes=2600) for i in range(4)], fabric)
