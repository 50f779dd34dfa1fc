"""A full disk or an unwritable model_dir (or compile_dir) while a run on the system writes (issue 24, item 2): a
ModelDirWriteError naming model_dir, the file, the free space and the checkpoint to resume from; the previous
checkpoint intact and still named by the `checkpoint` file; nothing of the failed save left behind.

The disk-full tests fill a real 2 MiB tmpfs (mounted by the test, which needs root; skipped otherwise) right
before the save of global step 200, so TF's own save op hits ENOSPC. An unwritable model_dir (EACCES, EROFS)
cannot be produced mid-run here (root ignores permissions; a filesystem with a file open for writing cannot be
remounted read-only), so those tests make the save raise TF's own PermissionDeniedError text at the save call.

Compiling into compile_dir on a full disk (or one remounted read-only while the model compiles, which nothing
holds open for writing then) raises the same error naming compile_dir, and leaves no artifact, whole or partial.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import errno
import json
import logging
import math
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSRunConfig, set_default_tf_config
from cerebras_tf.run import chief, tensorboard
from cerebras_tf.compiler import artifact
from cerebras_tf.errors import ModelDirError, ModelDirWriteError
from cerebras_tf.run.trainer_lock import LOCK_FILE
from cerebras_tf.write_failures import write_failure
from cerebras_tf.wse.units import fmt_bytes
from test_executor import _input_fn, _model_fn  # the same small MLP as the executor tests

PAGE = os.sysconf("SC_PAGE_SIZE")


def _no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()


@pytest.fixture(autouse=True)
def _tf_config(monkeypatch):
    _no_tf_config(monkeypatch)


@pytest.fixture
def small_disk(tmp_path):
    """A fresh 2 MiB tmpfs: a real filesystem that fills up."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a small tmpfs, and mounting one needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (a real full disk): {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk, leave: int = 0) -> None:
    """Fill the filesystem of `disk`, then give back `leave` bytes."""
    path = os.path.join(disk, "filler")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 16, PAGE, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
        os.ftruncate(fd, max(os.fstat(fd).st_size - leave, 0))
    finally:
        os.close(fd)


def _estimator(model_dir, compile_dir, **config):
    """compile_dir None: the default, model_dir/cs_compile."""
    return CerebrasEstimator(_model_fn, model_dir=str(model_dir), compile_dir=compile_dir and str(compile_dir),
                             config=CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1, save_checkpoints_steps=100,
                                                **config), params={})


def _fail_save_at(monkeypatch, step, before=None, after=None):
    """Run `before` (or `after`) around CheckpointWriter.save of global step `step`."""
    save = chief.CheckpointWriter.save

    def patched(self, executor, at):
        if at == step and before is not None:
            before(self)
        path = save(self, executor, at)
        if at == step and after is not None:
            after(self)
        return path

    monkeypatch.setattr(chief.CheckpointWriter, "save", patched)


def _files(model_dir):
    return {name: open(os.path.join(model_dir, name), "rb").read() for name in sorted(os.listdir(model_dir))
            if os.path.isfile(os.path.join(model_dir, name))}


def _variables(model_dir):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


# what fits on the disk when the save of step 200 starts -> the files that save made before ENOSPC
ROOM = {"nothing": (lambda data, index: 0, []),
        "the data file": (lambda data, index: data, ["model.ckpt-200.data-00000-of-00001"]),
        "data, index, not the checkpoint file": (lambda data, index: data + index + PAGE,
                                                 ["checkpoint.tmp", "model.ckpt-200.data-00000-of-00001",
                                                  "model.ckpt-200.index"])}


