"""Model Zoo conformance runs: the zoo's own TF models, unchanged and shrunk, through the phases a user runs.

For each Model Zoo TF model (fc_mnist, BERT pre-training and its four
fine-tuning tasks, GPT-2, GPT-3, GPT-J, T5, Transformer, Linformer) this
harness takes the model's own `run.py` and its own yaml config from a Model
Zoo checkout, shrinks the config (2 layers, hidden 64, 2 heads, sequences of
32, batch 4, a vocabulary of 256), writes a small deterministic synthetic data
set in the on-disk format the model's own data processor reads (TFRecords,
text files, vocabulary and label files, or TFDS arrays), and runs the script
through `python -m cerebras_tf.csoft` in a subprocess (cwd: the script's
directory), phase after phase:

  cpu_train  train N steps on CPU (plain TensorFlow / the Estimator)
  validate   CS-system checks and kernel matching (--validate_only)
  compile    a full compile for the WSE (--compile_only)
  cs_train   train N steps on the simulated CS system; passes only if the log
             says it trained there and a checkpoint at step N exists
  cpu_eval   evaluate the checkpoint cs_train wrote, on CPU (2 steps); passes
             if the log has the Estimator's "Saving dict for global step" line

A phase is skipped when the phase it builds on (compile on validate, cs_train
on compile, cpu_eval on cs_train) failed. A failure's reason is the last
exception in its log, tagged with whose code raised it (the innermost frame:
[cerebras_tf], [estimator], [zoo], [tensorflow], ...).

The release decides the command line: R1.8 scripts are the appliance flavour
(`run.py CPU ...` / `run.py CSX pipeline ...`), R1.6/R1.7 scripts the container
flavour (`run.py ... --cs_ip localhost`; the zoo appends ":9000" itself). A
container CS training run gets TF_CONFIG = a lone chief (the container's
launcher set it; the zoo's run.py does not, and the CS system requires it);
every other phase runs with TF_CONFIG unset.

The environment of the runs, as a zoo user's would be (the zoo's files are
only read, never copied or changed):
  - the checkout on PYTHONPATH;
  - stand-ins for the zoo's requirements that are not installed here
    (tensorflow_datasets serving the synthetic data, for the models that load
    from TFDS; nltk.ngrams, keras_preprocessing.text, tqdm; spacy, which only
    the zoo's offline preprocessing uses);
  - with --tf-compat (the default), a sitecustomize serving the TF 2.2 module
    paths the zoo's common code imports and letting its BaseLayer assign
    Keras Layer attributes that became read-only (see TF_COMPAT_SITECUSTOMIZE);
    --no-tf-compat shows how the zoo fares against this TensorFlow as it is;
  - for the CPU phases, the config changed as the zoo's READMEs say for CPU/GPU
    runs (use_vsl False, no buckets); every input section has
    use_multiple_workers False (a single input worker).

It prints one row per model and one column per phase (ok / FAIL + reason, and
seconds), and writes report.md and results.json into the work directory, which
is kept: per model the shrunk params yamls, the synthetic data, the model dirs
and one log per phase.

    .venv-3.11/bin/python -m benchmarks.zoo_runs --zoo /tmp/zoo/Release_1.8.0
    .venv-3.11/bin/python -m benchmarks.zoo_runs --zoo /tmp/zoo/R_1.7.1 --models bert,gpt2 --phases cpu_train,cs_train

It is not part of the test suite (it needs a zoo checkout and takes about
half a minute per model).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import yaml

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # this process imports TensorFlow to write TFRecords

# --------------------------------------------------------------------------------------------- sizes
LAYERS = 2
HIDDEN = 64
HEADS = 2
FILTER = 128
SEQ = 32  # every sequence length
POSITIONS = 64  # max_position_embeddings (>= SEQ)
MAX_PREDICTIONS = 5  # masked LM predictions per sequence
MAX_CLS = 4  # extractive summarization's CLS tokens per sequence
BATCH = 4
VOCAB = 256
EXTRA_IDS = 8  # T5's sentinel tokens
TRAIN_EXAMPLES = 64
EVAL_EXAMPLES = 32
EVAL_STEPS = 2
SEED = 20240611
PHASE_TIMEOUT = 600  # seconds

PHASES = ("cpu_train", "validate", "compile", "cs_train", "cpu_eval")
# A phase is skipped when the phase it needs ran in this invocation and did not pass.
DEPENDS_ON = {"compile": "validate", "cs_train": "compile", "cpu_eval": "cs_train"}
LONE_CHIEF = json.dumps({"cluster": {"chief": ["localhost:2222"]}, "task": {"type": "chief", "index": 0}})

# cerebras_tf's log lines that say a run used the simulated system (cs_estimator._announce_system, run/chief.py).
SIMULATED_RUN = re.compile(r"Training on the simulated CS system|Trained steps \d+-\d+ in .* on the simulated WSE")
EVAL_MARKER = "Saving dict for global step"


# --------------------------------------------------------------------------------------------- model table
@dataclasses.dataclass
class Setup:
    """Where one model's run reads and writes."""

    zoo: Path  # the checkout (holds modelzoo/)
    model_src: Path  # the zoo directory holding the model's run.py (the subprocesses' cwd)
    work: Path  # this model's work directory
    pythonpath: list[str] = dataclasses.field(default_factory=list)  # stand-in packages for the subprocesses
    vocab: int = VOCAB  # the vocabulary size the synthetic data and vocabulary files are written at

    @property
    def data(self) -> Path:
        return self.work / "data"


Params = dict[str, Any]
Shrink = Callable[[Params, Setup], None]
DataWriter = Callable[[Params, Setup], None]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """run.py (relative to modelzoo/), its config (first of the names found in configs/ next to run.py),
    how to shrink the config, and the function writing the synthetic data (it points the params at it)."""

    run_py: str
    configs: tuple[str, ...]
    shrink: Shrink
    data: DataWriter


INPUT_SECTIONS = ("train_input", "eval_input", "predict_input")

# model-section keys the zoo's models read for their sizes, and the shrunk value (only keys the yaml has)
MODEL_SIZES: dict[str, Any] = {
    "num_hidden_layers": LAYERS,
    "encoder_num_hidden_layers": LAYERS,
    "decoder_num_hidden_layers": LAYERS,
    "hidden_size": HIDDEN,
    "d_model": HIDDEN,
    "embedding_size": HIDDEN,
    "d_kv": HIDDEN // HEADS,  # T5: d_kv * num_heads = d_model
    "filter_size": FILTER,
    "d_ff": FILTER,
    "num_heads": HEADS,
    "max_position_embeddings": POSITIONS,
    "vocab_size": VOCAB,
    "rotary_dim": HIDDEN // HEADS // 2,  # GPT-J: rotary part of each head
    "projected_dims": SEQ // 2,  # Linformer: projected sequence length
}
# input-section keys, shrunk to at most this value
INPUT_LIMITS: dict[str, int] = {
    "batch_size": BATCH,
    "max_sequence_length": SEQ,
    "src_max_sequence_length": SEQ,
    "tgt_max_sequence_length": SEQ,
    "max_predictions_per_seq": MAX_PREDICTIONS,
    "max_cls_tokens": MAX_CLS,
    "shuffle_buffer": 4 * TRAIN_EXAMPLES,
}
# input-section keys set to this value
INPUT_SIZES: dict[str, Any] = {"vocab_size": VOCAB, "extra_ids": EXTRA_IDS}


