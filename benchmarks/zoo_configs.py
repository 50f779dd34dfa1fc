"""Model Zoo configs at their real size: every TF config the zoo ships, compiled as a user would compile it.

For every TF config yaml a Model Zoo checkout ships under a model's `configs/`
(BERT and PubMedBERT/RoBERTa pre-training, the BERT fine-tuning tasks, GPT-2,
GPT-3, GPT-J and its fine-tuning, T5, Transformer, Linformer, fc_mnist, UNet),
this benchmark takes the config as it is -- hidden size, layers, heads,
sequence lengths, vocabulary and batch exactly as the yaml says -- and only
redirects its data paths to a small synthetic data set written in the model's
own on-disk format at the config's real sequence length and vocabulary size
(a handful of examples: only compile runs). It then runs the zoo's own run.py
with a full compile, `--compile_only`, in a subprocess through
`python -m cerebras_tf.csoft` with `--cs_ip localhost` for R1.6/R1.7 (the
container flavour, or for a config written for weight streaming the
weight_streaming flavour: the Cerebras weight-streaming container's names,
`tfwse` and `cerebras.tf.ws.cs_estimator_ws`, so the zoo's own switch,
run_utils.get_execution_mode, takes its weight-streaming path) and for R1.8
the appliance flavour, `CSX pipeline` or, for a config written for weight
streaming, `CSX weight_streaming`; one config at a time, measuring the
child's wall time and peak RSS (os.wait4's rusage).

Per config it reports the mode the config was written for (weight streaming
when its name has `_ws`, it is GPT-3 or GPT-J, or its runconfig says
`execution_strategy: weight_streaming`; else pipeline), the mode the compile
laid it out in (from the compile's report), and the outcome:
  fits     the compile's estimate (samples/s, limiting bound) and the memory it
           uses on the wafer against the WSE-2's (the artifact's report.json:
           cs_compile/train/report.json in the model dir), the parameters
           (the artifact's report.txt);
  refused  the FabricCapacityError's first line (needed vs available; the
           parameters, marked ~, from the float32 weights it names);
  FAIL     any other failure, with its exception and whose code raised it.
It prints a table and writes report.md and results.json into the work dir,
which is kept: per config the params yaml, the synthetic data, the model dir
and compile.log.

    .venv-3.11/bin/python -m benchmarks.zoo_configs --zoo /tmp/zoo/R_1.6.0
    .venv-3.11/bin/python -m benchmarks.zoo_configs --zoo /tmp/zoo/R_1.6.0 --configs '*bert_large*' --work /tmp/zc

The machinery (model table and data writers, the release's command line, the
environment: TF 2.2 compatibility and stand-ins for the zoo's requirements)
is benchmarks/zoo_runs.py's. Sizes the zoo does not ship: T5's vocabulary is
the 32,000 pieces of the spiece.model its yaml names; the Transformer's
vocab.bpe.32000 is taken as 32,000 BPE entries plus the 4 special tokens its
preprocessing adds (an assumption: the file is built from WMT16 by the user).
It is not part of the test suite (it needs a zoo checkout; the largest
configs take tens of seconds and several GB each).
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from benchmarks import zoo_runs
from benchmarks.zoo_runs import (
    INPUT_SECTIONS,
    MODELS,
    REQUIREMENT_STAND_INS,
    SEED,
    WORDPIECE_SPECIAL,
    DataWriter,
    Params,
    Release,
    Setup,
)

COMPILE_TIMEOUT = 900  # seconds
# Measured CS-2 runs (the ALCF AI testbed's public example logs; each one short run). The first sets the
# fabric's sustained_fraction (wse/fabric.py); the others only check the estimate, under the conditions given.
PUBLISHED = {  # config file name -> (samples/s measured, where)
    "params_bert_large_msl128.yaml": (6370.0, "1 CS-2, R1.7.1 TF, pipelined, batch 1024: sets the calibration"),
    "params_gptj_6B.yaml": (19.8, "1 CS-2, R1.9.2, weight streaming, batch 66"),
    "params_gpt2_small_ws.yaml": (494.0, "1 CS-2, R2.x, weight streaming, msl 2048, batch 112"),
}
# Vocabularies the zoo does not ship: (lines of the vocabulary file, where the size comes from)
UNSHIPPED_VOCABS = {
    "transformers/tf/t5/run.py": (32000, "t5-small spiece.model, which the yaml names: 32,000 pieces"),
    "transformers/tf/transformer/run.py": (
        32004, "assumed: 32,000 BPE entries + 4 special tokens (vocab.bpe.32000 is built by the user)"),
}
UNET_IMAGES = 8  # per split


# --------------------------------------------------------------------------------------------- configs
@dataclasses.dataclass(frozen=True)
class Config:
    path: Path  # the yaml in the checkout
    run_py: Path  # the run.py that reads it (the nearest one above its configs/ dir)
    model: str  # e.g. bert, bert/fine_tuning/classifier, gptj/fine_tuning/abstractive_summarization, unet

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def key(self) -> str:
        return f"{self.model.replace('/', '_')}__{self.path.stem}"

    def run_py_rel(self, zoo: Path) -> str:
        return self.run_py.relative_to(zoo / "modelzoo").as_posix()


def _model_label(directory: Path, modelzoo: Path) -> str:
    parts = [p for p in directory.relative_to(modelzoo).parts if p not in ("transformers", "tf")]
    return "/".join(parts)


def find_configs(zoo: Path) -> list[Config]:
    """Every yaml in a `configs/` dir of a TF model (a dir with `tf` in its path and a run.py at or above it)."""
    modelzoo = zoo / "modelzoo"
    found = []
    for path in sorted(modelzoo.rglob("configs/*.yaml")):
        rel = path.relative_to(modelzoo).parts
        if "tf" not in rel or "pytorch" in rel:
            continue
        directory = path.parent.parent
        run_py = next((d / "run.py" for d in [directory, *directory.parents]
                       if (d / "run.py").is_file() and modelzoo in d.parents), None)
        if run_py is None:
            continue
        found.append(Config(path, run_py, _model_label(directory, modelzoo)))
    return found


def written_for(config: Config, params: Params) -> tuple[str, str]:
    """(mode, why): the execution mode the config was written for."""
    strategy = str((params.get("runconfig") or {}).get("execution_strategy") or "")
    if strategy:
        return ("weight_streaming" if "weight" in strategy else "pipeline"), f"runconfig execution_strategy {strategy}"
    if "_ws" in config.path.stem:
        return "weight_streaming", "name has _ws"
    top = config.model.split("/")[0]
    if top in ("gpt3", "gptj"):
        return "weight_streaming", f"{'GPT-3' if top == 'gpt3' else 'GPT-J'}"
    return "pipeline", "default"


# --------------------------------------------------------------------------------------------- data
def vocab_size(config: Config, params: Params, zoo: Path) -> tuple[int | None, str]:
    """The real vocabulary's size for the synthetic vocabulary files: the zoo's own vocabulary file's lines
    when it ships it, else UNSHIPPED_VOCABS; (None, ...) when the yaml gives vocab_size (the writers use it)."""
    for section in INPUT_SECTIONS:
        inputs = params.get(section) or {}
        for key in ("vocab_file", "src_vocab_file"):
            if inputs.get(key):
                path = (config.run_py.parent / inputs[key]).resolve()
                if path.is_file():
                    with open(path, "rb") as f:
                        lines = sum(1 for _ in f)
                    return lines, f"{lines:,} ({path.name}, shipped in the zoo)"
    known = UNSHIPPED_VOCABS.get(config.run_py_rel(zoo))
    if known:
        return known[0], f"{known[0]:,} ({known[1]})"
    sizes = [(params.get(s) or {}).get("vocab_size") for s in INPUT_SECTIONS]
    given = next((v for v in sizes if v), None)
    return None, (f"{given:,} (the yaml's vocab_size)" if given else "none")


def glue_mnli_tfds(params: Params, setup: Setup) -> None:
    """BERT classifier (MnliDataProcessor): tfds.load("glue/mnli"): train, validation_matched and
    validation_mismatched splits of premise and hypothesis (text of vocabulary words), label and idx."""
    vocab = zoo_runs.write_wordpiece_vocab(setup)
    words = zoo_runs._words(setup.vocab - len(WORDPIECE_SPECIAL))
    rng = np.random.default_rng(SEED)
    classes = int(params.get("model", {}).get("num_cls_classes") or 3)

    def text() -> str:
        return " ".join(words[i] for i in rng.integers(0, len(words), size=int(rng.integers(4, 40))))

    def split(count: int) -> dict[str, np.ndarray]:
        return {"premise": np.array([text() for _ in range(count)]),
                "hypothesis": np.array([text() for _ in range(count)]),
                "label": rng.integers(0, classes, size=count).astype(np.int64),
                "idx": np.arange(count, dtype=np.int32)}

    names = ("train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched")
    directory = zoo_runs._tfds_stand_in(setup, "glue/mnli", {name: split(16) for name in names})
    for section, _, _ in zoo_runs._splits(params):
        params[section]["data_dir"] = str(directory)
        params[section]["vocab_file"] = str(vocab)


def _unet_arrays(shape: Sequence[int], count: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    images = rng.integers(0, 256, size=(count, *shape), dtype=np.uint8)
    masks = np.zeros((count, *shape), dtype=np.uint8)
    masks[:, shape[0] // 4: shape[0] // 2, shape[1] // 4: shape[1] // 2] = 255
    return images, masks


def unet_tfrecords(params: Params, setup: Setup) -> None:
    """DAGM2007TFRecordsDataset / SeverstalTFRecordsDataset: `<dataset_path>/{train,test}/{train,test}-*.tfrecords`
    of image and mask, float32 of the yaml's image_shape."""
    inputs = params["train_input"]
    shape = list(inputs["image_shape"])
    images, masks = _unet_arrays(shape, UNET_IMAGES)
    root = setup.data / "unet_tfrecords"
    for split in ("train", "test"):
        records = [zoo_runs._example({"image": (image / 127.5 - 1).astype(np.float32).ravel(),
                                      "mask": (mask / 255).astype(np.float32).ravel()})
                   for image, mask in zip(images, masks)]
        zoo_runs._write_records(root / split / f"{split}-0.tfrecords", records)
    inputs["dataset_path"] = str(root)


