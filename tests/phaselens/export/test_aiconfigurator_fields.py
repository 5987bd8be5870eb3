"""``phaselens export --format dynamo`` writes the fields AIConfigurator writes: for the layouts
AIConfigurator 0.12.0 chose (its generated manifests in data/), the same services, replicas, GPUs
per worker and vLLM engine arguments; and AIConfigurator's own manifests pass the published CRD."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from phaselens.export import export_document, export_spec
from phaselens.export.crd import validation_errors

DATA = Path(__file__).parent / "data"
CASES = {
    "agg": "agg:8xh100-sxm:tp8:max_num_seqs=512:max_num_batched_tokens=6012",
    "disagg": (
        "2p1d:h100-sxm:prefill.tp=2:decode.tp=4:prefill.max_num_seqs=1:prefill.max_num_batched_tokens=5500"
        ":decode.max_num_seqs=512:decode.max_num_batched_tokens=512"
    ),
}
SAME_ARGS = (
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--disaggregation-mode",
    "--kv-transfer-config",
)


def _theirs(mode: str) -> dict:
    return yaml.safe_load((DATA / f"aiconfigurator-0.12.0-{mode}-k8s_deploy.yaml").read_text())


def _flags(args: list[str]) -> dict[str, str]:
    return {
        a: args[i + 1]
        for i, a in enumerate(args[:-1])
        if a.startswith("--") and not args[i + 1].startswith("--")
    }


@pytest.mark.parametrize("mode", list(CASES))
def test_the_same_services_replicas_gpus_and_engine_args(mode: str) -> None:
    theirs = _theirs(mode)["spec"]["services"]
    ours = export_document(export_spec(CASES[mode], "llama-3.1-70b"), "dynamo")["spec"]["services"]
    assert set(ours) == set(theirs)
    for name, svc in theirs.items():
        mine = ours[name]
        for key in ("componentType", "subComponentType", "replicas", "envFromSecret", "sharedMemory"):
            assert mine.get(key) == svc.get(key), (name, key)
        assert mine.get("resources", {}).get("limits") == svc.get("resources", {}).get("limits"), name
        pod, their_pod = mine["extraPodSpec"], svc["extraPodSpec"]
        assert pod["nodeSelector"] == their_pod["nodeSelector"]
        assert pod["mainContainer"]["command"] == their_pod["mainContainer"]["command"]
        if svc["componentType"] == "worker":
            a, b = _flags(pod["mainContainer"]["args"]), _flags(their_pod["mainContainer"]["args"])
            for flag in SAME_ARGS:
                assert a.get(flag) == b.get(flag), (name, flag)


@pytest.mark.parametrize("mode", list(CASES))
def test_aiconfigurators_manifests_pass_the_published_crd(mode: str, dgd_crd: dict) -> None:
    assert validation_errors(_theirs(mode), dgd_crd) == []