@pytest.mark.parametrize("room", ROOM)
def test_a_full_disk_while_saving_names_it_and_leaves_the_previous_checkpoint_whole(room, small_disk, tmp_path,
                                                                                   monkeypatch, caplog):
    model_dir = small_disk / "model"
    estimator = _estimator(model_dir, tmp_path / "compile")
    estimator.train(_input_fn, max_steps=100)
    reference = tmp_path / "reference"  # the same model_dir at step 100, on a disk with room
    shutil.copytree(model_dir, reference, ignore=shutil.ignore_patterns(LOCK_FILE))
    before = _files(model_dir)
    pages = lambda name: math.ceil(len(before[name]) / PAGE) * PAGE  # noqa: E731
    leave = ROOM[room][0](pages("model.ckpt-100.data-00000-of-00001"), pages("model.ckpt-100.index"))
    _fail_save_at(monkeypatch, 200, before=lambda writer: _fill(small_disk, leave))

    with caplog.at_level(logging.INFO, logger="tensorflow"), pytest.raises(ModelDirWriteError) as caught:
        estimator.train(_input_fn, max_steps=300)
    error = caught.value
    assert error.render().splitlines()[0] == (
        f"[Model Dir] The disk holding model_dir {model_dir} is full: saving the checkpoint of global step 200 "
        f"(model.ckpt-200) failed (No space left on device); {error.message.split('; ')[1]}; it needs about "
        f"{error.message.split('needs about ')[1]}")
    assert error.reason == "No space left on device" and isinstance(error.__cause__, tf.errors.ResourceExhaustedError)
    # the space left when the save failed (said as "4.1 KB free on that filesystem")
    assert error.free_bytes is not None and error.free_bytes <= leave + PAGE
    assert f"; {fmt_bytes(error.free_bytes)} free on that filesystem; " in error.message
    assert "free on that filesystem" in error.message and str(model_dir / "model.ckpt-200.index") in error.where
    assert "Free space on that filesystem, or point model_dir at a disk with room" in error.fix
    assert f"the run resumes from {model_dir / 'model.ckpt-100'} (global step 100)" in error.fix

    removed = [line for line in caplog.messages if line.startswith("Removed the partial files")]
    for name in ROOM[room][1]:  # the failed save had made these: each is gone
        assert removed and name in removed[0], (name, removed)
    after = _files(model_dir)
    new = set(after) - set(before) - {"filler"}
    assert len(new) == 1 and new.pop().startswith("events.out.tfevents.")  # this run's event file, nothing else
    kept = [name for name in before if name != "graph.pbtxt"]  # each run writes its graph again
    assert {name: after[name] for name in kept} == {name: before[name] for name in kept}  # checkpoint 100 untouched
    state = tf.train.get_checkpoint_state(str(model_dir))
    assert list(state.all_model_checkpoint_paths) == [str(model_dir / "model.ckpt-100")]
    assert not os.path.exists(model_dir / LOCK_FILE)

    # free the space and train again: it resumes from step 100 exactly as from an untouched copy of it
    os.remove(small_disk / "filler")
    monkeypatch.undo()
    _no_tf_config(monkeypatch)
    estimator.train(_input_fn, max_steps=200)
    _estimator(reference, tmp_path / "compile").train(_input_fn, max_steps=200)
    resumed, expected = _variables(model_dir), _variables(reference)
    assert resumed.keys() == expected.keys() and int(resumed["global_step"]) == 200
    assert all(np.array_equal(resumed[name], expected[name]) for name in expected)


def test_a_full_disk_when_the_run_writes_its_graph_names_it(small_disk, tmp_path, monkeypatch):
    model_dir = small_disk / "model"
    estimator = _estimator(model_dir, tmp_path / "compile")
    write_graph = chief.TrainingSummaries.write_graph

    def patched(self, graph):
        _fill(small_disk)
        write_graph(self, graph)

    monkeypatch.setattr(chief.TrainingSummaries, "write_graph", patched)
    with pytest.raises(ModelDirWriteError) as caught:
        estimator.train(_input_fn, max_steps=100)
    error = caught.value
    assert error.message.startswith(f"The disk holding model_dir {model_dir} is full: writing the run's graph "
                                    "(graph.pbtxt and events.out.tfevents.")
    assert error.path == str(model_dir / "graph.pbtxt") and "no checkpoint was saved in" in error.fix
    assert sorted(name for name in os.listdir(model_dir) if not name.startswith("events.out.tfevents.")) == [
        "cs_placement"]  # no graph.pbtxt.tmp* (TF's atomic write leaves it when the write fails), no lock


@pytest.mark.parametrize("stopped", [False, True], ids=["run ends", "another error stops the run"])
def test_a_full_disk_when_the_event_file_is_finished_names_it(stopped, tmp_path, monkeypatch):
    model_dir = tmp_path / "model"
    estimator = _estimator(model_dir, tmp_path / "compile")

    def flush(self):
        raise tf.errors.ResourceExhaustedError(None, None, f"{self.path}; No space left on device")

    monkeypatch.setattr(tensorboard.EventWriter, "flush", flush)
    if stopped:  # the error that stopped the run is the one raised; the event file only gets a warning
        _fail_save_at(monkeypatch, 100, after=lambda writer: (_ for _ in ()).throw(KeyError("stop")))
        with pytest.raises(KeyError, match="stop"):
            estimator.train(_input_fn, max_steps=100)
        return
    with pytest.raises(ModelDirWriteError) as caught:
        estimator.train(_input_fn, max_steps=100)
    error = caught.value
    assert error.message.startswith(f"The disk holding model_dir {model_dir} is full: finishing the run's event file "
                                    "(events.out.tfevents.")
    assert error.path.startswith(str(model_dir / "events.out.tfevents."))
    # the last checkpoint is saved before the event file is finished
    assert f"the run resumes from {model_dir / 'model.ckpt-100'} (global step 100)" in error.fix
    assert tf.train.latest_checkpoint(str(model_dir)) == str(model_dir / "model.ckpt-100")