def _encode(image: np.ndarray, fmt: str) -> bytes:
    import tensorflow as tf

    return (tf.io.encode_png(image) if fmt == "png" else tf.io.encode_jpeg(image)).numpy()


def dagm_images(params: Params, setup: Setup) -> None:
    """DAGM2007Dataset: `<dataset_path>/Class<id>/{Train,Test}/` PNG images (512 x 512 grey, as DAGM's), their
    defect masks under `Label/`, and `Label/Labels.txt` (tab-separated, a header; the reader keeps the rows
    whose first column is not 0 and takes the image and mask names from the second and fourth)."""
    inputs = params["train_input"]
    images, masks = _unet_arrays([512, 512, 1], UNET_IMAGES)
    root = setup.data / "dagm"
    for split in ("Train", "Test"):
        directory = root / f"Class{inputs['class_id']}" / split
        (directory / "Label").mkdir(parents=True, exist_ok=True)
        rows = ["Defective\tImage\tUnused\tLabel\tUnused2"]
        for index, (image, mask) in enumerate(zip(images, masks)):
            name = f"{index:04d}.PNG"
            (directory / name).write_bytes(_encode(image, "png"))
            (directory / "Label" / f"{index:04d}_label.PNG").write_bytes(_encode(mask, "png"))
            rows.append(f"1\t{name}\t0\t{index:04d}_label.PNG\t0")
        (directory / "Label" / "Labels.txt").write_text("\n".join(rows) + "\n")
    inputs["dataset_path"] = str(root)