def shrink_common(params: Params, steps: int) -> None:
    """Shrink every size key the config has (model and input sections) and set a short runconfig."""
    model = params.get("model", {})
    for key, value in MODEL_SIZES.items():
        if key in model:
            model[key] = value
    for section in INPUT_SECTIONS:
        inputs = params.get(section)
        if not isinstance(inputs, dict):
            continue
        longest = inputs.get("max_sequence_length") or inputs.get("src_max_sequence_length")
        buckets = inputs.get("buckets")
        if isinstance(buckets, list) and longest:  # boundaries between VSL buckets: scale them to SEQ
            scaled = sorted({int(b * SEQ / longest) for b in buckets})
            inputs["buckets"] = [b for b in scaled if 0 < b < SEQ] or 1
        for key, limit in INPUT_LIMITS.items():
            if isinstance(inputs.get(key), int):
                inputs[key] = min(inputs[key], limit)
        for key, value in INPUT_SIZES.items():
            if key in inputs:
                inputs[key] = value
        # One input worker (a lone chief): the zoo's shard_dataset would otherwise shard by TF_CONFIG's workers,
        # and its docstring advises False for a single worker.
        inputs["use_multiple_workers"] = False
    runconfig = params.setdefault("runconfig", {})
    runconfig.update(
        max_steps=steps,
        eval_steps=EVAL_STEPS,
        save_checkpoints_steps=max(100, steps + 1),  # >= 100 is a CS rule; the last step checkpoints anyway
        save_summary_steps=max(1, steps // 2),
        keep_checkpoint_max=2,
        log_step_count_steps=1,
    )
    runconfig.pop("model_dir", None)


def cpu_params(params: Params) -> Params:
    """The config for the CPU phases, changed as the zoo's READMEs say for CPU/GPU runs: no VSL
    (`model.use_vsl: False`) and no bucketing (`buckets` left out)."""
    cpu = yaml.safe_load(yaml.safe_dump(params))
    if "use_vsl" in cpu.get("model", {}):
        cpu["model"]["use_vsl"] = False
    for section in INPUT_SECTIONS:
        if isinstance(cpu.get(section), dict):
            cpu[section].pop("buckets", None)
    return cpu


def shrink_sizes(params: Params, setup: Setup) -> None:
    """Models whose sizes are all in the common key tables (the language models)."""
    del setup


def shrink_fc_mnist(params: Params, setup: Setup) -> None:
    del setup
    params["model"]["hidden_sizes"] = [32, 16]


def shrink_fine_tuning(params: Params, setup: Setup) -> None:
    """BERT fine-tuning: the model section comes from the pre-training yaml `pretrain_params_path` names
    (relative to the model's directory): shrink a copy of it in the work dir and point there."""
    model = params["model"]
    path = model.get("pretrain_params_path")
    if not path:
        return
    source = (setup.model_src / path).resolve()
    pretrain = yaml.safe_load(source.read_text())
    shrink_common(pretrain, params["runconfig"]["max_steps"])
    target = setup.work / f"pretrain_{source.name}"
    target.write_text(yaml.safe_dump(pretrain, sort_keys=False))
    model["pretrain_params_path"] = str(target)


# --------------------------------------------------------------------------------------------- data helpers
WORDPIECE_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(5)
FIRST_WORD = len(WORDPIECE_SPECIAL)


def _words(count: int) -> list[str]:
    return [f"w{i}" for i in range(count)]


def _write_lines(path: Path, lines: Iterable[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def write_wordpiece_vocab(setup: Setup) -> Path:
    """A BERT (WordPiece) vocabulary of setup.vocab lines: the special tokens, then words w0, w1, ..."""
    return _write_lines(setup.data / "vocab.txt", WORDPIECE_SPECIAL + _words(setup.vocab - len(WORDPIECE_SPECIAL)))


def _feature(values: Sequence[Any]) -> Any:
    import tensorflow as tf

    if len(values) and isinstance(values[0], (bytes, str)):
        raw = [v.encode() if isinstance(v, str) else v for v in values]
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=raw))
    if len(values) and isinstance(values[0], (float, np.floating)):
        return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def _example(features: dict[str, Sequence[Any]]) -> bytes:
    import tensorflow as tf

    example = tf.train.Example(features=tf.train.Features(feature={k: _feature(v) for k, v in features.items()}))
    return example.SerializeToString()


def _write_records(path: Path, records: Iterable[bytes]) -> Path:
    import tensorflow as tf

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return path


def _write_record_dir(directory: Path, records: list[bytes], shards: int = 2) -> Path:
    """`records` in `shards` files `part-<i>.tfrecord` (the zoo's processors read `<data_dir>/*.tfrecord*`)."""
    for shard in range(shards):
        _write_records(directory / f"part-{shard}.tfrecord", records[shard::shards])
    return directory


def _keep_shape(old: Any, path: Path) -> Any:
    """The new data dir in the shape the yaml had it (a list of dirs stays a list)."""
    return [str(path)] if isinstance(old, list) else str(path)


def _pad(values: list[int], length: int, value: int = 0) -> list[int]:
    return values + [value] * (length - len(values))


def _splits(params: Params) -> list[tuple[str, str, int]]:
    """(section, split name, example count) of the input sections the config has."""
    out = [("train_input", "train", TRAIN_EXAMPLES), ("eval_input", "eval", EVAL_EXAMPLES)]
    if "predict_input" in params:
        out.append(("predict_input", "predict", EVAL_EXAMPLES))
    return [entry for entry in out if entry[0] in params]


def _masked_lm(rng: np.random.Generator, ids: list[int], candidates: list[int], count: int,
               ) -> tuple[list[int], list[int], list[int], list[float]]:
    """Mask `count` of the candidate positions of `ids`: (masked ids, positions, labels, weights), padded."""
    positions = sorted(int(p) for p in rng.choice(candidates, size=min(count, len(candidates)), replace=False))
    labels = [ids[p] for p in positions]
    masked = list(ids)
    for p in positions:
        masked[p] = MASK_ID
    weights = [1.0] * len(positions)
    return masked, positions, labels, weights


# --------------------------------------------------------------------------------------------- data formats
def bert_nsp_tfrecords(params: Params, setup: Setup) -> None:
    """BertTfRecordsProcessor (bert/input/utils.parse_raw_tfrecord): MLM + NSP examples, input_mask 1 on
    tokens (the processor inverts it), in `<data_dir>/*.tfrecord*`."""
    vocab = write_wordpiece_vocab(setup)
    rng = np.random.default_rng(SEED)
    for section, split, count in _splits(params):
        inputs = params[section]
        msl, max_pred = inputs["max_sequence_length"], inputs["max_predictions_per_seq"]
        records = []
        for _ in range(count):
            length = int(rng.integers(msl // 2, msl + 1))
            first = int(rng.integers(1, length - 3))
            words = rng.integers(FIRST_WORD, setup.vocab, size=length).tolist()
            ids = [CLS_ID] + words[: first] + [SEP_ID] + words[first: length - 3] + [SEP_ID]
            segments = [0] * (first + 2) + [1] * (length - first - 2)
            candidates = [i for i, t in enumerate(ids) if t not in (CLS_ID, SEP_ID)]
            masked, positions, labels, weights = _masked_lm(rng, ids, candidates, int(rng.integers(1, max_pred + 1)))
            records.append(_example({
                "input_ids": _pad(masked, msl), "input_mask": _pad([1] * length, msl),
                "segment_ids": _pad(segments, msl),
                "masked_lm_positions": _pad(positions, max_pred), "masked_lm_ids": _pad(labels, max_pred),
                "masked_lm_weights": weights + [0.0] * (max_pred - len(weights)),
                "next_sentence_labels": [int(rng.integers(0, 2))],
            }))
        inputs["data_dir"] = _keep_shape(inputs.get("data_dir"), _write_record_dir(setup.data / split, records))
        inputs["vocab_file"] = str(vocab)


def gpt_tfrecords(params: Params, setup: Setup) -> None:
    """GptTfRecordsProcessor: input_ids, input_mask (1 on tokens), labels (the next token), all [msl]."""
    rng = np.random.default_rng(SEED)
    for section, split, count in _splits(params):
        inputs = params[section]
        msl, vocab = inputs["max_sequence_length"], inputs.get("vocab_size", VOCAB)
        records = []
        for _ in range(count):
            length = int(rng.integers(msl // 2, msl + 1))
            tokens = rng.integers(1, vocab, size=length + 1).tolist()
            records.append(_example({
                "input_ids": _pad(tokens[:-1], msl), "input_mask": _pad([1] * length, msl),
                "labels": _pad(tokens[1:], msl),
            }))
        inputs["data_dir"] = _keep_shape(inputs.get("data_dir"), _write_record_dir(setup.data / split, records))


def mlm_only_token_tfrecords(params: Params, setup: Setup) -> None:
    """BertMlmOnlyTfRecordsDynamicMaskProcessor (Linformer): tf.train.SequenceExample with a feature list
    `tokens` (the word strings, [CLS] ... [SEP]); the processor masks them on the fly."""
    import tensorflow as tf

    vocab = write_wordpiece_vocab(setup)
    words = _words(setup.vocab - len(WORDPIECE_SPECIAL))
    rng = np.random.default_rng(SEED)
    for section, split, count in _splits(params):
        inputs = params[section]
        msl = inputs["max_sequence_length"]
        records = []
        for _ in range(count):
            length = int(rng.integers(msl // 2, msl - 1))
            tokens = ["[CLS]"] + [words[i] for i in rng.integers(0, len(words), size=length)] + ["[SEP]"]
            feature_list = tf.train.FeatureList(feature=[_feature([t]) for t in tokens])
            example = tf.train.SequenceExample(
                feature_lists=tf.train.FeatureLists(feature_list={"tokens": feature_list}))
            records.append(example.SerializeToString())
        inputs["data_dir"] = _keep_shape(inputs.get("data_dir"), _write_record_dir(setup.data / split, records))
        inputs["vocab_file"] = str(vocab)


def t5_text(params: Params, setup: Setup) -> None:
    """T5DynamicDataProcessor: `<data_dir>/*.txt`, one document of space-separated vocabulary tokens a line,
    and a vocabulary file (<pad>, </s>, <unk>, <s>, words; the extra_ids sentinels come after it)."""
    specials = ["<pad>", "</s>", "<unk>", "<s>"]
    words = _words(setup.vocab - len(specials))
    vocab = _write_lines(setup.data / "vocab.txt", specials + words)
    rng = np.random.default_rng(SEED)
    for section, split, count in _splits(params):
        inputs = params[section]
        documents = [" ".join(words[i] for i in rng.integers(0, len(words), size=int(rng.integers(40, 90))))
                     for _ in range(count)]
        directory = setup.data / split
        _write_lines(directory / "part-0.txt", documents[0::2])
        _write_lines(directory / "part-1.txt", documents[1::2])
        inputs["data_dir"] = str(directory)
        inputs["vocab_file"] = str(vocab)


def transformer_text(params: Params, setup: Setup) -> None:
    """TransformerDynamicDataProcessor: line-aligned source and target files (the yaml's src/tgt_data_dir are
    file globs) of space-separated tokens, and source and target vocabularies with <pad>, <unk>, <s>, </s> at
    the same ids."""
    specials = ["<pad>", "<unk>", "<s>", "</s>"]
    words = _words(setup.vocab - len(specials))
    src_vocab = _write_lines(setup.data / "vocab.src", specials + words)
    tgt_vocab = _write_lines(setup.data / "vocab.tgt", specials + words)
    rng = np.random.default_rng(SEED)
    for section, split, count in _splits(params):
        inputs = params[section]
        longest = min(inputs["src_max_sequence_length"], inputs["tgt_max_sequence_length"]) - 2

        def sentence(longest: int) -> str:
            return " ".join(words[i] for i in rng.integers(0, len(words), size=int(rng.integers(3, longest + 1))))

        pairs = [(sentence(longest), sentence(longest)) for _ in range(count)]
        inputs["src_data_dir"] = str(_write_lines(setup.data / f"{split}.src", [s for s, _ in pairs]))
        inputs["tgt_data_dir"] = str(_write_lines(setup.data / f"{split}.tgt", [t for _, t in pairs]))
        inputs["src_vocab_file"] = str(src_vocab)
        inputs["tgt_vocab_file"] = str(tgt_vocab)


def squad_tfrecords(params: Params, setup: Setup) -> None:
    """QuestionAnsweringDataProcessor: one TFRecord file (`data_file`) of input_ids, input_mask (1 on
    tokens), segment_ids, start_positions and end_positions ([1]); prediction records carry unique_ids."""
    vocab = write_wordpiece_vocab(setup)
    rng = np.random.default_rng(SEED)
    for section, split, count in _splits(params):
        inputs = params[section]
        msl = inputs.get("max_sequence_length") or params["eval_input"]["max_sequence_length"]
        records = []
        for index in range(count):
            length = int(rng.integers(msl // 2, msl + 1))
            question = int(rng.integers(3, length // 2))
            ids = [CLS_ID] + rng.integers(FIRST_WORD, setup.vocab, size=length - 1).tolist()
            ids[question] = SEP_ID
            ids[length - 1] = SEP_ID
            start = int(rng.integers(question + 1, length - 1))
            end = int(rng.integers(start, length - 1))
            features: dict[str, Sequence[Any]] = {
                "input_ids": _pad(ids, msl), "input_mask": _pad([1] * length, msl),
                "segment_ids": _pad([0] * (question + 1) + [1] * (length - question - 1), msl),
            }
            if split == "predict":
                features["unique_ids"] = [1000 + index]
            else:
                features["start_positions"], features["end_positions"] = [start], [end]
            records.append(_example(features))
        inputs["data_file"] = str(_write_records(setup.data / f"{split}.tf_record", records))
        inputs["vocab_file"] = str(vocab)


NER_LABELS = ["O", "B-Chemical", "I-Chemical", "X", "[CLS]", "[SEP]", "[PAD]"]


def ner_tfrecords(params: Params, setup: Setup) -> None:
    """NerDataProcessor: `<data_dir>/*.tfrecord*` of input_ids, input_mask (1 on tokens), segment_ids and
    label_ids ([msl]), and the label vocabulary (label2id.json, as the zoo's NER preprocessing writes it)."""
    vocab = write_wordpiece_vocab(setup)
    label_ids = {label: index for index, label in enumerate(NER_LABELS)}
    labels_file = setup.data / "label2id.json"
    labels_file.parent.mkdir(parents=True, exist_ok=True)
    labels_file.write_text(json.dumps(label_ids))
    rng = np.random.default_rng(SEED)
    for section, split, count in _splits(params):
        inputs = params[section]
        msl = inputs.get("max_sequence_length") or params["eval_input"]["max_sequence_length"]
        records = []
        for _ in range(count):
            length = int(rng.integers(msl // 2, msl + 1))
            ids = [CLS_ID] + rng.integers(FIRST_WORD, setup.vocab, size=length - 2).tolist() + [SEP_ID]
            labels = ([label_ids["[CLS]"]] + rng.integers(0, 4, size=length - 2).tolist() + [label_ids["[SEP]"]])
            records.append(_example({
                "input_ids": _pad(ids, msl), "input_mask": _pad([1] * length, msl),
                "segment_ids": [0] * msl, "label_ids": _pad(labels, msl, label_ids["[PAD]"]),
            }))
        inputs["data_dir"] = str(_write_record_dir(setup.data / split, records))
        inputs["vocab_file"] = str(vocab)
        inputs["label_vocab_file"] = str(labels_file)


def bertsum_tfrecords(params: Params, setup: Setup) -> None:
    """BertSumTfRecordsProcessor: `<data_dir>/*.tfrecord*` of input_ids, input_mask (1 on padding, as the
    zoo's BertFormatter writes it; the processor does not invert it), segment_ids (alternating per
    sentence), cls_indices, labels and cls_weights ([max_cls_tokens])."""
    vocab = write_wordpiece_vocab(setup)
    rng = np.random.default_rng(SEED)
    for section, split, count in _splits(params):
        inputs = params[section]
        msl = inputs.get("max_sequence_length") or params["eval_input"]["max_sequence_length"]
        max_cls = inputs.get("max_cls_tokens") or params["eval_input"]["max_cls_tokens"]
        records = []
        for _ in range(count):
            sentences = int(rng.integers(2, max_cls + 1))
            ids: list[int] = []
            segments: list[int] = []
            cls_indices: list[int] = []
            for sentence in range(sentences):
                size = int(rng.integers(3, msl // max_cls - 1))
                cls_indices.append(len(ids))
                ids += [CLS_ID] + rng.integers(FIRST_WORD, setup.vocab, size=size).tolist() + [SEP_ID]
                segments += [sentence % 2] * (size + 2)
            labels = rng.integers(0, 2, size=sentences).tolist()
            records.append(_example({
                "input_ids": _pad(ids, msl), "input_mask": [0] * len(ids) + [1] * (msl - len(ids)),
                "segment_ids": _pad(segments, msl), "cls_indices": _pad(cls_indices, max_cls),
                "labels": _pad(labels, max_cls),
                "cls_weights": [1.0] * sentences + [0.0] * (max_cls - sentences),
            }))
        inputs["data_dir"] = str(_write_record_dir(setup.data / split, records))
        inputs["vocab_file"] = str(vocab)


# Stand-ins for the Model Zoo's third-party requirements that are not installed here (the zoo's
# requirements_cb_tf.txt), written only where the package does not import: {package: {file: source}}.
# tensorflow_datasets serves the synthetic data a model's data function saved (the real one downloads).
TFDS_STAND_IN = {"__init__.py": textwrap.dedent('''\
    """Stand-in for tensorflow_datasets, written by benchmarks/zoo_runs.py: load() serves the synthetic
    splits saved in <data_dir>/<name>.npz (keys <split>__<feature>); nothing is downloaded."""
    import os
    import types

    import numpy as np
    import tensorflow as tf


    def load(name, split=None, data_dir=None, with_info=False, as_dataset_kwargs=None, **kwargs):
        path = os.path.join(data_dir or ".", name.replace("/", "__") + ".npz")
        if not os.path.exists(path):
            raise FileNotFoundError(f"tensorflow_datasets stand-in: no synthetic data for {name!r} at {path}")
        arrays = np.load(path)
        features = {}
        for key in arrays.files:
            split_name, feature = key.split("__", 1)
            features.setdefault(split_name, {})[feature] = arrays[key]
        datasets = {s: tf.data.Dataset.from_tensor_slices(f) for s, f in features.items()}
        sizes = {s: len(next(iter(f.values()))) for s, f in features.items()}
        info = types.SimpleNamespace(
            name=name, splits={s: types.SimpleNamespace(num_examples=n) for s, n in sizes.items()})
        result = datasets if split is None else datasets[split]
        return (result, info) if with_info else result
    ''')}
# The zoo imports these at module level; training and evaluation use nltk.ngrams (ROUGE metrics),
# keras_preprocessing.text (tokenizers) and tqdm; spacy only in offline preprocessing.
REQUIREMENT_STAND_INS: dict[str, dict[str, str]] = {
    "spacy": {"__init__.py": textwrap.dedent('''\
        """Stand-in for spaCy, written by benchmarks/zoo_runs.py: only the zoo's offline preprocessing uses it."""


        def load(name, *args, **kwargs):
            raise ImportError(f"spacy.load({name!r}): spaCy is not installed (zoo_runs.py stand-in)")
        ''')},
    "nltk": {"__init__.py": textwrap.dedent('''\
        """Stand-in for nltk, written by benchmarks/zoo_runs.py: ngrams() only."""


        def ngrams(sequence, n, **kwargs):
            items = list(sequence)
            return zip(*(items[i:] for i in range(n)))
        ''')},
    "tqdm": {"__init__.py": textwrap.dedent('''\
        """Stand-in for tqdm, written by benchmarks/zoo_runs.py: iterates without a progress bar."""


        class tqdm:
            def __init__(self, iterable=None, *args, **kwargs):
                self.iterable = iterable

            def __iter__(self):
                return iter(self.iterable if self.iterable is not None else ())

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def update(self, *args, **kwargs):
                pass

            def set_description(self, *args, **kwargs):
                pass

            def close(self):
                pass
        ''')},
    "keras_preprocessing": {
        "__init__.py": '"""Stand-in for Keras-Preprocessing, written by benchmarks/zoo_runs.py."""\n',
        "text.py": textwrap.dedent('''\
            """Keras-Preprocessing's text module, as TensorFlow's Keras (or tf_keras) carries it."""
            try:
                from tensorflow.keras.preprocessing.text import Tokenizer, text_to_word_sequence  # noqa: F401
            except ImportError:
                from tf_keras.preprocessing.text import Tokenizer, text_to_word_sequence  # noqa: F401
            '''),
    },
}


# The zoo was written for TensorFlow 2.2: its common code imports TF 2.2 module paths that later TensorFlow
# removed, and its BaseLayer assigns Keras Layer attributes that became read-only properties. With --tf-compat
# (the default) every run gets this sitecustomize on its PYTHONPATH: it serves those module paths as aliases of
# their current equivalents and gives the three Layer properties setters that accept the value the layer
# already has. The zoo's files are not touched; --no-tf-compat runs them against TensorFlow as it is.
TF_COMPAT_SITECUSTOMIZE = textwrap.dedent('''\
    """TensorFlow 2.2 compatibility for the Model Zoo's runs, written by benchmarks/zoo_runs.py (see there)."""
    import importlib.abc
    import importlib.machinery
    import sys


    def _keras_experimental(module):
        """tensorflow.keras.mixed_precision.experimental: Policy(name, loss_scale=...), set_policy."""
        import tensorflow as tf

        mixed_precision = tf.keras.mixed_precision

        class Policy(mixed_precision.Policy):
            def __init__(self, name, loss_scale=None):
                super().__init__(name)

        module.Policy = Policy
        module.set_policy = mixed_precision.set_global_policy
        module.global_policy = mixed_precision.global_policy
        module.LossScaleOptimizer = mixed_precision.LossScaleOptimizer
        for parent in (sys.modules.get("tensorflow.keras.mixed_precision"), mixed_precision):
            if parent is not None:
                parent.experimental = module


    def _package(module):
        module.__path__ = []


    def _python_keras_loss_scale_optimizer(module):
        """tensorflow.python.keras.mixed_precision.experimental.loss_scale_optimizer.LossScaleOptimizer."""
        try:
            from tensorflow.python.keras.mixed_precision.loss_scale_optimizer import LossScaleOptimizer
        except ImportError:
            import tensorflow as tf

            LossScaleOptimizer = tf.keras.mixed_precision.LossScaleOptimizer
        module.LossScaleOptimizer = LossScaleOptimizer


    _ALIASES = {
        "tensorflow.keras.mixed_precision.experimental": _keras_experimental,
        "tensorflow.python.keras.mixed_precision.experimental": _package,
        "tensorflow.python.keras.mixed_precision.experimental.loss_scale_optimizer":
            _python_keras_loss_scale_optimizer,
    }
    _LAYER_MODULES = tuple(f"{keras}.src.engine.{name}" for keras in ("keras", "tf_keras")
                           for name in ("base_layer", "base_layer_v1"))


    def _settable(cls, name):
        """Give a read-only Layer property a setter that accepts the value it already has."""
        prop = cls.__dict__.get(name)
        if not isinstance(prop, property) or prop.fset is not None:
            return

        def fset(self, value, _name=name, _get=prop.fget):
            current = _get(self)
            if value is not current and str(getattr(value, "name", value)) != str(getattr(current, "name", current)):
                raise AttributeError(f"zoo_runs TF compat: cannot change {_name} from {current} to {value}")

        setattr(cls, name, property(prop.fget, fset, prop.fdel, prop.__doc__))


    class _AliasLoader(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            _ALIASES[module.__name__](module)


    class _LayerLoader(importlib.abc.Loader):
        def __init__(self, loader):
            self._loader = loader

        def create_module(self, spec):
            return self._loader.create_module(spec)

        def exec_module(self, module):
            self._loader.exec_module(module)
            layer = getattr(module, "Layer", None)
            for name in ("dtype_policy", "variable_dtype", "compute_dtype"):
                if layer is not None:
                    _settable(layer, name)


    class _Finder(importlib.abc.MetaPathFinder):
        def _installed(self, fullname, path, target):
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        return spec
            return None

        def find_spec(self, fullname, path=None, target=None):
            if fullname in _LAYER_MODULES:
                spec = self._installed(fullname, path, target)
                if spec is not None:
                    spec.loader = _LayerLoader(spec.loader)
                return spec
            if fullname in _ALIASES and self._installed(fullname, path, target) is None:
                return importlib.machinery.ModuleSpec(fullname, _AliasLoader(),
                                                      is_package=fullname.endswith(".experimental"))
            return None


    sys.meta_path.insert(0, _Finder())
    ''')


def write_stand_ins(directory: Path, packages: dict[str, dict[str, str]]) -> list[str]:
    """Write the stand-in packages that do not import in this interpreter into `directory`; their names."""
    written = []
    for name, files in packages.items():
        if importlib.util.find_spec(name) is not None:
            continue
        for file, source in files.items():
            (directory / name).mkdir(parents=True, exist_ok=True)
            (directory / name / file).write_text(source)
        written.append(name)
    return written


def _tfds_stand_in(setup: Setup, name: str, splits: dict[str, dict[str, np.ndarray]]) -> Path:
    """Write the tensorflow_datasets stand-in (on this model's subprocesses' PYTHONPATH) and the data it serves."""
    stand_ins = setup.work / "stand_ins"
    if write_stand_ins(stand_ins, {"tensorflow_datasets": TFDS_STAND_IN}):
        setup.pythonpath.append(str(stand_ins))
    directory = setup.data / "tfds"
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {f"{split}__{feature}": value for split, features in splits.items() for feature, value in features.items()}
    np.savez(directory / (name.replace("/", "__") + ".npz"), **arrays)  # type: ignore[arg-type]
    return directory


def mnist_tfds(params: Params, setup: Setup) -> None:
    """fc_mnist: tfds.load("mnist", data_dir=..., with_info=True): train/test splits of image (uint8
    [28, 28, 1]) and label (int64), and info.splits["train"].num_examples."""
    rng = np.random.default_rng(SEED)

    def split(count: int) -> dict[str, np.ndarray]:
        return {"image": rng.integers(0, 256, size=(count, 28, 28, 1), dtype=np.uint8),
                "label": rng.integers(0, 10, size=count).astype(np.int64)}

    directory = _tfds_stand_in(setup, "mnist", {"train": split(TRAIN_EXAMPLES), "test": split(EVAL_EXAMPLES)})
    params["train_input"]["data_dir"] = str(directory)


def glue_sst2_tfds(params: Params, setup: Setup) -> None:
    """BERT classifier (Sst2DataProcessor): tfds.load("glue/sst2", data_dir=...): train/validation/test splits
    of sentence (text of vocabulary words), label (int64) and idx (int32); and the WordPiece vocabulary."""
    vocab = write_wordpiece_vocab(setup)
    words = _words(setup.vocab - len(WORDPIECE_SPECIAL))
    rng = np.random.default_rng(SEED)

    def split(count: int) -> dict[str, np.ndarray]:
        sentences = [" ".join(words[i] for i in rng.integers(0, len(words), size=int(rng.integers(4, SEQ))))
                     for _ in range(count)]
        return {"sentence": np.array(sentences), "label": rng.integers(0, 2, size=count).astype(np.int64),
                "idx": np.arange(count, dtype=np.int32)}

    directory = _tfds_stand_in(setup, "glue/sst2", {
        "train": split(TRAIN_EXAMPLES), "validation": split(EVAL_EXAMPLES), "test": split(EVAL_EXAMPLES)})
    for section, _, _ in _splits(params):
        params[section]["data_dir"] = str(directory)
        params[section]["vocab_file"] = str(vocab)


BERT_FT = "transformers/tf/bert/fine_tuning"
MODELS: dict[str, ModelSpec] = {
    "fc_mnist": ModelSpec("fc_mnist/tf/run.py", ("params.yaml",), shrink_fc_mnist, mnist_tfds),
    "bert": ModelSpec("transformers/tf/bert/run.py", ("params_bert_base_msl128.yaml",), shrink_sizes,
                      bert_nsp_tfrecords),
    "gpt2": ModelSpec("transformers/tf/gpt2/run.py", ("params_gpt2_small.yaml",), shrink_sizes, gpt_tfrecords),
    "gpt3": ModelSpec("transformers/tf/gpt3/run.py", ("params_gpt3_xl.yaml", "params_gpt3_xl_ws.yaml"),
                      shrink_sizes, gpt_tfrecords),
    "gptj": ModelSpec("transformers/tf/gptj/run.py", ("params_gptj_6B.yaml", "params_gptj.yaml"), shrink_sizes,
                      gpt_tfrecords),
    "t5": ModelSpec("transformers/tf/t5/run.py", ("params_small.yaml",), shrink_sizes, t5_text),
    "transformer": ModelSpec("transformers/tf/transformer/run.py", ("params_base.yaml",), shrink_sizes,
                             transformer_text),
    "linformer": ModelSpec("transformers/tf/linformer/run.py",
                           ("params_linformer_roberta_base_msl512_proj256_shared_kv.yaml",), shrink_sizes,
                           mlm_only_token_tfrecords),
    "bert_classifier": ModelSpec(f"{BERT_FT}/classifier/run.py", ("params_bert_base_sst2.yaml",),
                                 shrink_fine_tuning, glue_sst2_tfds),
    "bert_qa": ModelSpec(f"{BERT_FT}/qa/run.py", ("params_bert_base_squad.yaml",), shrink_fine_tuning,
                         squad_tfrecords),
    "bert_token_classifier": ModelSpec(f"{BERT_FT}/token_classifier/run.py",
                                       ("params_bert_base_ner_bc5cdr-chem.yaml",), shrink_fine_tuning, ner_tfrecords),
    "bert_extractive_summarization": ModelSpec(f"{BERT_FT}/extractive_summarization/run.py",
                                               ("params_bertsum_base.yaml",), shrink_fine_tuning, bertsum_tfrecords),
}


# --------------------------------------------------------------------------------------------- releases
@dataclasses.dataclass(frozen=True)
class Release:
    name: str
    flavour: str  # cerebras_tf.csoft flavour
    csx: tuple[str, ...] = ("pipeline",)  # R1.8's CSX arguments (--weight-streaming: weight_streaming --num_csx N)

    def args(self, phase: str, params: Path, model_dir: Path, steps: int) -> list[str]:
        """The run.py arguments of `phase` (the flags of R1.8's cli_parser, or of R1.6/R1.7's run.py)."""
        common = ["--params", str(params), "--model_dir", str(model_dir)]
        if self.flavour == "appliance":
            csx = ["CSX", *self.csx, "--mode", "train", *common]  # pipeline: some models list weight_streaming first
            return {
                "cpu_train": ["CPU", "--mode", "train", *common, "--max_steps", str(steps)],
                "validate": [*csx, "--validate_only"],
                "compile": [*csx, "--compile_only"],
                "cs_train": [*csx, "--max_steps", str(steps)],
                "cpu_eval": ["CPU", "--mode", "eval", *common, "--eval_steps", str(EVAL_STEPS)],
            }[phase]
        cs = ["--cs_ip", "localhost"]  # the zoo's update_params_from_args appends ":9000"
        return {
            "cpu_train": ["--mode", "train", *common, "--max_steps", str(steps)],
            "validate": ["--mode", "train", *common, *cs, "--validate_only"],
            "compile": ["--mode", "train", *common, *cs, "--compile_only"],
            "cs_train": ["--mode", "train", *common, *cs, "--max_steps", str(steps)],
            "cpu_eval": ["--mode", "eval", *common, "--eval_steps", str(EVAL_STEPS)],
        }[phase]

    def tf_config(self, phase: str) -> str | None:
        """TF_CONFIG for the phase: a lone chief for a container CS training run (see the module docstring)."""
        return LONE_CHIEF if self.flavour in ("container", "weight_streaming") and phase == "cs_train" else None


def detect_release(zoo: Path) -> Release:
    """R1.8 when common/tf/appliance_utils.py exists and the tf run.py files call run_appliance."""
    modelzoo = zoo / "modelzoo"
    if not modelzoo.is_dir():
        raise SystemExit(f"--zoo {zoo}: no modelzoo/ directory there")
    scripts = [modelzoo / spec.run_py for spec in MODELS.values() if (modelzoo / spec.run_py).is_file()]
    calls = any("run_appliance(" in script.read_text() for script in scripts)
    if (modelzoo / "common/tf/appliance_utils.py").is_file() and calls:
        return Release("R1.8 (appliance flow: run.py {CPU,CSX pipeline})", "appliance")
    return Release("R1.6/R1.7 (container flow: run.py --cs_ip)", "container")


# --------------------------------------------------------------------------------------------- running
@dataclasses.dataclass
class Outcome:
    status: str  # ok, FAIL, skipped
    seconds: float = 0.0
    reason: str = ""
    log: str = ""


_EXCEPTION_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b.*")
_FRAME_LINE = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
PROJECT = Path(__file__).resolve().parent.parent


def frame_origin(path: str) -> str:
    """Whose code a traceback frame is in: cerebras_tf, the project's estimator, the zoo, TF, Keras, ..."""
    if path.startswith(str(PROJECT / "cerebras_tf")):
        return "cerebras_tf"
    if path.startswith(str(PROJECT / "estimator")):
        return "estimator"
    if "/modelzoo/" in path:
        return "zoo"
    if path.endswith("sitecustomize.py"):
        return "harness tf_compat"
    for library in ("tensorflow_estimator", "tensorflow", "tf_keras", "keras", "numpy", "google/protobuf"):
        if f"/{library}/" in path:
            return library
    return "python" if path.startswith("<frozen") else "other"


def failure_reason(log_text: str) -> str:
    """The last exception line of a log (an uncaught exception's `Type: message`, tagged with whose code raised
    it: the innermost frame of the last traceback), else its last line."""
    lines = [line.rstrip() for line in log_text.splitlines() if line.strip()]
    last_traceback = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call")),
                         default=None)
    origin = ""
    if last_traceback is not None:
        frames = [m for m in map(_FRAME_LINE.match, lines[last_traceback:]) if m]
        if frames:
            origin = f"[{frame_origin(frames[-1].group(1))}] "
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return origin + line.strip()
    return origin + (lines[-1].strip() if lines else "(empty log)")


def check_phase(phase: str, log_text: str, model_dir: Path, steps: int) -> str:
    """What a phase that exited 0 still lacks ('' when it passed)."""
    if phase == "cs_train":
        if not SIMULATED_RUN.search(log_text):
            return "exit 0 but the log never says it ran on the simulated CS system"
        if not (model_dir / f"model.ckpt-{steps}.index").exists():
            return f"exit 0 but no checkpoint model.ckpt-{steps} in {model_dir}"
    if phase == "cpu_eval":
        if EVAL_MARKER not in log_text and not any(model_dir.glob("eval*")):
            return f"exit 0 but no '{EVAL_MARKER}' line and no eval dir in {model_dir}"
    return ""


def phase_environment(release: Release, phase: str, setup: Setup) -> tuple[dict[str, str], str | None]:
    """The subprocess environment of `phase` (the stand-ins on PYTHONPATH, TF_CONFIG as the release needs it)
    and its TF_CONFIG."""
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1")  # no __pycache__ in the zoo checkout
    env["PYTHONPATH"] = os.pathsep.join(setup.pythonpath + [p for p in [env.get("PYTHONPATH")] if p])
    tf_config = release.tf_config(phase)
    if tf_config:
        env["TF_CONFIG"] = tf_config
    return env, tf_config


def csoft_command(release: Release, run_py: Path, args: Sequence[str]) -> list[str]:
    """`python -m cerebras_tf.csoft <flavour> run.py args...` with this interpreter."""
    return [sys.executable, "-m", "cerebras_tf.csoft", release.flavour, str(run_py), *args]


def run_phase(release: Release, phase: str, run_py: Path, setup: Setup, params: dict[str, Path], steps: int,
              ) -> Outcome:
    model_dir = setup.work / ("model_cpu" if phase == "cpu_train" else "model_cs")
    log = setup.work / f"{phase}.log"
    env, tf_config = phase_environment(release, phase, setup)
    command = csoft_command(release, run_py, release.args(
        phase, params["cpu" if phase.startswith("cpu") else "cs"], model_dir, steps))
    start = time.perf_counter()
    with open(log, "w") as out:
        out.write(f"# cwd: {setup.model_src}\n# TF_CONFIG: {tf_config}\n# {' '.join(command)}\n")
        out.flush()
        try:
            code = subprocess.run(command, cwd=setup.model_src, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=PHASE_TIMEOUT).returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = time.perf_counter() - start
    text = log.read_text(errors="replace")
    if code is None:
        return Outcome("FAIL", seconds, f"timed out after {PHASE_TIMEOUT} s", str(log))
    if code != 0:
        return Outcome("FAIL", seconds, f"exit {code}: {failure_reason(text)}", str(log))
    missing = check_phase(phase, text, model_dir, steps)
    return Outcome("FAIL" if missing else "ok", seconds, missing, str(log))


def prepare(key: str, spec: ModelSpec, zoo: Path, work: Path, steps: int, pythonpath: Sequence[str],
            ) -> tuple[Setup, Path, dict[str, Path]]:
    """Shrink the model's config and write its data: (setup, run.py, the shrunk params yamls: "cs" for the
    CS-system phases, "cpu" for the CPU ones)."""
    run_py = zoo / "modelzoo" / spec.run_py
    setup = Setup(zoo=zoo, model_src=run_py.parent, work=work / key, pythonpath=list(pythonpath))
    setup.work.mkdir(parents=True, exist_ok=True)
    configs = run_py.parent / "configs"
    config = next((configs / name for name in spec.configs if (configs / name).is_file()), None)
    if config is None:
        raise FileNotFoundError(f"none of {', '.join(spec.configs)} in {configs}")
    params = yaml.safe_load(config.read_text())
    shrink_common(params, steps)
    spec.shrink(params, setup)
    spec.data(params, setup)
    written = {}
    for target, values in (("cs", params), ("cpu", cpu_params(params))):
        path = setup.work / (config.name if target == "cs" else f"{config.stem}_cpu{config.suffix}")
        path.write_text(f"# {config} shrunk by benchmarks/zoo_runs.py for the {target} phases\n"
                        + yaml.safe_dump(values, sort_keys=False))
        written[target] = path
    return setup, run_py, written


def run_model(key: str, release: Release, zoo: Path, work: Path, phases: Sequence[str], steps: int,
              pythonpath: Sequence[str]) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    try:
        setup, run_py, params = prepare(key, MODELS[key], zoo, work, steps, pythonpath)
    except Exception as exc:  # the harness's own failure: every phase is skipped, with the reason
        reason = f"harness could not prepare the model: {type(exc).__name__}: {exc}"
        return {phase: Outcome("FAIL" if i == 0 else "skipped", reason=reason if i == 0 else "")
                for i, phase in enumerate(phases)}
    for phase in phases:
        needed = DEPENDS_ON.get(phase)
        if needed in outcomes and outcomes[needed].status != "ok":
            outcomes[phase] = Outcome("skipped", reason=f"{needed} did not pass")
            continue
        outcome = run_phase(release, phase, run_py, setup, params, steps)
        outcomes[phase] = outcome
        print(f"  {key:<30} {phase:<10} {outcome.status:<5} {outcome.seconds:6.1f}s {outcome.reason[:100]}",
              flush=True)
    return outcomes


# --------------------------------------------------------------------------------------------- report
def _cell(outcome: Outcome | None, width: int) -> str:
    if outcome is None:
        return "-"
    if outcome.status == "ok":
        return f"ok {outcome.seconds:.0f}s"
    if outcome.status == "skipped":
        return "skipped"
    reason = re.sub(r"^exit \d+: ", "", outcome.reason)
    reason = re.sub(r"^(\[[^\]]+\] )?(?:\w+\.)+(\w+:)", r"\1\2", reason)  # errors_impl.X: -> X:
    reason = reason if len(reason) <= width else reason[: width - 3] + "..."
    return f"FAIL {outcome.seconds:.0f}s: {reason}"


def table(results: dict[str, dict[str, Outcome]], phases: Sequence[str], reason_width: int = 80) -> str:
    header = ["model", *phases, "total s"]
    rows = [[key, *(_cell(outcomes.get(p), reason_width) for p in phases),
             f"{sum(o.seconds for o in outcomes.values()):.0f}"] for key, outcomes in results.items()]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + " |"

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def failures(results: dict[str, dict[str, Outcome]]) -> str:
    lines = [f"- {key} / {phase}: {outcome.reason}\n    log: {outcome.log}"
             for key, outcomes in results.items() for phase, outcome in outcomes.items()
             if outcome.status == "FAIL"]
    return "\n".join(lines)


def _list_arg(value: str, allowed: Sequence[str], what: str) -> list[str]:
    chosen = [item.strip() for item in value.split(",") if item.strip()]
    unknown = [item for item in chosen if item not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return chosen


def run_pythonpath(work: Path, zoo: Path, tf_compat: bool,
                   stand_ins: dict[str, dict[str, str]] = REQUIREMENT_STAND_INS,
                   compat_source: str = TF_COMPAT_SITECUSTOMIZE) -> list[str]:
    """The runs' PYTHONPATH: the TF compatibility sitecustomize (`compat_source`, with tf_compat), the
    stand-ins for the zoo's requirements not installed here (written into the work dir) and the checkout."""
    pythonpath: list[str] = []
    if tf_compat:
        compat = work / "tf_compat"
        compat.mkdir(exist_ok=True)
        (compat / "sitecustomize.py").write_text(compat_source)
        pythonpath.append(str(compat))
        print(f"TF 2.2 compatibility for the zoo's code: {compat}/sitecustomize.py (--no-tf-compat to leave it out)")
    directory = work / "stand_ins"
    written = write_stand_ins(directory, stand_ins)
    if written:
        print(f"stand-ins for the zoo's requirements not installed here: {', '.join(written)} ({directory})")
        pythonpath.append(str(directory))
    # The checkout on PYTHONPATH, as in a zoo user's environment: most run.py files add it to sys.path
    # themselves, R1.7's gpt3/run.py imports modelzoo without doing so.
    pythonpath.append(str(zoo))
    return pythonpath


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", required=True, type=Path, help="a Model Zoo checkout (the dir holding modelzoo/)")
    parser.add_argument("--models", default=",".join(MODELS),
                        type=lambda v: _list_arg(v, list(MODELS), "model"), help="comma-separated (default: all)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        type=lambda v: _list_arg(v, PHASES, "phase"), help="comma-separated (default: all)")
    parser.add_argument("--work", type=Path, default=None, help="work dir (default: a fresh temp dir, kept)")
    parser.add_argument("--steps", type=int, default=4, help="training steps (default 4)")
    parser.add_argument("--keep-going", action=argparse.BooleanOptionalAction, default=True,
                        help="run the other models after a failure (default); --no-keep-going stops at the first")
    parser.add_argument("--weight-streaming", type=int, default=0, metavar="NUM_CSX",
                        help="R1.8: run the CSX phases as `CSX weight_streaming --num_csx NUM_CSX` (default: pipeline)")
    parser.add_argument("--tf-compat", action=argparse.BooleanOptionalAction, default=True,
                        help="serve the TF 2.2 module paths and Layer attributes the zoo's code uses (default)")
    args = parser.parse_args(argv)

    zoo = args.zoo.resolve()
    release = detect_release(zoo)
    if args.weight_streaming:
        if release.flavour != "appliance":
            parser.error("--weight-streaming is R1.8's CSX weight_streaming (an appliance-flow checkout)")
        release = dataclasses.replace(release, name=f"{release.name}, CSX weight_streaming x{args.weight_streaming}",
                                      csx=("weight_streaming", "--num_csx", str(args.weight_streaming)))
    phases = [phase for phase in PHASES if phase in args.phases]  # always in pipeline order
    work = (args.work or Path(tempfile.mkdtemp(prefix="zoo_runs_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"zoo {zoo}: {release.name}; python {sys.version.split()[0]} ({sys.executable}); work dir {work}",
          flush=True)
    pythonpath = run_pythonpath(work, zoo, args.tf_compat)

    results: dict[str, dict[str, Outcome]] = {}
    started = time.perf_counter()
    for key in args.models:
        results[key] = run_model(key, release, zoo, work, phases, args.steps, pythonpath)
        if not args.keep_going and any(o.status == "FAIL" for o in results[key].values()):
            break
    elapsed = time.perf_counter() - started

    report = f"{release.name}, {zoo}, python {sys.version.split()[0]}, {elapsed:.0f} s\n\n{table(results, phases)}\n"
    failed = failures(results)
    if failed:
        report += f"\nFailures:\n{failed}\n"
    (work / "report.md").write_text(report)
    (work / "results.json").write_text(json.dumps(
        {key: {phase: dataclasses.asdict(o) for phase, o in outcomes.items()} for key, outcomes in results.items()},
        indent=1))
    print(f"\n{report}\nwork dir (logs, params, data): {work}")
    return 0 if all(o.status != "FAIL" for outcomes in results.values() for o in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
