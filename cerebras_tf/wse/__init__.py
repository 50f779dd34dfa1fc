"""The simulated Cerebras system: fabric description, pipelined performance model, the executor.

Import-light on purpose: submodules (``fabric``, ``placement``, ``placement_picture``,
``executor``, ``kernels``, ``system``, ``threads``) are imported explicitly by whoever needs
them, and nothing here imports TensorFlow.
"""
