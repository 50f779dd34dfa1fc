"""Description of a Wafer-Scale Engine fabric: a grid of processing elements (PEs).

Each PE has its own SRAM and FLOP rate; neighbouring PEs talk over fabric links;
input workers stream samples to the wafer over the system's host I/O.

Public figures behind the presets (all approximate; the clock is not published and
is the commonly cited ~1.1 GHz estimate):

* WSE-2 (CS-2): 850,000 cores, 40 GB on-chip SRAM (48 KB per core), 20 PB/s memory
  bandwidth, 220 Pb/s fabric bandwidth; 12 x 100 GbE system I/O.
  Sources: Cerebras, "Cerebras Systems Smashes the 2.5 Trillion Transistor Mark with
  New Second Generation Wafer Scale Engine" (press release, 20 Apr 2021) and the
  CS-2 product page / Hot Chips 33 (2021) talk.
* WSE-1 (CS-1): 400,000 cores, 18 GB on-chip SRAM, 9 PB/s memory bandwidth,
  100 Pb/s fabric bandwidth; 12 x 100 GbE system I/O.
  Sources: Cerebras, Hot Chips 31 (2019) "Wafer Scale Deep Learning" and the CS-1
  announcement (SC19).
* Core datapath (both): 4-way FP16 SIMD fused multiply-add (8 half-precision FLOPs
  per cycle) and one FP32 FMA (2 single-precision FLOPs per cycle); routers move
  32 bits per cycle per link direction (Hot Chips 31 / Cerebras SDK documentation).
* Sustained fraction of the peak (the estimates' calibration): 0.21. One figure
  sets it: BERT-large msl128 pre-training, pipelined on one CS-2, measured at
  6,370 samples/s (Model Zoo R1.7.1, TensorFlow, batch 1024; the ALCF AI
  testbed user guide's example log), where every PE at its peak estimates
  30,343 samples/s (ratio 0.210). Checked, not fitted, against other measured
  runs in docs/simulated-system.md's "Estimates against measurements" (weight streaming GPT-J
  6B on one and two CS-2s, GPT-2 small). Its published peak, 7.5 PFLOP/s in
  half precision per CS-2, is what the presets' peak computes to.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Fabric", "WSE1", "WSE2", "FABRICS", "fabric_by_name", "small_fabric"]

_PRECISIONS = ("half", "single")


@dataclass(frozen=True)
class Fabric:
    """A WSE-like fabric.

    Attributes:
      name: label shown in reports.
      width, height: PE grid size (columns x rows).
      sram_bytes_per_pe: SRAM of one PE.
      half_flops_per_cycle, single_flops_per_cycle: per-PE peak FLOPs per clock cycle.
      clock_hz: PE clock.
      link_bytes_per_sec: bandwidth of one PE-to-PE fabric link, one direction.
      host_io_bytes_per_sec: input workers -> wafer bandwidth of the whole system.
      sustained_fraction: the share of the peak FLOP rate the kernels sustain,
        which the estimates use (1.0: every PE at its peak).
    """

    name: str
    width: int
    height: int
    sram_bytes_per_pe: int
    half_flops_per_cycle: float
    single_flops_per_cycle: float
    clock_hz: float
    link_bytes_per_sec: float
    host_io_bytes_per_sec: float
    sustained_fraction: float = 1.0

    def __post_init__(self) -> None:
        for field in ("width", "height", "sram_bytes_per_pe"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"Fabric.{field} must be >= 1, got {getattr(self, field)!r}")
        for field in ("half_flops_per_cycle", "single_flops_per_cycle", "clock_hz",
                      "link_bytes_per_sec", "host_io_bytes_per_sec"):
            if not float(getattr(self, field)) > 0:
                raise ValueError(f"Fabric.{field} must be > 0, got {getattr(self, field)!r}")
        if not 0 < float(self.sustained_fraction) <= 1:
            raise ValueError(f"Fabric.sustained_fraction must be in (0, 1], got {self.sustained_fraction!r}")

    @property
    def num_pes(self) -> int:
        """Total number of PEs."""
        return self.width * self.height

    @property
    def total_sram_bytes(self) -> int:
        """On-chip SRAM of the whole fabric."""
        return self.num_pes * self.sram_bytes_per_pe

    def pe_flops_per_sec(self, precision: str = "half") -> float:
        """Peak FLOP/s of one PE in `precision` ('half' or 'single')."""
        if precision == "half":
            return self.half_flops_per_cycle * self.clock_hz
        if precision == "single":
            return self.single_flops_per_cycle * self.clock_hz
        raise ValueError(f"precision must be one of {_PRECISIONS}, got {precision!r}")

    def peak_flops_per_sec(self, precision: str = "half") -> float:
        """Peak FLOP/s of the whole fabric."""
        return self.num_pes * self.pe_flops_per_sec(precision)

    def sustained_pe_flops_per_sec(self, precision: str = "half") -> float:
        """FLOP/s one PE sustains in `precision`: its peak times sustained_fraction (what estimates use)."""
        return self.pe_flops_per_sec(precision) * self.sustained_fraction

    def sustained_flops_per_sec(self, precision: str = "half") -> float:
        """FLOP/s the whole fabric sustains (what estimates use)."""
        return self.num_pes * self.sustained_pe_flops_per_sec(precision)

    def to_dict(self) -> dict:
        """JSON-ready description (adds num_pes and total_sram_bytes)."""
        out = asdict(self)
        out["num_pes"] = self.num_pes
        out["total_sram_bytes"] = self.total_sram_bytes
        return out


_CLOCK_HZ = 1.1e9
_LINK_BYTES_PER_SEC = 4 * _CLOCK_HZ  # 32 bits per cycle per direction
_HOST_IO_BYTES_PER_SEC = 12 * 100e9 / 8  # 12 x 100 GbE = 150 GB/s
_SUSTAINED_FRACTION = 0.21  # measured BERT-large over its estimate at peak (module docstring)

# WSE-2-like: 925 x 920 = 851,000 PEs x 48 KiB = 41.8 GB (public: 850,000 cores, 40 GB).
WSE2 = Fabric(
    name="WSE-2",
    width=925,
    height=920,
    sram_bytes_per_pe=48 * 1024,
    half_flops_per_cycle=8.0,
    single_flops_per_cycle=2.0,
    clock_hz=_CLOCK_HZ,
    link_bytes_per_sec=_LINK_BYTES_PER_SEC,
    host_io_bytes_per_sec=_HOST_IO_BYTES_PER_SEC,
    sustained_fraction=_SUSTAINED_FRACTION,
)

# WSE-1-like: 633 x 633 = 400,689 PEs x 45,000 B = 18.0 GB (public: 400,000 cores, 18 GB).
WSE1 = Fabric(
    name="WSE-1",
    width=633,
    height=633,
    sram_bytes_per_pe=45_000,
    half_flops_per_cycle=8.0,
    single_flops_per_cycle=2.0,
    clock_hz=_CLOCK_HZ,
    link_bytes_per_sec=_LINK_BYTES_PER_SEC,
    host_io_bytes_per_sec=_HOST_IO_BYTES_PER_SEC,
    sustained_fraction=_SUSTAINED_FRACTION,
)

FABRICS: dict[str, Fabric] = {"wse2": WSE2, "wse1": WSE1}
_ALIASES = {"cs2": "wse2", "cs1": "wse1"}


def small_fabric(width: int = 16, height: int = 16, *, sram_bytes_per_pe: int = 48 * 1024,
                 name: str | None = None, **overrides: float) -> Fabric:
    """A small WSE-2-like fabric for tests; any other Fabric field can be overridden."""
    fields = dict(
        half_flops_per_cycle=WSE2.half_flops_per_cycle,
        single_flops_per_cycle=WSE2.single_flops_per_cycle,
        clock_hz=WSE2.clock_hz,
        link_bytes_per_sec=WSE2.link_bytes_per_sec,
        host_io_bytes_per_sec=WSE2.host_io_bytes_per_sec,
    )
    fields.update(overrides)
    return Fabric(name=name or f"small-{width}x{height}", width=width, height=height,
                  sram_bytes_per_pe=sram_bytes_per_pe, **fields)


def fabric_by_name(name: str) -> Fabric:
    """The preset fabric called `name` ('WSE-2', 'wse2', 'CS-2', 'WSE-1', ...; case and '-'/'_' ignored)."""
    key = str(name).lower().replace("-", "").replace("_", "").replace(" ", "")
    key = _ALIASES.get(key, key)
    if key not in FABRICS:
        choices = ", ".join(f"{fabric.name!r}" for fabric in FABRICS.values())
        raise ValueError(f"Unknown fabric {name!r}; choose one of {choices} "
                         "(aliases: 'wse2', 'cs2', 'wse1', 'cs1'), or build a Fabric / small_fabric(...).")
    return FABRICS[key]
