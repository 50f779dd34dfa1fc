"""Benchmarks of cerebras-tf, run as modules from the repository root: `./dev bench NAME [args]`
(= `python -m benchmarks.NAME` without the environment's OpenBLAS pin).

Also the helpers the tests share with them (not part of the shipped package): `reference_models`
(hand-costed layer lists) and `summaries.read_scalars` (TensorBoard scalars of a run); and `timing`, what the
micro-benchmarks share to time a call.
"""
