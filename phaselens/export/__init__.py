"""Export a serving layout to cluster manifests: NVIDIA Dynamo's ``DynamoGraphDeployment``
(:mod:`phaselens.export.dynamo`) and NVIDIA Grove's ``PodCliqueSet``
(:mod:`phaselens.export.grove`), from a layout string or a stored recommendation
(:mod:`phaselens.export.common`), checked against a CRD's schema by :mod:`phaselens.export.crd`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from phaselens.export.common import ExportError, ExportSpec, export_spec, spec_from_recommendation
from phaselens.export.dynamo import dynamo_graph_deployment
from phaselens.export.grove import pod_clique_set

FORMATS: dict[str, Callable[[ExportSpec], dict[str, Any]]] = {
    "dynamo": dynamo_graph_deployment,
    "grove": pod_clique_set,
}

__all__ = [
    "FORMATS",
    "ExportError",
    "ExportSpec",
    "export_document",
    "export_spec",
    "spec_from_recommendation",
    "to_yaml",
]


def export_document(spec: ExportSpec, fmt: str) -> dict[str, Any]:
    """The manifest of ``spec`` in format ``fmt`` (``dynamo`` or ``grove``)."""
    try:
        return FORMATS[fmt](spec)
    except KeyError:
        raise ExportError(f"format {fmt!r} is not one of: {', '.join(FORMATS)}") from None


class _K8sDumper(yaml.SafeDumper):
    """Quotes the YAML 1.1 booleans PyYAML leaves bare (y, n), which Kubernetes would read as bool."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if data in ("y", "Y", "n", "N"):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_K8sDumper.add_representer(str, _str)


def to_yaml(doc: dict[str, Any], comment: str = "") -> str:
    """``doc`` as YAML (keys in the order written), after ``comment`` lines (``# ...``)."""
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + yaml.dump(doc, Dumper=_K8sDumper, sort_keys=False, default_flow_style=False, width=120)