def test_a_full_disk_before_the_run_refuses_it_without_leaving_a_lock(small_disk, tmp_path):
    model_dir = small_disk / "model"
    estimator = _estimator(model_dir, tmp_path / "compile")
    estimator.compile(_input_fn)  # its placement picture goes to model_dir while there is room
    _fill(small_disk)
    with pytest.raises(ModelDirWriteError) as caught:
        estimator.train(_input_fn, max_steps=100)
    assert "writing the trainer lock" in caught.value.message and "0 B free on that filesystem" in caught.value.message
    assert "no checkpoint was saved in" in caught.value.fix
    assert not os.path.exists(model_dir / LOCK_FILE)


def _walk(directory):
    """Every directory and file below `directory` (relative), or None if it does not exist."""
    if not os.path.exists(directory):
        return None
    return sorted(os.path.relpath(os.path.join(root, name), directory) for root, dirs, files in os.walk(directory)
                  for name in dirs + files)


# the call, where compile_dir is, and how much room the disk has when the artifact is written
COMPILES = {"compile, nothing fits": ("compile", "own", 0),
            "compile, part of the artifact fits": ("compile", "own", 16 * PAGE),
            "compile into model_dir/cs_compile": ("compile", "default", 0),
            "train": ("train", "own", 0)}


@pytest.mark.parametrize("case", COMPILES)
def test_a_full_disk_when_compiling_names_compile_dir_and_leaves_no_artifact(case, small_disk, tmp_path):
    call, where, leave = COMPILES[case]
    model_dir = small_disk / "model" if where == "default" else tmp_path / "model"
    compile_dir = model_dir / "cs_compile" if where == "default" else small_disk / "compile"
    estimator = _estimator(model_dir, None if where == "default" else compile_dir)
    _fill(small_disk, leave)
    run = {"compile": lambda: estimator.compile(_input_fn), "train": lambda: estimator.train(_input_fn, max_steps=1)}
    with pytest.raises(ModelDirWriteError) as caught:
        run[call]()
    error = caught.value
    assert error.message.startswith(f"The disk holding compile_dir {compile_dir} is full: writing the compile "
                                    "artifact of mode train failed (No space left on device); ")
    assert error.reason == "No space left on device" and error.free_bytes is not None and error.free_bytes <= leave
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.ENOSPC
    assert error.path == str(compile_dir / "train") and error.where == error.path
    assert error.fix == (f"Free space on that filesystem, or point compile_dir (CerebrasEstimator(compile_dir=...)) "
                         f"at a disk with room (copy {compile_dir} there to keep its compiled artifacts). Then compile "
                         f"or train again: the model is compiled again into {compile_dir / 'train'} (the failed write "
                         "left nothing there).")
    # nothing of the artifact is left (no temporary directory), nor the directories the write created
    assert _walk(compile_dir) is None
    if where == "default" and call == "compile":
        assert _walk(model_dir) is None
    if call == "train":
        assert not os.path.exists(model_dir / LOCK_FILE)

    os.remove(small_disk / "filler")  # free the space: the model compiles, then its artifact is reused
    first = estimator.compile(_input_fn)
    assert not first.reused and first.note == "no artifact yet"
    manifest = json.loads((compile_dir / "train" / artifact.MANIFEST_FILE).read_text())
    assert _walk(compile_dir) == sorted(["train", *(f"train/{name}" for name in [*manifest["files"],
                                                                                 artifact.MANIFEST_FILE])])
    if leave:  # the write failed part way: the IR fitted, the whole artifact did not
        sizes = [os.path.getsize(compile_dir / "train" / name) for name in os.listdir(compile_dir / "train")]
        assert os.path.getsize(compile_dir / "train" / "program.json") < leave < sum(sizes)
    assert estimator.compile(_input_fn).reused


def _remount(disk, mode):
    subprocess.run(["mount", "-o", f"remount,{mode}", str(disk)], check=True, capture_output=True)