def severstal_images(params: Params, setup: Setup) -> None:
    """SeverstalDataset: `<dataset_path>/train.csv` (ImageId,ClassId,EncodedPixels: run-length masks of the
    1600 x 256 images) and `train_images/` JPEGs (256 high, 1600 wide, as Severstal's)."""
    inputs = params["train_input"]
    images, _ = _unet_arrays([256, 1600, 1], UNET_IMAGES)
    root = setup.data / "severstal"
    (root / "train_images").mkdir(parents=True, exist_ok=True)
    rows = ["ImageId,ClassId,EncodedPixels"]
    for index, image in enumerate(images):
        name = f"{index:04d}.jpg"
        (root / "train_images" / name).write_bytes(_encode(image, "jpeg"))
        rows.append(f"{name},{inputs['class_id']},{1 + 256 * 100} 2000 {1 + 256 * 400} 3000")
    (root / "train.csv").write_text("\n".join(rows) + "\n")
    inputs["dataset_path"] = str(root)


def unet_data(params: Params, setup: Setup) -> None:
    dataset = params["train_input"]["dataset"]
    if dataset.endswith("TFRecordsDataset"):
        unet_tfrecords(params, setup)
    elif dataset.startswith("DAGM"):
        dagm_images(params, setup)
    elif dataset.startswith("Severstal"):
        severstal_images(params, setup)
    else:
        raise ValueError(f"no synthetic data for UNet dataset {dataset!r}")


def data_writer(config: Config, zoo: Path) -> DataWriter:
    """zoo_runs' writer for the config's run.py (MNLI and UNet: this module's)."""
    if "mnli" in config.name:
        return glue_mnli_tfds
    rel = config.run_py_rel(zoo)
    if rel == "unet/tf/run.py":
        return unet_data
    for spec in MODELS.values():
        if spec.run_py == rel:
            return spec.data
    raise KeyError(f"no data writer for {rel}")


