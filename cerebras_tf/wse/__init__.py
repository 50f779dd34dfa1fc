"""The simulated Cerebras system: fabric description and pipelined performance model.

Import-light on purpose: submodules (``fabric``, ``placement``, ``placement_picture``)
are imported explicitly by whoever needs them, and nothing here imports TensorFlow.
"""