def test_an_unwritable_compile_dir_is_refused_before_and_named_when_it_becomes_so(small_disk, tmp_path, monkeypatch):
    compile_dir = small_disk / "compile"
    estimator = _estimator(tmp_path / "model", compile_dir)
    _remount(small_disk, "ro")  # root ignores permissions, not a read-only filesystem
    try:
        with pytest.raises(ModelDirError) as refused:  # the check before anything is written
            estimator.compile(_input_fn)
        assert type(refused.value) is ModelDirError
        assert f"compile_dir {compile_dir} cannot be created: {small_disk} is not writable" in refused.value.message

        _remount(small_disk, "rw")
        load = artifact.load_artifact

        def read_only_after_the_check(*args):  # the filesystem turns read-only while the model compiles
            _remount(small_disk, "ro")
            return load(*args)

        monkeypatch.setattr(artifact, "load_artifact", read_only_after_the_check)
        with pytest.raises(ModelDirWriteError) as caught:
            estimator.compile(_input_fn)
    finally:
        _remount(small_disk, "rw")
    error = caught.value
    assert error.message.startswith(f"compile_dir {compile_dir} is not writable: writing the compile artifact of "
                                    "mode train failed (Read-only file system); ")
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.EROFS
    assert error.fix.startswith(f"Make {compile_dir} writable again (its permissions, or a filesystem mounted "
                                "read-only), or point compile_dir (CerebrasEstimator(compile_dir=...)) at a writable "
                                "directory")
    assert _walk(compile_dir) is None
    monkeypatch.undo()
    _no_tf_config(monkeypatch)
    assert not estimator.compile(_input_fn).reused and _walk(compile_dir)


def _unwritable_save(step, leftover):
    """A Saver.save that, at `step`, leaves a *.tempstate* file and then fails as TF does on a read-only
    filesystem."""
    save = tf.compat.v1.train.Saver.save

    def patched(self, session, save_path, global_step=None, **kwargs):
        if global_step == step:
            prefix = f"{save_path}-{global_step}"
            with open(f"{prefix}.data-00000-of-00001{leftover}", "wb") as file:
                file.write(b"\0" * 100)
            raise tf.errors.PermissionDeniedError(
                None, None, f"{prefix}.data-00000-of-00001{leftover}; Read-only file system\n\t [[{{{{node "
                            "save/SaveV2}}]]")
        return save(self, session, save_path, global_step=global_step, **kwargs)

    return patched


def test_an_unwritable_model_dir_while_saving_names_it(tmp_path, monkeypatch):
    model_dir = tmp_path / "model"
    estimator = _estimator(model_dir, tmp_path / "compile")
    estimator.train(_input_fn, max_steps=100)
    before = _files(model_dir)
    monkeypatch.setattr(tf.compat.v1.train.Saver, "save", _unwritable_save(200, ".tempstate4242"))
    with pytest.raises(ModelDirWriteError) as caught:
        estimator.train(_input_fn, max_steps=300)
    error = caught.value
    assert error.message.startswith(f"model_dir {model_dir} is not writable: saving the checkpoint of global step "
                                    "200 (model.ckpt-200) failed (Read-only file system); ")
    assert "free on that filesystem" in error.message and error.reason == "Read-only file system"
    assert error.fix.startswith(f"Make {model_dir} writable again")
    assert f"the run resumes from {model_dir / 'model.ckpt-100'} (global step 100)" in error.fix
    after = _files(model_dir)
    kept = [name for name in before if name != "graph.pbtxt"]
    assert {name: after[name] for name in kept} == {name: before[name] for name in kept}
    assert [name for name in set(after) - set(before) if not name.startswith("events.out.tfevents.")] == []
    assert tf.train.latest_checkpoint(str(model_dir)) == str(model_dir / "model.ckpt-100")


def test_other_save_errors_pass_unchanged_and_still_leave_no_partial_files(tmp_path, monkeypatch):
    model_dir = tmp_path / "model"
    estimator = _estimator(model_dir, tmp_path / "compile")
    save = tf.compat.v1.train.Saver.save

    def patched(self, session, save_path, global_step=None, **kwargs):
        if global_step == 100:
            open(f"{save_path}-100.index.tempstate77", "wb").close()
            raise tf.errors.InternalError(None, None, "something else")
        return save(self, session, save_path, global_step=global_step, **kwargs)

    monkeypatch.setattr(tf.compat.v1.train.Saver, "save", patched)
    with pytest.raises(tf.errors.InternalError, match="something else"):
        estimator.train(_input_fn, max_steps=100)
    assert not [name for name in os.listdir(model_dir) if "tempstate" in name or name.startswith("model.ckpt")]


def test_write_failures_are_recognised_from_tf_and_python_errors():
    assert write_failure(tf.errors.ResourceExhaustedError(None, None, "Graph execution error:\n\n/m/x; No space "
                                                          "left on device")) == ("No space left on device", True)
    assert write_failure(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")) is None
    assert write_failure(tf.errors.PermissionDeniedError(None, None, "/m/x; Permission denied")) == (
        "Permission denied", False)
    assert write_failure(OSError(errno.EDQUOT, "Disk quota exceeded")) == ("Disk quota exceeded", True)
    assert write_failure(OSError(errno.EROFS, "Read-only file system")) == ("Read-only file system", False)
    assert write_failure(OSError(errno.ENOENT, "No such file")) is None