# pandas is a requirement of the zoo's UNet input readers (imported by unet/tf/input/__init__ for every
# dataset); where it is not installed, this stand-in serves the little of it they use.
PANDAS_STAND_IN = {"__init__.py": textwrap.dedent('''\
    """Stand-in for pandas, written by benchmarks/zoo_configs.py: read_csv, a column == value filter, len(index)
    and to_csv, as the Model Zoo's UNet input readers use them (the csv module underneath)."""
    import csv


    def _value(text):
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text


    class Series:
        def __init__(self, values):
            self.values = list(values)

        def __eq__(self, other):
            return [value == other for value in self.values]

        def __len__(self):
            return len(self.values)


    class DataFrame:
        def __init__(self, columns, rows, index=None, index_name=None):
            self.columns = list(columns)
            self._rows = [list(row) for row in rows]
            self.index = list(range(len(self._rows))) if index is None else list(index)
            self._index_name = index_name

        def __getitem__(self, key):
            if isinstance(key, str):
                column = self.columns.index(key)
                return Series(row[column] for row in self._rows)
            mask = list(key)
            return DataFrame(self.columns, [r for r, keep in zip(self._rows, mask) if keep],
                             [i for i, keep in zip(self.index, mask) if keep], self._index_name)

        def __len__(self):
            return len(self._rows)

        def to_csv(self, path, sep=",", index=True, **kwargs):
            with open(path, "w", newline="") as f:
                writer = csv.writer(f, delimiter=sep)
                writer.writerow(([self._index_name or ""] if index else []) + self.columns)
                for name, row in zip(self.index, self._rows):
                    writer.writerow(([name] if index else []) + row)


    def read_csv(path, sep=",", index_col=None, **kwargs):
        with open(path, newline="") as f:
            rows = [row for row in csv.reader(f, delimiter=sep) if row]
        header, body = rows[0], [[_value(cell) for cell in row] for row in rows[1:]]
        if index_col is None:
            return DataFrame(header, body)
        k = index_col
        return DataFrame(header[:k] + header[k + 1:], [row[:k] + row[k + 1:] for row in body],
                         [row[k] for row in body], header[k])
    ''')}


# Two more TF 2.2 differences the UNet meets, served by this addition to zoo_runs' TF 2.2 compatibility
# sitecustomize (--tf-compat):
# - TF 2.3 inserted `groups` after `dilation_rate` in the Keras Conv1D/2D/3D constructors; the zoo's
#   Conv2DLayer passes all of TF 2.2's arguments positionally, so its `activation` landed on `groups` and
#   `use_bias` on `activation`: a call with more than six positional arguments whose seventh is not an int
#   gets groups=1 put in its place;
# - in TF 2.2 `tensorflow.python.keras` was tf.keras; UNetModel imports concatenate and Flatten from there and
#   passes them tf.keras's mixed precision policy, which the legacy copy of Keras later TF keeps there cannot
#   read: those two names are served from tf.keras.
CONV_COMPAT = textwrap.dedent('''\


    # --- benchmarks/zoo_configs.py: TF 2.2's positional Conv1D/2D/3D arguments (no `groups`)
    _CONV_MODULES = {f"{keras}.src.layers.convolutional.conv{n}d": f"Conv{n}D"
                     for keras in ("keras", "tf_keras") for n in (1, 2, 3)}


    def _tf22_positional(cls):
        init = cls.__init__
        if getattr(init, "_tf22_positional", False):
            return

        def __init__(self, *args, **kwargs):
            if len(args) > 6 and (isinstance(args[6], bool) or not isinstance(args[6], int)):
                args = (*args[:6], 1, *args[6:])
            init(self, *args, **kwargs)

        __init__._tf22_positional = True
        cls.__init__ = __init__


    class _ConvLoader(importlib.abc.Loader):
        def __init__(self, loader, name):
            self._loader, self._name = loader, name

        def create_module(self, spec):
            return self._loader.create_module(spec)

        def exec_module(self, module):
            self._loader.exec_module(module)
            cls = getattr(module, self._name, None)
            if cls is not None:
                _tf22_positional(cls)


    class _ConvFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname not in _CONV_MODULES:
                return None
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        spec.loader = _ConvLoader(spec.loader, _CONV_MODULES[fullname])
                        return spec
            return None


    sys.meta_path.insert(0, _ConvFinder())


    def concatenate(*args, **kwargs):
        import tensorflow as tf

        return tf.keras.layers.concatenate(*args, **kwargs)


    def Flatten(*args, **kwargs):
        import tensorflow as tf

        return tf.keras.layers.Flatten(*args, **kwargs)


    class _PythonKerasLayersLoader(importlib.abc.Loader):
        def __init__(self, loader):
            self._loader = loader

        def create_module(self, spec):
            return self._loader.create_module(spec) if self._loader else None

        def exec_module(self, module):
            if self._loader:
                self._loader.exec_module(module)
            module.concatenate, module.Flatten = concatenate, Flatten


    class _PythonKerasLayersFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname != "tensorflow.python.keras.layers":
                return None
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        spec.loader = _PythonKerasLayersLoader(spec.loader)
                        return spec
            return importlib.machinery.ModuleSpec(fullname, _PythonKerasLayersLoader(None), is_package=True)


    sys.meta_path.insert(0, _PythonKerasLayersFinder())
    ''')


