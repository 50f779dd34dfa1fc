"""Runs on the simulated WSE close every TF session they open, when they end and when they fail.

The chief's host side holds sessions of its own (the checkpoint writer's, the
host_call metrics', the model summaries'). Left to the garbage collector, each
keeps its graph and TF runtime state alive for as long as anything refers to
it; the tests keep every session alive, so one that was not closed shows.
"""
from __future__ import annotations

from typing import Any

import pytest
import tensorflow as tf

import cerebras_tf
from cerebras_tf.run import chief


@pytest.fixture
def sessions(monkeypatch) -> list[Any]:
    """Every tf.compat.v1.Session created while the test runs, kept alive so an unclosed one stays open."""
    created: list[Any] = []

    class RecordedSession(tf.compat.v1.Session):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            created.append(self)

    monkeypatch.setattr(tf.compat.v1, "Session", RecordedSession)
    return created


def _open(sessions: list[Any]) -> list[Any]:
    return [session for session in sessions if not session._closed]


class StepFailed(Exception):
    pass


def _fail_on_step(monkeypatch, after: int) -> None:
    """Executor.step raises StepFailed once `after` steps have run."""
    original, calls = chief.Executor.step, []

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > after:
            raise StepFailed("the wafer stopped")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(chief.Executor, "step", step)


def test_training_and_evaluation_close_their_sessions(make_estimator, make_model_fn, make_input_fn, sessions):
    estimator = make_estimator(model_fn=make_model_fn(host_call="list"))
    estimator.train(make_input_fn(), max_steps=3)
    assert len(sessions) >= 2  # precheck's and the checkpoint writer's, at least
    assert not _open(sessions)
    cerebras_tf.release_system()  # the EVAL program, in the same process

    sessions.clear()
    metrics = estimator.evaluate(make_input_fn(), steps=2, use_cs=True)
    assert "mse" in metrics  # the host_call metrics were computed in a session of their own
    assert sessions and not _open(sessions)


def test_a_failing_training_step_closes_the_sessions(make_estimator, make_input_fn, sessions, monkeypatch):
    _fail_on_step(monkeypatch, after=1)
    with pytest.raises(StepFailed):
        make_estimator().train(make_input_fn(), max_steps=3)
    assert sessions and not _open(sessions)


def test_a_failing_evaluation_step_closes_the_sessions(make_estimator, make_model_fn, make_input_fn, sessions,
                                                       monkeypatch):
    estimator = make_estimator(model_fn=make_model_fn(host_call="list"))
    estimator.train(make_input_fn(), max_steps=1)
    cerebras_tf.release_system()
    sessions.clear()
    _fail_on_step(monkeypatch, after=1)
    with pytest.raises(StepFailed):
        estimator.evaluate(make_input_fn(), steps=3, use_cs=True)
    assert sessions and not _open(sessions)
