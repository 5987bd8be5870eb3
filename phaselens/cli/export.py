"""``phaselens export``: a layout (a string, or a stored recommendation's proposed one) as an NVIDIA
Dynamo ``DynamoGraphDeployment`` or NVIDIA Grove ``PodCliqueSet`` manifest
(:mod:`phaselens.export`); the recommendation read through the running collector or from a store
file with ``--db``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from phaselens.cli.data_access import control_headers, open_store_file
from phaselens.export import (
    FORMATS,
    ExportError,
    export_document,
    export_spec,
    spec_from_recommendation,
    to_yaml,
)


def add_export_command(sub: Any) -> None:
    """``phaselens export (ID | --layout L --model M) --format dynamo|grove``."""
    p = sub.add_parser(
        "export",
        help="write a layout or a recommendation as a Dynamo DynamoGraphDeployment or Grove PodCliqueSet",
    )
    p.add_argument(
        "recommendation_id", nargs="?", default=None, metavar="ID", help="a stored layout recommendation"
    )
    p.add_argument("--layout", default=None, help="a layout string instead of ID, e.g. 3p1d:h100-sxm:tp2")
    p.add_argument(
        "--model",
        default=None,
        help="phaselens shape (llama-3.1-70b, ...) or Hugging Face id (with --layout)",
    )
    p.add_argument(
        "--format",
        required=True,
        choices=[*sorted(FORMATS), "nvidia-smi"],
        help="the manifest to write (nvidia-smi: a power recommendation as a script per node and role)",
    )
    p.add_argument("--out", default=None, metavar="FILE", help="write here instead of standard output")
    p.add_argument("--namespace", default=None, help="the Kubernetes namespace to put in the manifest")
    p.add_argument(
        "--image", default=None, help="the Dynamo vLLM runtime image (default: the one AIConfigurator uses)"
    )
    p.add_argument("--name", default=None, help="the resource's name (default: from the model and layout)")
    p.add_argument(
        "--hf-secret",
        default="hf-token-secret",
        help="the Secret with HF_TOKEN the pods read (default hf-token-secret; '' for none)",
    )
    p.add_argument(
        "--validate",
        default=None,
        metavar="CRD.yaml",
        help="check the manifest against this CustomResourceDefinition (e.g. `kubectl get crd NAME -o yaml`)",
    )
    p.add_argument(
        "--db", default=None, help="read the recommendation from this store file (no collector needed)"
    )
    p.add_argument(
        "--collector",
        default=os.environ.get("PHASELENS_API_URL") or "http://127.0.0.1:8900",
        metavar="URL",
        help="the running collector to read the recommendation from (default: $PHASELENS_API_URL or "
        "http://127.0.0.1:8900)",
    )
    p.add_argument("--token", default=None, help="the collector's control token, if its reads need one")
    p.set_defaults(func=cmd_export)


def cmd_export(args: Any) -> int:
    """Run ``phaselens export``; 2 on a bad input (the message says what and what is allowed)."""
    try:
        text, summary = _export(args)
    except ExportError as e:
        print(f"phaselens export: error: {e}", file=sys.stderr)
        return 2
    if not args.out:
        sys.stdout.write(text)
        return 0
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as e:
        print(f"phaselens export: error: --out {args.out}: {e}", file=sys.stderr)
        return 1
    print(f"{summary}; written to {args.out}")
    return 0


def _export(args: Any) -> tuple[str, str]:
    options = {
        "namespace": args.namespace,
        "image": args.image,
        "name": args.name,
        "hf_secret": args.hf_secret or None,
    }
    if args.recommendation_id and args.layout:
        raise ExportError("give a recommendation ID or --layout, not both")
    if args.format == "nvidia-smi":
        return _power_script(args)
    if args.recommendation_id:
        rec = _recommendation(args)
        spec = spec_from_recommendation(rec, model=args.model, **options)
        source = f"recommendation {args.recommendation_id}"
    elif args.layout:
        if not args.model:
            raise ExportError(
                "--layout needs --model (e.g. llama-3.1-70b or meta-llama/Llama-3.1-70B-Instruct)"
            )
        spec = export_spec(args.layout, args.model, **options)
        source = "layout"
    else:
        raise ExportError("give a recommendation ID, or --layout LAYOUT --model MODEL")
    doc = export_document(spec, args.format)
    if args.validate:
        from phaselens.export.crd import load_crd, validate

        validate(doc, load_crd(args.validate))
    pools = ", ".join(f"{p.role} {p.replicas}x TP{p.tp}" for p in spec.layout.pools)
    summary = (
        f"{doc['kind']} {spec.name} ({spec.layout_text}: {pools}; {spec.layout.gpus} GPUs) from {source}"
    )
    comment = (
        f"phaselens export --format {args.format}: {spec.layout_text} serving {spec.hf_model}\n"
        f"{pools}; {spec.layout.gpus} GPUs"
        + (f"; recommendation {spec.recommendation_id}" if spec.recommendation_id else "")
        + (f"; validated against {args.validate}" if args.validate else "")
    )
    return to_yaml(doc, comment), summary


def _power_script(args: Any) -> tuple[str, str]:
    """A power recommendation as an nvidia-smi script (phaselens.export.nvidia_smi)."""
    from phaselens.export.nvidia_smi import power_script

    if not args.recommendation_id:
        raise ExportError("--format nvidia-smi exports a stored power recommendation: give its ID")
    rec = _recommendation(args)
    details = rec.get("details") or {}
    if isinstance(details, str):
        import json

        details = json.loads(details)
    models = {r: c.get("gpu_model") for r, c in (details.get("gpu_models") or {}).items()}
    text = power_script(rec, models)
    return text, f"nvidia-smi script of recommendation {args.recommendation_id}"


def _recommendation(args: Any) -> dict[str, Any]:
    rid = args.recommendation_id
    if args.db:
        return _recommendation_from_file(args.db, rid)
    return _recommendation_through(args.collector, rid, args.token)


def _recommendation_from_file(db: str, rid: str) -> dict[str, Any]:
    import json

    from collector.store import StoreError

    store = open_store_file(db, ExportError, "drop --db to read it through the collector", read_only=True)
    try:
        with store.reader() as cur:
            cur.execute("SELECT * FROM recommendations WHERE recommendation_id = ?", [rid])
            row = cur.fetchone()
            names = [d[0] for d in cur.description] if row else []
    except StoreError as e:
        raise ExportError(str(e)) from e
    finally:
        store.close()
    if row is None:
        raise ExportError(f"no recommendation {rid!r} in {db} (`phaselens recommend` makes one)")
    rec = dict(zip(names, row, strict=True))
    for key in ("current", "proposed", "details"):
        if isinstance(rec.get(key), str):
            try:
                rec[key] = json.loads(rec[key])
            except ValueError:
                pass  # spec_from_recommendation names the bad column
    return rec


def _recommendation_through(url: str, rid: str, token: str | None) -> dict[str, Any]:
    import httpx

    headers = control_headers(token)
    base = url.rstrip("/")
    where = f"{base}/api/v1/recommendations/{rid}"
    try:
        r = httpx.get(where, headers=headers, timeout=httpx.Timeout(30.0, connect=5.0))
    except httpx.HTTPError as e:
        raise ExportError(
            f"cannot reach the collector at {base} ({e}); start `phaselens collect`, or pass --db FILE for a "
            "store no collector holds"
        ) from e
    if r.status_code == 404:
        raise ExportError(
            f"{where} answered 404: no recommendation {rid!r} (`phaselens recommend` makes one)"
        )
    if r.status_code != 200:
        raise ExportError(f"{where} answered {r.status_code}: {r.text[:300]}")
    try:
        body = r.json()
    except ValueError as e:
        raise ExportError(f"{where} answered something that is not JSON ({e})") from e
    rec = body.get("recommendation", body) if isinstance(body, dict) else None
    if not isinstance(rec, dict):
        raise ExportError(f"{where} answered JSON that is not a recommendation: {str(body)[:200]}")
    return rec