# --------------------------------------------------------------------------------------------- running
@dataclasses.dataclass
class Result:
    model: str
    config: str
    written_for: str
    why: str
    outcome: str = "FAIL"  # fits, refused, FAIL
    compiled_as: str = ""  # pipeline / weight_streaming (from the report, or the refusal's wording)
    parameters: int | None = None
    parameters_approx: int | None = None  # refused: its float32 weights' bytes / 4
    samples_per_sec: float | None = None
    limiting_bound: str = ""
    memory_bytes: float | None = None  # on the wafer: the placement's layers, or weight streaming's wafer bytes
    sram_bytes: float | None = None  # the fabric's
    memoryx_bytes: float | None = None  # weight streaming: weights + optimizer state off the wafer
    fabric: str = ""
    max_in_flight_samples: int | None = None
    needed_bytes: str = ""  # refusal: as its message says it
    available_bytes: str = ""
    reason: str = ""  # refusal's first line, or the failure
    seconds: float = 0.0  # the child's wall time
    compile_seconds: float | None = None  # the compiler's own (report.txt's "compile time")
    peak_rss_gb: float | None = None
    vocab: str = ""
    batch_size: int | None = None
    log: str = ""
    report_json: str = ""
    published: str = ""


def prepare(config: Config, zoo: Path, work: Path, pythonpath: Sequence[str]) -> tuple[Setup, Path, Params, str]:
    """Write the config's synthetic data and its params yaml (data paths redirected, nothing else changed but
    one input worker and no runconfig model_dir): (setup, params yaml, params, vocabulary note)."""
    setup = Setup(zoo=zoo, model_src=config.run_py.parent, work=work / config.key, pythonpath=list(pythonpath))
    setup.work.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load(config.path.read_text())
    size, note = vocab_size(config, params, zoo)
    if size:
        setup.vocab = size
    for section in INPUT_SECTIONS:
        if isinstance(params.get(section), dict):
            # One input worker (TF_CONFIG is unset for a compile): the zoo's shard_dataset would otherwise shard by
            # TF_CONFIG's workers. The compiled model does not depend on it.
            params[section]["use_multiple_workers"] = False
    (params.get("runconfig") or {}).pop("model_dir", None)
    data_writer(config, zoo)(params, setup)
    path = setup.work / config.name
    path.write_text(f"# {config.path} at its real size, data paths redirected by benchmarks/zoo_configs.py\n"
                    + yaml.safe_dump(params, sort_keys=False))
    return setup, path, params, note


def release_for(release: Release, mode: str) -> Release:
    """The release as a config of `mode` runs: R1.6/R1.7's weight-streaming configs in the weight_streaming
    flavour (the weight-streaming container, where the zoo takes its weight-streaming path), the rest as is."""
    if release.flavour == "container" and mode == "weight_streaming":
        return dataclasses.replace(release, flavour="weight_streaming")
    return release


def compile_args(release: Release, mode: str, params: Path, model_dir: Path) -> list[str]:
    """zoo_runs' compile arguments; R1.8 compiles a config written for weight streaming with
    `CSX weight_streaming`, as its README says to run it."""
    args = release.args("compile", params, model_dir, 0)
    if release.flavour == "appliance" and mode == "weight_streaming":
        args[args.index("pipeline")] = "weight_streaming"
    return args


def run_child(command: Sequence[str], cwd: Path, env: dict[str, str], log: Path, timeout: float,
              ) -> tuple[int | None, float, float]:
    """Run `command` (output to `log`): (exit code or None on timeout, wall seconds, peak RSS in GB of the child
    and the children it waited for, from os.wait4)."""
    start = time.perf_counter()
    with open(log, "a") as out:
        child = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        code: int | None = None
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - start > timeout:
                os.killpg(child.pid, signal.SIGKILL)
                _, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.1)
        child.returncode = code if code is not None else -9  # reaped here: keep Popen from waiting again
    return code, time.perf_counter() - start, usage.ru_maxrss / 1024 ** 2  # ru_maxrss is in KiB on Linux


