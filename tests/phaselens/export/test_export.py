"""The manifests' fields: replicas, GPUs = TP, the engine settings as the workers' arguments; bad
layouts and recommendations refused with a message naming what is wrong."""

from __future__ import annotations

import pytest
import yaml

from phaselens.export import ExportError, export_document, export_spec, spec_from_recommendation, to_yaml
from serving.sim.layout import parse_layout

LAYOUTS = {
    "agg": "agg:8xh100-sxm:tp2:max_num_seqs=128:max_num_batched_tokens=2048:chunked_prefill=on",
    "1p1d": "1p1d:h100-sxm:tp4:decode.max_num_seqs=256:prefill.chunked_prefill=off",
    "3p1d": "3p1d:h100-sxm:tp2:prefill.max_num_batched_tokens=16384",
}


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("key", list(LAYOUTS))
def test_dynamo_services_carry_replicas_gpus_and_engine_args(key: str) -> None:
    layout = parse_layout(LAYOUTS[key])
    doc = export_document(export_spec(LAYOUTS[key], "llama-3.1-70b", namespace="llm"), "dynamo")
    assert (doc["apiVersion"], doc["kind"]) == ("nvidia.com/v1alpha1", "DynamoGraphDeployment")
    assert doc["metadata"]["namespace"] == "llm"
    assert doc["metadata"]["annotations"]["phaselens.io/layout"] == LAYOUTS[key]
    services = doc["spec"]["services"]
    assert services["Frontend"]["componentType"] == "frontend"
    names = {"mixed": "VllmWorker", "prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker"}
    assert set(services) == {"Frontend", *(names[p.role] for p in layout.pools)}
    gpus = 0
    for pool in layout.pools:
        svc = services[names[pool.role]]
        assert svc["replicas"] == pool.replicas
        assert svc["resources"]["limits"]["gpu"] == str(pool.tp)
        assert svc.get("subComponentType") == (None if pool.role == "mixed" else pool.role)
        args = svc["extraPodSpec"]["mainContainer"]["args"]
        assert _arg(args, "--model") == "meta-llama/Llama-3.1-70B-Instruct"
        assert _arg(args, "--tensor-parallel-size") == str(pool.tp)
        assert _arg(args, "--max-num-seqs") == str(pool.max_num_seqs)
        assert _arg(args, "--max-num-batched-tokens") == str(pool.max_num_batched_tokens)
        assert ("--enable-chunked-prefill" in args) == pool.chunked_prefill
        assert ("--no-enable-chunked-prefill" in args) == (not pool.chunked_prefill)
        if pool.role != "mixed":
            assert _arg(args, "--disaggregation-mode") == pool.role
        gpus += svc["replicas"] * int(svc["resources"]["limits"]["gpu"])
    assert gpus == layout.gpus == 8


