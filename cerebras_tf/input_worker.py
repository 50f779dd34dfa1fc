"""Alias of `python -m cerebras_tf.input_workers` (cerebras_tf/input_workers/__main__.py), kept for existing scripts."""
from __future__ import annotations

import sys

from cerebras_tf.input_workers.__main__ import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
