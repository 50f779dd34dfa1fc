"""cerebras-tf's stand-ins for the Cerebras software the Model Zoo imports (R1.6-R1.8).

The zoo's TensorFlow scripts import the Cerebras stack under its own package
names: ``cerebras.tf.*`` and ``cerebras.pb.*`` (the Cerebras container, R1.6
and R1.7 with ``--cs_ip``; its weight-streaming variant adds ``tfwse`` and
``cerebras.tf.ws.*``) or ``cerebras_tensorflow.*`` and
``cerebras_appliance.*`` (the appliance wheel, R1.8's ``run_appliance``).
Each module here is what one of those Cerebras modules is in cerebras-tf, with
real behaviour on the simulated CS system and on CPU/GPU. The names themselves
resolve to these modules only after the opt-in step of
:mod:`cerebras_tf.csoft.names`; nothing here is installed by default.
"""
