"""TF_CONFIG: which task of which cluster this process is, as RunConfig reports it.

Kept apart from RunConfig so distributed training (train_and_evaluate's
chief/worker/evaluator roles) can grow here without touching the config's
plain settings. The rules and messages are tf.estimator's: a cluster has one
chief (or one legacy `master`), the task names its type and index, an
evaluator runs outside the cluster, and a single-node cluster runs in
process (master '').
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import tensorflow as tf

TF_CONFIG_ENV = "TF_CONFIG"
LOCAL_MASTER = ""
_GRPC = "grpc://"


class TaskType:
    MASTER = "master"
    PS = "ps"
    WORKER = "worker"
    CHIEF = "chief"
    EVALUATOR = "evaluator"


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
    """This process's place in the cluster (RunConfig's cluster properties)."""

    cluster_spec: Any  # tf.train.ClusterSpec, empty when there is no cluster
    task_type: str | None
    task_id: int
    master: str
    evaluation_master: str
    num_ps_replicas: int
    num_worker_replicas: int
    global_id_in_cluster: int | None
    is_chief: bool
    service: dict[str, Any] | None


def read_tf_config(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """TF_CONFIG parsed from the environment ({} when unset)."""
    tf_config = json.loads(environ.get(TF_CONFIG_ENV) or "{}")
    if tf_config:
        tf.compat.v1.logging.info("TF_CONFIG environment variable: %s", tf_config)
    return tf_config


def model_dir_from(tf_config: Mapping[str, Any], model_dir: str | None) -> str | None:
    """RunConfig's model_dir: the argument, else TF_CONFIG's; both given must agree."""
    if model_dir == "":
        raise ValueError("model_dir should be non-empty.")
    from_config = tf_config.get("model_dir")
    if from_config == "":
        raise ValueError("model_dir in TF_CONFIG should be non-empty.")
    if from_config:
        if model_dir and model_dir != from_config:
            raise ValueError(
                "`model_dir` provided in RunConfig construct, if set, must have the same value as the model_dir in "
                f"TF_CONFIG. model_dir: {model_dir}\nTF_CONFIG[\"model_dir\"]: {from_config}.\n")
        tf.compat.v1.logging.info("Using model_dir in TF_CONFIG: %s", from_config)
    return model_dir or from_config


def cluster_settings(tf_config: Mapping[str, Any]) -> ClusterSettings:
    """Where this task sits, from a parsed TF_CONFIG."""
    service = tf_config.get("service")
    if service is not None and not isinstance(service, dict):
        raise TypeError(f'If "service" is set in TF_CONFIG, it must be a dict. Given {type(service)}')
    spec = tf.train.ClusterSpec(tf_config.get("cluster", {}))
    task = tf_config.get("task", {})
    if not spec:
        return _no_cluster(tf_config, task, spec, service)
    chief = TaskType.MASTER if TaskType.MASTER in spec.jobs else TaskType.CHIEF
    if chief == TaskType.MASTER and TaskType.CHIEF in spec.jobs:
        raise ValueError("If `master` node exists in `cluster`, job `chief` is not supported.")
    task_type, task_id = _task_in_cluster(spec, task, chief)
    if task_type == TaskType.EVALUATOR:
        if chief == TaskType.MASTER:
            raise ValueError("If `master` node exists in `cluster`, task_type `evaluator` is not supported.")
        return ClusterSettings(tf.train.ClusterSpec({}), task_type, task_id, LOCAL_MASTER,
                               tf_config.get("eval_session_master", LOCAL_MASTER), 0, 0, None, False, service)
    jobs = spec.as_dict()
    return ClusterSettings(
        cluster_spec=spec,
        task_type=task_type,
        task_id=task_id,
        master=_session_master(spec, task_type, task_id, tf_config),
        evaluation_master=LOCAL_MASTER,
        num_ps_replicas=len(jobs.get(TaskType.PS, [])),
        num_worker_replicas=len(jobs.get(TaskType.WORKER, [])) + len(jobs.get(chief, [])),
        global_id_in_cluster=_global_id(spec, task_type, task_id, chief),
        is_chief=task_type == chief,
        service=service,
    )


def _no_cluster(tf_config: Mapping[str, Any], task: Mapping[str, Any], spec: Any,
                service: dict[str, Any] | None) -> ClusterSettings:
    task_type = task.get("type", TaskType.WORKER)
    task_id = int(task.get("index", 0))
    if task_type != TaskType.WORKER:
        raise ValueError('If "cluster" is not set in TF_CONFIG, task type must be WORKER.')
    if task_id != 0:
        raise ValueError('If "cluster" is not set in TF_CONFIG, task index must be 0.')
    return ClusterSettings(spec, task_type, task_id, tf_config.get("session_master", LOCAL_MASTER),
                           tf_config.get("eval_session_master", LOCAL_MASTER), 0, 1, 0, True, service)


def _task_in_cluster(spec: Any, task: Mapping[str, Any], chief: str) -> tuple[str, int]:
    if chief not in spec.jobs:
        raise ValueError(f'If "cluster" is set in TF_CONFIG, it must have one "{chief}" node.')
    if len(spec.job_tasks(chief)) > 1:
        raise ValueError(f'The "cluster" in TF_CONFIG must have only one "{chief}" node.')
    task_type, task_id = task.get("type"), task.get("index")
    if not task_type:
        raise ValueError('If "cluster" is set in TF_CONFIG, task type must be set.')
    if task_id is None:
        raise ValueError('If "cluster" is set in TF_CONFIG, task index must be set.')
    task_id = int(task_id)
    if task_id < 0:
        raise ValueError("Task index must be non-negative number.")
    if task_type == TaskType.EVALUATOR:
        return task_type, task_id
    note = "\n\nNote that these values may be coming from the TF_CONFIG environment variable."
    if task_type not in spec.jobs:
        raise ValueError(f"{task_type} is not a valid task_type in the cluster_spec:\n{spec}{note}")
    if not 0 <= task_id < len(spec.job_tasks(task_type)):
        raise ValueError(f"{task_id} is not a valid task_id for task_type {task_type} in the cluster_spec:\n"
                         f"{spec}{note}")
    return task_type, task_id


def _session_master(spec: Any, task_type: str, task_id: int, tf_config: Mapping[str, Any]) -> str:
    """TF_CONFIG's session_master, else '' for a one-task cluster, else this task's grpc address."""
    if "session_master" in tf_config:
        return tf_config["session_master"]
    if len(spec.jobs) == 1 and len(spec.job_tasks(spec.jobs[0])) == 1:
        return LOCAL_MASTER
    return _GRPC + spec.job_tasks(task_type)[task_id]


def _global_id(spec: Any, task_type: str, task_id: int, chief: str) -> int:
    """Index among all tasks: the chief first, then other jobs by name, parameter servers last."""
    order = [chief] + [job for job in sorted(spec.jobs) if job not in (chief, TaskType.PS)]
    if TaskType.PS in spec.jobs:
        order.append(TaskType.PS)
    first = 0
    for job in order:
        if job == task_type:
            return first + task_id
        first += len(spec.job_tasks(job))
    raise RuntimeError(f"Internal Error: `task_type` ({task_type}) is not in cluster_spec ({spec}).")
