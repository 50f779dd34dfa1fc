"""How the reports of the wafer's execution models write sizes and rates."""
from __future__ import annotations

import math

__all__ = ["fmt_bytes", "fmt_rate"]


def fmt_bytes(value: float) -> str:
    """Bytes in decimal units, 3 significant digits: "41.8 GB"."""
    value = float(value)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def fmt_rate(value: float) -> str:
    """A rate with a k/M/G suffix, 4 significant digits ("unbounded" for infinity)."""
    if not math.isfinite(value):
        return "unbounded"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.4g}{unit}"
    return f"{value:.4g}"