_SIZE = r"([\d.,]+ ?[KMGTP]?B)\b"
_ESTIMATE = re.compile(r"Estimated ([\d,.]+) samples/s on (\S+) \((?:([^;)]*); )?limited by ([^)]+)\)")
_PARAMS = re.compile(r"; ([\d,]+) parameters")
_COMPILE_TIME = re.compile(r"compile time: ([\d.]+) s")


def parse_refusal(result: Result, text: str) -> None:
    """A FabricCapacityError's first line: needed vs available."""
    line = next((ln for ln in reversed(text.splitlines()) if "[Fabric Capacity]" in ln), "")
    line = line[line.index("[Fabric Capacity]"):].strip()
    result.outcome = "refused"
    result.reason = line
    result.compiled_as = "weight_streaming" if "Weight streaming" in line else "pipeline"
    needed = re.search(r"(?:needs|stash|take) " + _SIZE, line)
    available = re.search(r"(?:has|holds) " + _SIZE, line)
    result.needed_bytes = needed.group(1) if needed else ""
    result.available_bytes = available.group(1) if available else ""
    weights = re.search(r"weights " + _SIZE, line)
    if weights:  # the pipelined refusal's float32 weights: about 4 bytes a parameter
        result.parameters_approx = int(_bytes(weights.group(1)) / 4)


def _bytes(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.,]+) ?([KMGTP]?B)", text.strip()).groups()  # type: ignore[union-attr]
    return float(number.replace(",", "")) * 1000 ** "BKMGTP".index(unit[0] if len(unit) > 1 else "B")


def parse_fit(result: Result, text: str, model_dir: Path) -> None:
    """The compile's estimate (log and report.json) and parameters (report.txt)."""
    result.outcome = "fits"
    match = _ESTIMATE.search(text)
    if match:
        result.samples_per_sec = float(match.group(1).replace(",", ""))
        result.fabric = match.group(2)
        result.compiled_as = "weight_streaming" if "weight streaming" in (match.group(3) or "") else "pipeline"
        result.limiting_bound = match.group(4)
    reports = sorted(model_dir.rglob("report.json"), key=lambda p: ("cs_compile" not in p.parts, str(p)))
    if reports:
        report = json.loads(reports[0].read_text())
        result.report_json = str(reports[0])
        result.samples_per_sec = report.get("estimated_samples_per_sec", result.samples_per_sec)
        result.limiting_bound = report.get("limiting_bound") or result.limiting_bound
        fabric = report.get("fabric") or {}
        result.fabric = fabric.get("name") or result.fabric
        result.sram_bytes = fabric.get("total_sram_bytes") or (
            fabric["num_pes"] * fabric["sram_bytes_per_pe"] if "sram_bytes_per_pe" in fabric else None)
        if report.get("execution_strategy") == "weight_streaming":
            result.compiled_as = "weight_streaming"
            result.memory_bytes = report.get("wafer_bytes")
            result.memoryx_bytes = report.get("memoryx_bytes")
        else:
            result.compiled_as = report.get("execution_strategy") or "pipeline"
            layers = report.get("layers") or []
            result.memory_bytes = float(sum(layer.get("bytes", 0) for layer in layers))
            in_flight = [layer.get("in_flight_samples") for layer in layers if layer.get("in_flight_samples")]
            result.max_in_flight_samples = max(in_flight) if in_flight else None
        text_report = reports[0].parent / "report.txt"
        if text_report.is_file():
            body = text_report.read_text()
            params = _PARAMS.search(body)
            result.parameters = int(params.group(1).replace(",", "")) if params else None
            seconds = _COMPILE_TIME.search(body)
            result.compile_seconds = float(seconds.group(1)) if seconds else None


