"""Taking apart the text of an error read from tf.data service."""
from __future__ import annotations

from cerebras_tf.input_workers.failures import parse_worker_error

SERVICE_ERROR = (
    "Failed to get element from worker 127.0.0.1:5001: assertion failed: [sample id out of range] [Condition x < y "
    "did not hold]\n\t [[{{node map/assert_less/Assert/Assert}}]] [Op:IteratorGetNext] name: "
)


def test_the_worker_the_message_and_the_failing_nodes_are_taken_apart():
    error = parse_worker_error(SERVICE_ERROR)
    assert error.address == "127.0.0.1:5001"
    assert error.message.startswith("assertion failed: [sample id out of range]")
    assert "[Op:IteratorGetNext]" not in error.message and "Failed to get element" not in error.message
    assert error.nodes == ("map/assert_less/Assert/Assert",)


def test_text_of_another_shape_is_kept_as_the_message():
    error = parse_worker_error("  Socket closed  ")
    assert (error.address, error.message, error.nodes) == (None, "Socket closed", ())