@pytest.mark.parametrize("key", list(LAYOUTS))
def test_grove_cliques_carry_replicas_gpus_and_engine_args(key: str) -> None:
    layout = parse_layout(LAYOUTS[key])
    doc = export_document(export_spec(LAYOUTS[key], "llama-3.1-70b"), "grove")
    assert (doc["apiVersion"], doc["kind"]) == ("grove.io/v1alpha1", "PodCliqueSet")
    cliques = {c["name"]: c["spec"] for c in doc["spec"]["template"]["cliques"]}
    names = {"mixed": "worker", "prefill": "prefill", "decode": "decode"}
    assert set(cliques) == {"frontend", *(names[p.role] for p in layout.pools)}
    assert "nvidia.com/gpu" not in str(cliques["frontend"]["podSpec"])
    for pool in layout.pools:
        clique = cliques[names[pool.role]]
        assert clique["replicas"] == pool.replicas and clique["roleName"] == names[pool.role]
        (container,) = clique["podSpec"]["containers"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": str(pool.tp)}
        assert clique["podSpec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-SXM5-80GB"}
        assert _arg(container["args"], "--tensor-parallel-size") == str(pool.tp)
        assert _arg(container["args"], "--max-num-batched-tokens") == str(pool.max_num_batched_tokens)


def test_yaml_round_trips_and_keeps_strings_strings() -> None:
    doc = export_document(export_spec(LAYOUTS["3p1d"], "llama-3.1-70b"), "dynamo")
    text = to_yaml(doc, "a comment\nsecond line")
    assert text.startswith("# a comment\n# second line\napiVersion: nvidia.com/v1alpha1\n")
    back = yaml.safe_load(text)
    assert back == doc
    assert back["spec"]["services"]["VllmPrefillWorker"]["resources"]["limits"]["gpu"] == "2"


def test_power_and_clock_knobs_are_kept_as_annotations() -> None:
    spec = export_spec(
        "1p1d:h100-sxm:tp4:decode.power_limit_w=450:prefill.sm_clock_mhz=1200-1980", "llama-3.1-70b"
    )
    notes = export_document(spec, "grove")["metadata"]["annotations"]
    assert notes["phaselens.io/decode-power-limit-w"] == "450"
    assert notes["phaselens.io/prefill-sm-clock-mhz"] == "1200-1980"


@pytest.mark.parametrize(
    ("layout", "model", "words"),
    [
        ("4q1d:h100-sxm", "llama-3.1-70b", ["neither agg nor XpYd"]),
        ("agg:8xb300:tp2", "llama-3.1-70b", ["unknown GPU 'b300'", "allowed"]),
        ("agg:8xh100-sxm:tp3", "llama-3.1-70b", ["do not split into replicas of tp 3"]),
        ("1p1d:h100-sxm:tp1", "llama-3.1-70b", ["cannot serve llama-3.1-70b"]),  # 140 GB on one 80 GB GPU
        ("1p1d:h100-sxm:tp2", "tiny", ["neither a phaselens shape", "meta-llama/"]),
        ("1p1d:h100-sxm:tp2", "llama 70b", ["neither a phaselens shape"]),
    ],
)
def test_bad_layouts_and_models_are_refused_clearly(layout: str, model: str, words: list[str]) -> None:
    with pytest.raises(ExportError) as e:
        export_spec(layout, model)
    for word in words:
        assert word in str(e.value)


def test_a_hugging_face_id_is_served_as_given_and_bad_names_refused() -> None:
    spec = export_spec("1p1d:h200:tp1", "Qwen/Qwen3-32B", name="Qwen3 32B / test")
    assert spec.hf_model == "Qwen/Qwen3-32B" and spec.name == "qwen3-32b-test"
    with pytest.raises(ExportError, match="namespace 'LLM_ns' is not a DNS-1123 label"):
        export_spec("1p1d:h200:tp1", "Qwen/Qwen3-32B", namespace="LLM_ns")
    with pytest.raises(ExportError, match="format 'helm' is not one of: dynamo, grove"):
        export_document(spec, "helm")


def test_a_recommendation_exports_its_proposed_layout() -> None:
    rec = {
        "recommendation_id": "rec-1764900000-a1b2c3",
        "kind": "layout",
        "proposed": '{"layout": "3p1d:h100-sxm:tp2", "describe": {}, "model": "llama-3.1-70b", "gpus": 8}',
    }
    spec = spec_from_recommendation(rec, namespace="llm")
    doc = export_document(spec, "dynamo")
    assert doc["metadata"]["annotations"]["phaselens.io/recommendation-id"] == "rec-1764900000-a1b2c3"
    assert doc["spec"]["services"]["VllmPrefillWorker"]["replicas"] == 3
    with pytest.raises(ExportError, match="says 4 GPUs but its layout"):
        spec_from_recommendation(
            {**rec, "proposed": {"layout": "3p1d:h100-sxm:tp2", "model": "llama-3.1-70b", "gpus": 4}}
        )
    with pytest.raises(ExportError, match="says eight GPUs but its layout"):
        spec_from_recommendation(
            {**rec, "proposed": {"layout": "3p1d:h100-sxm:tp2", "model": "llama-3.1-70b", "gpus": "eight"}}
        )
    with pytest.raises(ExportError, match="names no 'model'; pass --model"):
        spec_from_recommendation({**rec, "proposed": {"layout": "3p1d:h100-sxm:tp2"}})
    with pytest.raises(ExportError, match="only layout ones export"):
        spec_from_recommendation({**rec, "kind": "power_limit"})
    with pytest.raises(ExportError, match="proposed column is not JSON"):
        spec_from_recommendation({**rec, "proposed": "{layout"})