def run_config(config: Config, release: Release, zoo: Path, work: Path, pythonpath: Sequence[str],
               timeout: float) -> Result:
    params_guess = yaml.safe_load(config.path.read_text())
    mode, why = written_for(config, params_guess)
    result = Result(config.model, config.name, mode, why)
    batch = (params_guess.get("train_input") or {})
    result.batch_size = batch.get("batch_size") or batch.get("train_batch_size")
    try:
        setup, params_path, _, result.vocab = prepare(config, zoo, work, pythonpath)
    except Exception as exc:  # the harness's own failure
        result.reason = f"harness could not prepare the config: {type(exc).__name__}: {exc}"
        return result
    model_dir = setup.work / "model_cs"
    log = setup.work / "compile.log"
    release = release_for(release, mode)
    env, tf_config = zoo_runs.phase_environment(release, "compile", setup)
    command = zoo_runs.csoft_command(release, config.run_py, compile_args(release, mode, params_path, model_dir))
    log.write_text(f"# cwd: {setup.model_src}\n# TF_CONFIG: {tf_config}\n# {' '.join(command)}\n")
    code, result.seconds, result.peak_rss_gb = run_child(command, setup.model_src, env, log, timeout)
    result.log = str(log)
    text = log.read_text(errors="replace")
    if code is None:
        result.reason = f"timed out after {timeout:.0f} s"
    elif code != 0 and "[Fabric Capacity]" in text:
        parse_refusal(result, text)
    elif code != 0:
        result.reason = f"exit {code}: {zoo_runs.failure_reason(text)}"
    else:
        parse_fit(result, text, model_dir)
        if result.samples_per_sec is None:
            result.outcome = "FAIL"
            result.reason = "exit 0 but no estimate in the log and no report.json in the model dir"
    published = PUBLISHED.get(config.name)
    if published and result.samples_per_sec:
        measured, where = published
        result.published = (f"{measured:,.0f} samples/s measured ({where}); the estimate is "
                            f"{result.samples_per_sec / measured:.2f}x that")
    return result


# --------------------------------------------------------------------------------------------- report
def _gb(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:,.0f} MB" if value < 1e9 else f"{value / 1e9:,.1f} GB"


def _params(value: int | None, approximate: bool = False) -> str:
    if value is None:
        return "-"
    return ("~" if approximate else "") + (f"{value / 1e9:.2f}B" if value >= 1e9 else f"{value / 1e6:.0f}M")


def _outcome(result: Result, width: int) -> str:
    if result.outcome == "fits":
        where = f"{_gb(result.memory_bytes)} of {_gb(result.sram_bytes)}"
        if result.memoryx_bytes:
            where += f", MemoryX {_gb(result.memoryx_bytes)}"
        return f"fits: {where}"
    if result.outcome == "refused":
        return f"refused: needs {result.needed_bytes or '?'} of {result.available_bytes or '?'}"
    reason = re.sub(r"^exit \d+: ", "", result.reason)
    reason = re.sub(r"^(\[[^\]]+\] )?(?:\w+\.)+(\w+:)", r"\1\2", reason)
    return "FAIL: " + (reason if len(reason) <= width else reason[: width - 3] + "...")


def _mode(value: str) -> str:
    return {"pipeline": "pipeline", "weight_streaming": "weight streaming"}.get(value, value or "-")


def table(results: Sequence[Result], reason_width: int = 70) -> str:
    header = ["model", "config", "written for", "compiled as", "batch", "outcome", "params", "estimate samples/s",
              "compile s", "peak RSS"]
    rows = []
    for r in results:
        estimate = "-" if r.samples_per_sec is None else f"{r.samples_per_sec:,.0f} ({r.limiting_bound})"
        rows.append([r.model, r.config, _mode(r.written_for), _mode(r.compiled_as) if r.outcome != "FAIL" else "-",
                     str(r.batch_size or "-"), _outcome(r, reason_width),
                     _params(r.parameters) if r.parameters else _params(r.parameters_approx, True), estimate,
                     f"{r.seconds:.0f}", "-" if r.peak_rss_gb is None else f"{r.peak_rss_gb:.1f} GB"])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + " |"

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def summary(results: Sequence[Result]) -> str:
    lines = []
    counts = {k: sum(r.outcome == k for r in results) for k in ("fits", "refused", "FAIL")}
    lines.append(f"{len(results)} configs: {counts['fits']} fit, {counts['refused']} refused, "
                 f"{counts['FAIL']} failed otherwise.")
    for mode in ("pipeline", "weight_streaming"):
        own = [r for r in results if r.written_for == mode]
        if own:
            lines.append(f"  written for {_mode(mode)}: {len(own)}, fit {sum(r.outcome == 'fits' for r in own)}, "
                         f"refused {sum(r.outcome == 'refused' for r in own)}, "
                         f"failed {sum(r.outcome == 'FAIL' for r in own)}")
    timed = [r for r in results if r.peak_rss_gb is not None]
    if timed:
        slowest = max(timed, key=lambda r: r.seconds)
        biggest = max(timed, key=lambda r: r.peak_rss_gb or 0)
        lines.append(f"Longest compile: {slowest.seconds:.0f} s ({slowest.config}); largest peak RSS: "
                     f"{biggest.peak_rss_gb:.1f} GB ({biggest.config}).")
    lines += [f"{r.config}: {r.published}" for r in results if r.published]
    refused = [r for r in results if r.outcome == "refused"]
    if refused:
        lines.append("\nRefusals (first line):")
        lines += [f"- {r.model}/{r.config} [{_mode(r.written_for)}]: {r.reason}" for r in refused]
    failed = [r for r in results if r.outcome == "FAIL"]
    if failed:
        lines.append("\nFailures:")
        lines += [f"- {r.model}/{r.config}: {r.reason}\n    log: {r.log}" for r in failed]
    vocabs = sorted({f"{r.model}: {r.vocab}" for r in results if r.vocab and r.vocab != "none"})
    if vocabs:
        lines.append("\nVocabulary sizes of the synthetic data:")
        lines += [f"- {v}" for v in vocabs]
    return "\n".join(lines)


