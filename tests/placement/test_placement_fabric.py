"""Fabric presets and lookup."""
from __future__ import annotations

import pytest

from cerebras_tf.wse.fabric import WSE1, WSE2, Fabric, fabric_by_name, small_fabric


def test_presets_match_public_figures():
    assert WSE2.num_pes == pytest.approx(850_000, rel=0.02)
    assert WSE2.total_sram_bytes == pytest.approx(40e9, rel=0.06)
    assert WSE1.num_pes == pytest.approx(400_000, rel=0.02)
    assert WSE1.total_sram_bytes == pytest.approx(18e9, rel=0.06)
    assert WSE2.pe_flops_per_sec("half") == 4 * WSE2.pe_flops_per_sec("single")
    assert WSE2.peak_flops_per_sec("half") == pytest.approx(7.5e15, rel=0.05)


@pytest.mark.parametrize("name, expected", [("WSE-2", WSE2), ("wse2", WSE2), ("cs-2", WSE2), ("WSE_1", WSE1)])
def test_fabric_by_name(name, expected):
    assert fabric_by_name(name) is expected


def test_unknown_fabric_lists_choices():
    with pytest.raises(ValueError) as info:
        fabric_by_name("wse-9")
    message = str(info.value)
    assert "'wse-9'" in message and "'WSE-2'" in message and "'WSE-1'" in message


def test_small_fabric_and_validation():
    fabric = small_fabric(12, 7, sram_bytes_per_pe=1000, host_io_bytes_per_sec=5.0)
    assert (fabric.width, fabric.height, fabric.num_pes, fabric.total_sram_bytes) == (12, 7, 84, 84_000)
    assert fabric.host_io_bytes_per_sec == 5.0
    assert fabric.to_dict()["num_pes"] == 84
    with pytest.raises(ValueError, match="width"):
        small_fabric(0, 4)
    with pytest.raises(ValueError, match="precision"):
        fabric.pe_flops_per_sec("double")
    assert isinstance(fabric, Fabric)


def test_estimates_use_the_sustained_share_of_the_peak():
    assert WSE2.sustained_flops_per_sec("half") == pytest.approx(0.21 * WSE2.peak_flops_per_sec("half"))
    assert WSE2.sustained_pe_flops_per_sec("single") == pytest.approx(0.21 * WSE2.pe_flops_per_sec("single"))
    assert small_fabric().sustained_fraction == 1.0  # test fabrics run at their peak
    with pytest.raises(ValueError, match="sustained_fraction"):
        small_fabric(sustained_fraction=1.5)
