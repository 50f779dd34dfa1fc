"""Helpers for the input-worker tests: loopback ports, worker processes that are always stopped, what this
process listens on."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pathlib
import signal
import subprocess
import sys
from typing import Callable, Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def worker_env(tf_config: str) -> dict[str, str]:
    env = dict(os.environ, TF_CONFIG=tf_config, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    env.pop("PYTHONWARNINGS", None)
    return env


@pytest.fixture
def env_for() -> Callable[[str], dict[str, str]]:
    """env_for(tf_config) -> an environment for a child process of this repo with that TF_CONFIG."""
    return worker_env


@pytest.fixture
def spawn_worker() -> Iterator[Callable[..., subprocess.Popen]]:
    """spawn_worker(tf_config, *args) -> a `python -m cerebras_tf.input_workers` process, killed at teardown."""
    procs: list[subprocess.Popen] = []

    def spawn(tf_config: str, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cerebras_tf.input_workers", *args],
            cwd=ROOT, env=worker_env(tf_config), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        procs.append(proc)
        return proc

    try:
        yield spawn
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            if proc.stdout:
                proc.stdout.close()


def _listening_ports_of_this_process() -> set[int]:
    """TCP ports this process listens on, on any interface (what `ss -ltnp` shows for it), from /proc."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.fixture
def listening_ports() -> Callable[[], set[int]]:
    """listening_ports() -> the TCP ports this process listens on now."""
    return _listening_ports_of_this_process
