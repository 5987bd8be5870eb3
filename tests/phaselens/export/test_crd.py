"""The manifests against the published CRD schemas (the files: tests/data/crds/README.md), and the
validator against a small CRD written here, so it is shown to refuse what the API server refuses
whether or not the published files are at hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from phaselens.export import ExportError, export_document, export_spec
from phaselens.export.crd import crd_schema, load_crd, validate, validation_errors
from tests.phaselens.export.test_export import LAYOUTS

# A CRD of the same structure as the published ones (written for this test).
TOY_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "names": {"kind": "Widget", "plural": "widgets"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            "spec": {
                                "type": "object",
                                "required": ["parts"],
                                "properties": {
                                    "mode": {"type": "string", "enum": ["a", "b"]},
                                    "size": {"x-kubernetes-int-or-string": True},
                                    "note": {"type": "string", "nullable": True},
                                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                    "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                            "properties": {"known": {"type": "integer"}}},
                                    "parts": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["name"],
                                            "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}  # fmt: skip


def _widget(**spec: object) -> dict:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}


def test_the_validator_refuses_what_the_api_server_refuses() -> None:
    good = _widget(
        mode="a", size="10Gi", labels={"x": "y"}, raw={"known": 1, "anything": [1]}, parts=[{"name": "p"}]
    )
    assert validation_errors(good, TOY_CRD) == []
    assert validation_errors(_widget(size=3, note=None, parts=[]), TOY_CRD) == []
    cases = {
        "spec.parts.0: Additional properties are not allowed ('cuont' was unexpected)": _widget(
            parts=[{"name": "p", "cuont": 2}]
        ),
        "spec.parts.0.count: 'two' is not of type 'integer'": _widget(parts=[{"name": "p", "count": "two"}]),
        "spec: 'parts' is a required property": _widget(mode="a"),
        "spec.mode: 'c' is not one of ['a', 'b']": _widget(mode="c", parts=[]),
        "spec.labels.x: 1 is not of type 'string'": _widget(labels={"x": 1}, parts=[]),
        "spec.size: [1] is not valid under any of the given schemas": _widget(size=[1], parts=[]),
        "spec.note: 5 is not of type 'string', 'null'": _widget(note=5, parts=[]),
    }
    for message, doc in cases.items():
        assert validation_errors(doc, TOY_CRD) == [message]
    assert validation_errors({**good, "apiVersion": "example.com/v2"}, TOY_CRD) == [
        "apiVersion: 'example.com/v2' is not example.com/ one of ['v1']"
    ]
    assert "kind: 'Gadget' is not 'Widget'" in validation_errors({**good, "kind": "Gadget"}, TOY_CRD)
    with pytest.raises(ExportError, match="Widget w fails its CRD: spec: 'parts' is a required property"):
        validate(_widget(), TOY_CRD)
    with pytest.raises(ExportError, match="no version 'v9'; it has v1"):
        crd_schema(TOY_CRD, "v9")


def test_a_file_without_a_crd_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("kind: ConfigMap\n")
    with pytest.raises(ExportError, match="no CustomResourceDefinition in it"):
        load_crd(tmp_path / "x.yaml")
    with pytest.raises(ExportError, match="cannot read it as YAML"):
        load_crd(tmp_path / "missing.yaml")


def test_the_published_grove_example_validates(pcs_crd: dict, grove_example: Path) -> None:
    docs = [d for d in yaml.safe_load_all(grove_example.read_text()) if d]
    assert [d["kind"] for d in docs] == ["PodCliqueSet"]
    assert validation_errors(docs[0], pcs_crd) == []


@pytest.mark.parametrize("key", list(LAYOUTS))
def test_exported_manifests_validate_against_the_published_crds(
    key: str, dgd_crd: dict, pcs_crd: dict
) -> None:
    spec = export_spec(LAYOUTS[key], "llama-3.1-70b", namespace="llm")
    assert validation_errors(export_document(spec, "dynamo"), dgd_crd) == []
    assert validation_errors(export_document(spec, "grove"), pcs_crd) == []


def test_broken_manifests_fail_the_published_crds(dgd_crd: dict, pcs_crd: dict, grove_example: Path) -> None:
    spec = export_spec(LAYOUTS["3p1d"], "llama-3.1-70b")
    dgd = export_document(spec, "dynamo")
    dgd["spec"]["services"]["VllmDecodeWorker"]["replicas"] = "one"
    dgd["spec"]["services"]["VllmPrefillWorker"]["resources"]["limits"]["gpus"] = "2"  # the field is "gpu"
    dgd["spec"]["backendFramework"] = "tgi"
    assert validation_errors(dgd, dgd_crd) == [
        "spec.backendFramework: 'tgi' is not one of ['sglang', 'vllm', 'trtllm']",
        "spec.services.VllmDecodeWorker.replicas: 'one' is not of type 'integer'",
        "spec.services.VllmPrefillWorker.resources.limits: Additional properties are not allowed ('gpus' was unexpected)",
    ]
    pcs = export_document(spec, "grove")
    del pcs["spec"]["template"]["cliques"][1]["spec"]["roleName"]
    pcs["spec"]["template"]["cliques"][2]["spec"]["podSpec"]["containers"][0]["resource"] = {}
    assert validation_errors(pcs, pcs_crd) == [
        "spec.template.cliques.1.spec: 'roleName' is a required property",
        "spec.template.cliques.2.spec.podSpec.containers.0: Additional properties are not allowed ('resource' was unexpected)",
    ]
    example = next(d for d in yaml.safe_load_all(grove_example.read_text()) if d)
    example["spec"]["template"]["cliques"][0]["spec"]["replicas"] = "1"
    assert validation_errors(example, pcs_crd) == [
        "spec.template.cliques.0.spec.replicas: '1' is not of type 'integer'"
    ]
    assert validation_errors(dgd, pcs_crd)[0].startswith(
        "kind: 'DynamoGraphDeployment' is not 'PodCliqueSet'"
    )
