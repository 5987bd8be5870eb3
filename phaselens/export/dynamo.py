"""NVIDIA Dynamo: a layout as a ``DynamoGraphDeployment`` (``nvidia.com/v1alpha1``), laid out as
AIConfigurator 0.12.0 writes its generated ``k8s_deploy.yaml``: a ``Frontend`` service and the
vLLM workers (``VllmWorker`` aggregated, or ``VllmPrefillWorker`` + ``VllmDecodeWorker``), each
with its replicas, ``resources.limits.gpu`` = the pool's TP and the engine settings as the
worker's arguments."""

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

API_VERSION = "nvidia.com/v1alpha1"
KIND = "DynamoGraphDeployment"


def dynamo_graph_deployment(spec: ExportSpec) -> dict[str, Any]:
    """The ``DynamoGraphDeployment`` document of ``spec`` (a dict, ready for YAML)."""
    services: dict[str, Any] = {"Frontend": _frontend(spec)}
    for pool in spec.layout.pools:
        service, _ = worker_names(pool)
        worker: dict[str, Any] = {}
        if spec.hf_secret:
            worker["envFromSecret"] = spec.hf_secret
        worker["componentType"] = "worker"
        if pool.role != "mixed":
            worker["subComponentType"] = pool.role
        worker["replicas"] = pool.replicas
        worker["resources"] = {"limits": {"gpu": str(pool.tp)}, "requests": {"gpu": str(pool.tp)}}
        worker["sharedMemory"] = {"size": SHARED_MEMORY}
        worker["extraPodSpec"] = _pod(
            spec,
            {
                "image": spec.image,
                "workingDir": "/workspace/examples/backends/vllm",
                "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-m", "dynamo.vllm"],
                "args": engine_args(spec, pool),
            },
        )
        services[service] = worker
    metadata: dict[str, Any] = {"name": spec.name}
    if spec.namespace:
        metadata["namespace"] = spec.namespace
    metadata["labels"] = {"app.kubernetes.io/managed-by": "phaselens"}
    metadata["annotations"] = dict(spec.annotations)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"backendFramework": "vllm", "services": services},
    }


def _frontend(spec: ExportSpec) -> dict[str, Any]:
    frontend: dict[str, Any] = {}
    if spec.hf_secret:
        frontend["envFromSecret"] = spec.hf_secret
    frontend["componentType"] = "frontend"
    frontend["replicas"] = 1
    frontend["extraPodSpec"] = _pod(
        spec,
        {
            "image": spec.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["python3", "-m", "dynamo.frontend"],
            "args": ["--http-port", str(FRONTEND_PORT)],
        },
    )
    return frontend


def _pod(spec: ExportSpec, main_container: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = {}
    if selector := node_selector(spec):
        pod["nodeSelector"] = selector
    pod["mainContainer"] = main_container
    return pod
