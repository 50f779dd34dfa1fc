"""cerebras_tf.logs: each TensorFlow log message printed once under absl, no deprecation notices about our calls."""
from __future__ import annotations

import logging
import os

import pytest
import tensorflow as tf
from absl import logging as absl_logging

import cerebras_tf
from cerebras_tf import logs

_NOTICE = "From %s: %s (from %s) is deprecated and will be removed %s.\nInstructions for updating:\n%s"


def _record(msg: str, args: tuple, name: str = "tensorflow") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


def _notice_from(path: str) -> logging.LogRecord:
    return _record(_NOTICE, (f"{path}:12", "Estimator.__init__", "tensorflow_estimator", "in a future version",
                             "Use tf.keras instead."))


@pytest.mark.parametrize("path", [
    os.path.join(os.path.dirname(cerebras_tf.__file__), "run_config.py"),  # our call of RunConfig.__init__
    os.path.join(os.path.dirname(tf.__file__), "python", "training", "saver.py"),  # TF calling itself
])
def test_deprecation_notices_about_library_calls_are_dropped(path):
    assert logs.is_library_deprecation(_notice_from(path))
    logs.install()
    assert not logging.getLogger("tensorflow").filter(_notice_from(path))


def test_deprecation_notices_about_the_users_code_and_other_messages_are_kept(tmp_path):
    logs.install()
    tf_logger = logging.getLogger("tensorflow")
    assert tf_logger.filter(_notice_from(str(tmp_path / "train.py")))  # the user can act on this one
    assert tf_logger.filter(_record("From %s: something else", ("x",)))
    assert tf_logger.filter(_record("loss = %s, step = %s", (0.5, 100)))


def test_absls_handler_skips_what_tensorflows_own_handler_printed(monkeypatch):
    logs.install()
    logs.install()  # idempotent: one filter each
    handler = absl_logging.get_absl_handler()
    assert sum(isinstance(f, logging.Filter) and type(f).__module__ == logs.__name__ for f in handler.filters) == 1
    tf_logger = logging.getLogger("tensorflow")
    monkeypatch.setattr(tf_logger, "handlers", [logging.StreamHandler()])  # as TF sets it up on import
    assert not handler.filter(_record("loss = %s", (0.5,)))
    assert handler.filter(_record("absl's own message", (), name="absl"))
    monkeypatch.setattr(tf_logger, "handlers", [])  # root configured before TF: absl's handler is the only one
    assert handler.filter(_record("loss = %s", (0.5,)))


def test_the_estimators_config_dump_is_kept_on_one_line():
    logs.install()
    dump = "{'_model_dir': 'm', '_session_config': allow_soft_placement: true\ngraph_options {\n  x: 1\n}\n, 'k': 2}"
    record = _record("Using config: %s", (dump,))
    assert logging.getLogger("tensorflow").filter(record)
    assert record.getMessage() == ("Using config: {'_model_dir': 'm', '_session_config': allow_soft_placement: true "
                                   "graph_options { x: 1 } , 'k': 2}")