def project_state() -> str:
    """The project's commit, and the files of cerebras_tf/ and estimator/ changed in the work tree (the runs
    import them from there)."""
    root = zoo_runs.PROJECT

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("log", "-1", "--format=%h %s")[:90] or "unknown commit"
    changed = git("status", "--porcelain", "--", "cerebras_tf", "estimator").splitlines()
    return f"cerebras-tf at {commit}" + (f"; changed in the work tree: {', '.join(c[3:] for c in changed)}"
                                         if changed else "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", required=True, type=Path, help="a Model Zoo checkout (the dir holding modelzoo/)")
    parser.add_argument("--configs", default="*",
                        help="comma-separated globs matched against <model>/<config file> and the file name "
                             "(default: every config)")
    parser.add_argument("--work", type=Path, default=None, help="work dir (default: a fresh temp dir, kept)")
    parser.add_argument("--timeout", type=float, default=COMPILE_TIMEOUT, help="seconds per compile")
    parser.add_argument("--list", action="store_true", help="list the configs found and their mode, and stop")
    parser.add_argument("--tf-compat", action=argparse.BooleanOptionalAction, default=True,
                        help="serve the TF 2.2 module paths and Layer attributes the zoo's code uses (default)")
    args = parser.parse_args(argv)

    zoo = args.zoo.resolve()
    release = zoo_runs.detect_release(zoo)
    globs = [g.strip() for g in args.configs.split(",") if g.strip()]
    configs = [c for c in find_configs(zoo)
               if any(fnmatch.fnmatch(f"{c.model}/{c.name}", g) or fnmatch.fnmatch(c.name, g) for g in globs)]
    if not configs:
        raise SystemExit(f"no TF config matches {args.configs!r} in {zoo}")
    if args.list:
        for c in configs:
            mode, why = written_for(c, yaml.safe_load(c.path.read_text()))
            print(f"{c.model:<45} {c.name:<60} {_mode(mode)} ({why})")
        return 0
    work = (args.work or Path(tempfile.mkdtemp(prefix="zoo_configs_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    state = project_state()
    print(f"zoo {zoo}: {release.name}; {len(configs)} configs; python {sys.version.split()[0]} "
          f"({sys.executable}); work dir {work}\n{state}", flush=True)
    stand_ins = {**REQUIREMENT_STAND_INS, "pandas": PANDAS_STAND_IN}
    pythonpath = zoo_runs.run_pythonpath(work, zoo, args.tf_compat, stand_ins,
                                         zoo_runs.TF_COMPAT_SITECUSTOMIZE + CONV_COMPAT)

    results: list[Result] = []
    started = time.perf_counter()
    for config in configs:
        result = run_config(config, release, zoo, work, pythonpath, args.timeout)
        results.append(result)
        estimate = f"{result.samples_per_sec:,.0f} samples/s" if result.samples_per_sec else ""
        print(f"  {config.model:<40} {config.name:<58} {_mode(result.written_for):<16} "
              f"{_outcome(result, 90)} {estimate} {result.seconds:.0f}s "
              f"{result.peak_rss_gb or 0:.1f}GB", flush=True)
        (work / "results.json").write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    elapsed = time.perf_counter() - started

    report = (f"{release.name}, {zoo}, python {sys.version.split()[0]}, {elapsed:.0f} s; real-size compiles "
              f"(--compile_only), one at a time\n{state}\n\n{table(results)}\n\n{summary(results)}\n")
    (work / "report.md").write_text(report)
    (work / "results.json").write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    print(f"\n{report}\nwork dir (logs, params, data): {work}")
    return 0 if all(r.outcome != "FAIL" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
