"""NVIDIA Grove: a layout as a ``PodCliqueSet`` (``grove.io/v1alpha1``), the gang-scheduled unit
Dynamo's operator runs a graph on when Grove is installed: one clique per role (``frontend``,
``worker`` aggregated, or ``prefill`` + ``decode``), each pod one engine on TP GPUs
(``nvidia.com/gpu`` requests and limits), the engine settings as the container's arguments.

Every worker clique has ``minAvailable: 1``: the gang is placed only when at least one frontend,
one prefill and one decode pod fit at once (a prefill pool without decode serves nothing), while
the other replicas may come up as room frees. The Dynamo platform's own wiring (discovery, the
KV-transfer agents' networking) is what Dynamo's operator adds to the pods it makes; this
document is the layout at Grove's level.
"""

from __future__ import annotations

from typing import Any

from phaselens.export.common import (
    FRONTEND_PORT,
    SHARED_MEMORY,
    ExportSpec,
    engine_args,
    node_selector,
    worker_names,
)

API_VERSION = "grove.io/v1alpha1"
KIND = "PodCliqueSet"


def pod_clique_set(spec: ExportSpec) -> dict[str, Any]:
    """The ``PodCliqueSet`` document of ``spec`` (a dict, ready for YAML)."""
    cliques = [
        _clique(
            "frontend",
            1,
            _container(
                spec, "frontend", ["python3", "-m", "dynamo.frontend"], ["--http-port", str(FRONTEND_PORT)]
            ),
            spec,
            gpus=0,
        )
    ]
    for pool in spec.layout.pools:
        _, clique = worker_names(pool)
        container = _container(spec, "main", ["python3", "-m", "dynamo.vllm"], engine_args(spec, pool))
        container["workingDir"] = "/workspace/examples/backends/vllm"
        container["resources"] = {
            "requests": {"nvidia.com/gpu": str(pool.tp)},
            "limits": {"nvidia.com/gpu": str(pool.tp)},
        }
        container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
        cliques.append(_clique(clique, pool.replicas, container, spec, gpus=pool.tp))
    metadata: dict[str, Any] = {"name": spec.name}
    if spec.namespace:
        metadata["namespace"] = spec.namespace
    metadata["labels"] = {"app.kubernetes.io/managed-by": "phaselens"}
    metadata["annotations"] = dict(spec.annotations)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "replicas": 1,
            "template": {"cliqueStartupType": "CliqueStartupTypeAnyOrder", "cliques": cliques},
        },
    }


def _container(spec: ExportSpec, name: str, command: list[str], args: list[str]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "args": args,
    }
    if spec.hf_secret:
        container["envFrom"] = [{"secretRef": {"name": spec.hf_secret}}]
    return container


def _clique(
    name: str, replicas: int, container: dict[str, Any], spec: ExportSpec, *, gpus: int
) -> dict[str, Any]:
    pod: dict[str, Any] = {"containers": [container]}
    if gpus:
        if selector := node_selector(spec):
            pod["nodeSelector"] = selector
        pod["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHARED_MEMORY}}]
    return {
        "name": name,
        "labels": {"app.kubernetes.io/component": name},
        "spec": {"roleName": name, "replicas": replicas, "minAvailable": 1, "podSpec": pod},
    }
