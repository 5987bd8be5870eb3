"""Check a manifest against a Kubernetes CustomResourceDefinition's published schema, as the API
server would with strict field validation (``kubectl apply --validate=strict``).

The CRD's ``openAPIV3Schema`` of the document's version is checked with jsonschema after two
changes that make it say what the API server enforces: an object schema with ``properties`` and
neither ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields`` refuses unknown
fields (the server prunes or, strictly, rejects them; plain JSON Schema would let a misspelt
field through), ``x-kubernetes-int-or-string`` admits an integer or a string, and ``nullable``
admits null. Not checked: the CEL rules of ``x-kubernetes-validations`` (the API server evaluates
them; the published DGD and PodCliqueSet CRDs have 3 and 7, none on a field the exports set
except ``sharedMemory``, whose rule, no ``size`` when ``disabled``, they keep) and the
``format`` of strings and integers.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from phaselens.export.common import ExportError


def load_crd(path: str | Path) -> dict[str, Any]:
    """The CustomResourceDefinition in the YAML file at ``path`` (the first one of a stream)."""
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: a 0.9 MB CRD in 0.3 s, not 3 s
        docs = list(yaml.load_all(Path(path).read_text(encoding="utf-8"), Loader=loader))
    except (OSError, yaml.YAMLError) as e:
        raise ExportError(f"CRD {path}: cannot read it as YAML ({e})") from e
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
            return doc
    raise ExportError(f"CRD {path}: no CustomResourceDefinition in it")


def crd_schema(crd: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``version`` (default: the storage version), made strict."""
    versions = crd.get("spec", {}).get("versions", [])
    chosen = next(
        (v for v in versions if (v.get("name") == version if version else v.get("storage"))),
        None,
    )
    if chosen is None:
        names = ", ".join(str(v.get("name")) for v in versions)
        raise ExportError(
            f"CRD {crd.get('metadata', {}).get('name')}: no version {version!r}; it has {names}"
        )
    return strict_schema(chosen["schema"]["openAPIV3Schema"])


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of a structural schema that refuses unknown fields and knows int-or-string."""
    out = copy.deepcopy(schema)
    _strict(out)
    return out


def _strict(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _strict(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and isinstance(node.get("type"), str):
        node["type"] = [node["type"], "null"]
    if (
        node.get("type") in ("object", ["object", "null"])
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        node["additionalProperties"] = False
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            for prop in value.values():
                _strict(prop)
        elif key != "enum" and key != "default" and key != "example":
            _strict(value)


def validation_errors(doc: dict[str, Any], crd: dict[str, Any]) -> list[str]:
    """What is wrong with ``doc`` as an instance of ``crd`` ("path: message" each; empty if none):
    its ``apiVersion`` and ``kind`` name the CRD's group, a served version and its kind, and the
    document fits that version's schema."""
    spec = crd.get("spec", {})
    group, kind = spec.get("group"), spec.get("names", {}).get("kind")
    api_version = str(doc.get("apiVersion", ""))
    doc_group, _, version = api_version.rpartition("/")
    errors: list[str] = []
    if doc.get("kind") != kind:
        errors.append(f"kind: {doc.get('kind')!r} is not {kind!r}")
    served = [v.get("name") for v in spec.get("versions", []) if v.get("served")]
    if doc_group != group or version not in served:
        errors.append(f"apiVersion: {api_version!r} is not {group}/ one of {served}")
        return errors
    validator = jsonschema.Draft7Validator(crd_schema(crd, version))
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in error.absolute_path) or "(document)"
        errors.append(f"{where}: {error.message[:300]}")
    name = str(doc.get("metadata", {}).get("name", ""))
    if not name:
        errors.append("metadata.name: missing")
    return errors


def validate(doc: dict[str, Any], crd: dict[str, Any]) -> None:
    """Raise ExportError listing what is wrong with ``doc`` as an instance of ``crd``."""
    errors = validation_errors(doc, crd)
    if errors:
        shown = "; ".join(errors[:10]) + (f"; and {len(errors) - 10} more" if len(errors) > 10 else "")
        raise ExportError(f"{doc.get('kind')} {doc.get('metadata', {}).get('name')} fails its CRD: {shown}")
