"""``python -m cerebras_tf.csoft FLAVOUR SCRIPT [ARGS...]``: run a Model Zoo script with the Cerebras names served.

FLAVOUR is ``container`` (R1.6/R1.7 scripts run with ``--cs_ip``),
``weight_streaming`` (R1.6/R1.7's weight-streaming configs, GPT-2 ``*_ws``,
GPT-3 and GPT-J, run with ``--cs_ip``: the Cerebras weight-streaming
container's names, so the zoo takes its weight-streaming path) or
``appliance`` (R1.8's ``run.py CSX pipeline ...``); see
:mod:`cerebras_tf.csoft.names`. The script runs as ``python SCRIPT ARGS...``
would run it: as ``__main__``, with its directory first on sys.path and
``sys.argv`` = [SCRIPT, ARGS...]. On TensorFlow >= 2.16, which has no
tf.estimator, cerebras-tf's Estimator runtime is installed as tf.estimator
first (as ``import cerebras_tf.legacy_estimator`` does), since the zoo's code
uses it.
"""
from __future__ import annotations

import os
import runpy
import sys

from cerebras_tf.csoft.names import FLAVOURS, RELEASES, install
from cerebras_tf.errors import CerebrasError

USAGE = (f"usage: python -m cerebras_tf.csoft {{{'|'.join(FLAVOURS)}}} SCRIPT [ARGS...]\n"
         + "".join(f"  {flavour:<17} the Cerebras names of {RELEASES[flavour]}\n" for flavour in FLAVOURS))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        sys.stderr.write(USAGE)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    flavour, script, *args = argv
    try:
        install(flavour)
    except CerebrasError as exc:
        sys.stderr.write(f"{exc}\n{USAGE}")
        return 2
    if not os.path.isfile(script):
        sys.stderr.write(f"python -m cerebras_tf.csoft: no such script: {script}\n{USAGE}")
        return 2
    from estimator import install_as_tf_estimator

    install_as_tf_estimator()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
