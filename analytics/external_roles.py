"""Identity, engines and roles of the external attribution (analytics/external.py): the names a
GPU is known by, the roles given or read (Dynamo component labels), and which engine serves which
GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from analytics.window import AnalyticsError

PREFILL, DECODE, MIXED = "prefill", "decode", "mixed"
ROLES = (PREFILL, DECODE, MIXED)


class ExternalAttributionError(AnalyticsError):
    """A mapping or role given to :func:`external_attribution` is not usable (the message says
    which and what is allowed)."""


def label_text(v: Any) -> str | None:
    """A label value, or None for NULL / NaN / empty."""
    return str(v) if isinstance(v, str) and v else None


def gpu_key_text(row: Mapping[str, Any]) -> str:
    if label_text(row.get("uuid")):
        return str(row["uuid"])
    if label_text(row.get("parent_uuid")):
        gi = row.get("mig_instance_id")
        return f"{row['parent_uuid']}/gi{int(gi) if pd.notna(gi) else '?'}"
    return f"{row['node']}/{row['device']}"


def identifiers(g: Mapping[str, Any]) -> set[str]:
    ids = {g["gpu"], f"{g['node']}/{g['device']}"}
    for k in ("uuid", "k8s_pod"):
        if label_text(g.get(k)):
            ids.add(str(g[k]))
    if label_text(g.get("k8s_pod")) and label_text(g.get("k8s_namespace")):
        ids.add(f"{g['k8s_namespace']}/{g['k8s_pod']}")
    return ids


def check_role(where: str, role: str) -> str:
    r = str(role).lower()
    if r not in ROLES:
        raise ExternalAttributionError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
    return r


def dynamo_roles(labels: pd.DataFrame) -> dict[str, str]:
    """endpoint → role from Dynamo component labels (``*prefill*`` → prefill; ``*decode*``, or
    ``backend`` next to a prefill component in the same Dynamo namespace → decode)."""
    out: dict[str, str] = {}
    comps = labels.dropna(subset=["dynamo_component"])
    if comps.empty:
        return out
    with_prefill = {
        ns
        for ns, c in zip(comps["dynamo_namespace"], comps["dynamo_component"], strict=True)
        if "prefill" in c.lower()
    }
    for ep, comp, ns in zip(
        comps["endpoint"], comps["dynamo_component"], comps["dynamo_namespace"], strict=True
    ):
        c = comp.lower()
        if "prefill" in c:
            out[ep] = PREFILL
        elif "decode" in c or ns in with_prefill:
            out[ep] = DECODE
        else:
            out[ep] = MIXED
    return out


def assign_engines(
    gpus: pd.DataFrame,
    labels: pd.DataFrame,
    engine_gpus: Mapping[str, Sequence[str]] | None,
    notes: list[str],
) -> dict[str, str]:
    """GPU key → engine endpoint: the ``engine_gpus`` mapping, else the engine's ``pod`` label
    matched to the GPU's Kubernetes pod (dcgm-exporter's pod attribution), else the one engine
    endpoint on the GPU's machine: the only engine whose URL has the host of the GPU's dcgm-exporter
    URL, else the only engine stored under the GPU's node (the collector's node: an engine and a
    dcgm-exporter it scrapes on localhost), else the only engine whose URL host is the node's name."""
    endpoints = set(labels["endpoint"]) if not labels.empty else set()
    out: dict[str, str] = {}
    ids = {g["gpu"]: identifiers(g) for g in gpus.to_dict("records")}
    if engine_gpus:
        for ep, wanted in engine_gpus.items():
            if isinstance(wanted, str):
                wanted = [wanted]
            if ep not in endpoints:
                notes.append(f"engine {ep!r} of the mapping has no engine_metrics in the window")
            for w in wanted:
                hits = [k for k, s in ids.items() if w in s]
                if not hits:
                    known = ", ".join(sorted(ids)) or "none"
                    raise ExternalAttributionError(
                        f"engine_gpus[{ep!r}]: no GPU {w!r} in the window; GPUs (uuid or node/device): {known}"
                    )
                for k in hits:
                    out[k] = ep
    by_pod = {}
    if not labels.empty:
        for ep, pod, ns in zip(labels["endpoint"], labels["pod"], labels["namespace"], strict=True):
            if isinstance(pod, str) and pod:
                by_pod[pod] = ep
                if isinstance(ns, str) and ns:
                    by_pod[f"{ns}/{pod}"] = ep
    per_host: dict[str, list[str]] = {}
    for ep in sorted(endpoints):
        per_host.setdefault(url_host(ep), []).append(ep)
    stored_on: dict[str, list[str]] = {}
    if not labels.empty and "node" in labels:
        for ep, node in zip(labels["endpoint"], labels["node"], strict=True):
            if isinstance(node, str) and node:
                stored_on.setdefault(node, []).append(ep)
    for g in gpus.to_dict("records"):
        k = g["gpu"]
        if k in out:
            continue
        pod, ns = label_text(g.get("k8s_pod")), label_text(g.get("k8s_namespace"))
        ep = by_pod.get(f"{ns}/{pod}") if pod and ns else None
        ep = ep or (by_pod.get(pod) if pod else None)
        if ep:
            out[k] = ep
            continue
        source = str(g.get("source") or "")
        exporter = url_host(source.removeprefix("dcgm:")) if source.startswith("dcgm:") else None
        for candidates, where in (
            (
                per_host.get(exporter, []) if exporter else [],
                f"at the host of its dcgm-exporter ({exporter})",
            ),
            (stored_on.get(str(g["node"]), []), f"scraped on node {g['node']}"),
            (per_host.get(str(g["node"]), []), f"at host {g['node']}"),
        ):
            if len(candidates) == 1:
                out[k] = candidates[0]
                notes.append(f"GPU {k}: engine {candidates[0]} taken as the only engine {where}")
                break
    return out


def url_host(url: str) -> str:
    """The host of a URL (``http://10.0.0.5:8000/metrics`` → ``10.0.0.5``)."""
    return re.sub(r"^[a-z]+://", "", url).split("/")[0].split(":")[0]
