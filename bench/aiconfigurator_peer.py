"""NVIDIA AIConfigurator side by side with phaselens's simulator, in one run.

For each question (one model, GPU type and count, fixed ISL/OSL, TTFT and TPOT SLOs) this asks
AIConfigurator (``aiconfigurator==0.12.0``, offline on CPU; installed into its own venv,
``.venv-aic``, never the product's) for its best aggregated and disaggregated configurations, reads
the engine settings it would deploy from its generated Dynamo manifests, and simulates those same
layouts in phaselens's simulator (``serving.sim``) under Poisson arrivals at the request rate
AIConfigurator claims for them, with fixed ISL/OSL as it assumes. Printed per layout: its predicted
tokens/s/GPU, tokens/s/user, TTFT and TPOT (unloaded, on means, no queueing) beside the simulator's
(with queueing, on percentiles), SLO attainment, J/token (AIConfigurator's answer carries none),
and where the two disagree.

    python bench/aiconfigurator_peer.py                        # both questions (installs the peer once)
    python bench/aiconfigurator_peer.py --isl 4000 --osl 500 --requests 400
    python bench/aiconfigurator_peer.py --rec-json rec.json    # a stored phaselens recommendation instead

For each question it also runs phaselens's own answer, ``analytics.recommend.recommend`` (what
``phaselens recommend`` runs) on the same model, 8 GPUs, fixed ISL/OSL Poisson trace (at the rate
AIConfigurator claims for its pick) and SLOs, and prints it beside (``--no-recommend`` skips it).

The peer's venv: ``python3 -m venv .venv-aic && .venv-aic/bin/pip install aiconfigurator==0.12.0``
(what :func:`ensure_peer` runs when it is missing). Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from analytics.goodput import find_goodput  # noqa: E402
from serving.config import preset  # noqa: E402
from serving.sim.layout import parse_layout  # noqa: E402
from serving.sim.simulator import Simulation  # noqa: E402
from serving.sim.summary import SimSummary, SloSpec, summarize  # noqa: E402
from serving.trace import poisson_trace  # noqa: E402

PEER = "aiconfigurator"
PEER_VERSION = "0.12.0"  # pinned: the package is being renamed (aisimulate) after 0.12
PEER_VENV = ROOT / ".venv-aic"
# the same model and GPU under each side's name
PEER_MODEL, SIM_MODEL = "meta-llama/Meta-Llama-3.1-70B", "llama-3.1-70b"
PEER_SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm"}
QUESTIONS = ((4000, 500), (1000, 200))  # (ISL, OSL)


@dataclass
class PeerConfig:
    """One of AIConfigurator's best configurations, as it states it (all its figures are
    predictions on means, at its own assumed concurrency, with no queueing)."""

    mode: str  # agg | disagg
    layout: str  # the same deployment as a phaselens layout string
    shape: str  # e.g. "TP8 x1" or "2P(TP2) 1D(TP4) x1"
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    request_rate_rps: float
    concurrency: int
    ttft_s: float
    tpot_s: float
    power_w: float | None  # its column; 0.0 means none stated
    engine: dict[str, dict[str, str]] = field(default_factory=dict)  # per role: the args it deploys
    deploy: dict[str, Any] = field(default_factory=dict)  # its generated DynamoGraphDeployment


@dataclass
class PeerAnswer:
    """AIConfigurator's answer to one question."""

    chosen: str  # the mode it picks
    speedup_text: str
    best: dict[str, PeerConfig]
    wall_s: float
    command: list[str]


def ensure_peer(venv: Path = PEER_VENV) -> Path:
    """The ``aiconfigurator`` executable of ``venv``, created with the pinned version if absent."""
    exe = venv / "bin" / PEER
    if exe.exists():
        return exe
    print(f"installing {PEER}=={PEER_VERSION} into {venv} (once) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/pip"), "install", "-q", f"{PEER}=={PEER_VERSION}"], check=True)
    return exe


def ask_peer(
    *,
    isl: int,
    osl: int,
    ttft_s: float,
    tpot_s: float,
    gpus: int = 8,
    gpu: str = "h100-sxm",
    backend: str = "vllm",
    exe: Path | None = None,
) -> PeerAnswer:
    """Ask AIConfigurator (``cli default``) for the best agg and disagg configurations of
    ``PEER_MODEL`` on ``gpus`` GPUs at these ISL/OSL and SLOs; parse its saved answer."""
    exe = exe or ensure_peer()
    with tempfile.TemporaryDirectory(prefix="aic-") as tmp:
        cmd = [
            str(exe), "cli", "default", "--model", PEER_MODEL, "--backend", backend,
            "--system", PEER_SYSTEMS[gpu], "--total-gpus", str(gpus), "--isl", str(isl), "--osl", str(osl),
            "--ttft", f"{ttft_s * 1e3:g}", "--tpot", f"{tpot_s * 1e3:g}", "--top-n", "1",
            "--save-dir", tmp, "--no-color",
        ]  # fmt: skip
        t0 = time.perf_counter()
        run = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
        )
        wall = time.perf_counter() - t0
        out = run.stdout + run.stderr
        if run.returncode != 0:
            raise RuntimeError(f"{PEER} failed ({run.returncode}): {out[-2000:]}")
        m = re.search(r"Best Experiment Chosen: (\w+) at [\d.,]+ tokens/s/gpu \(([^)]*)\)", out)
        (result_dir,) = [
            p.parent for p in Path(tmp).rglob("best_config_topn.csv") if p.parent.name == "agg"
        ] or [None]
        if result_dir is None or m is None:
            raise RuntimeError(f"{PEER}'s answer not found in {tmp}: {out[-2000:]}")
        run_dir = result_dir.parent
        best = {mode: _peer_config(run_dir / mode, mode, gpus, gpu) for mode in ("agg", "disagg")}
    return PeerAnswer(chosen=m.group(1), speedup_text=m.group(2), best=best, wall_s=wall, command=cmd)


def _peer_config(mode_dir: Path, mode: str, gpus: int, gpu: str) -> PeerConfig:
    with open(mode_dir / "best_config_topn.csv", newline="") as f:
        row = next(csv.DictReader(f))
    deploy = yaml.safe_load((mode_dir / "top1" / "k8s_deploy.yaml").read_text())
    engine = _deployed_args(deploy)
    if mode == "agg":
        tp = int(row["tp"]) * int(row["pp"])
        replicas = gpus // tp
        args = engine["mixed"]
        layout = (
            f"agg:{replicas * tp}x{gpu}:tp{tp}:max_num_seqs={args['--max-num-seqs']}"
            f":max_num_batched_tokens={args['--max-num-batched-tokens']}"
        )
        shape = f"TP{tp} x{replicas}"
    else:
        p_tp, d_tp = int(row["(p)tp"]) * int(row["(p)pp"]), int(row["(d)tp"]) * int(row["(d)pp"])
        p_n, d_n = int(row["(p)workers"]), int(row["(d)workers"])
        per_replica = p_n * p_tp + d_n * d_tp
        copies = gpus // per_replica
        pa, da = engine["prefill"], engine["decode"]
        layout = (
            f"{p_n * copies}p{d_n * copies}d:{gpu}:prefill.tp={p_tp}:decode.tp={d_tp}"
            f":prefill.max_num_seqs={pa['--max-num-seqs']}:prefill.max_num_batched_tokens={pa['--max-num-batched-tokens']}"
            f":decode.max_num_seqs={da['--max-num-seqs']}:decode.max_num_batched_tokens={da['--max-num-batched-tokens']}"
        )
        shape = f"{p_n}P(TP{p_tp}) {d_n}D(TP{d_tp}) x{copies}"
    power = float(row.get("power_w") or 0.0)
    return PeerConfig(
        mode=mode,
        layout=layout,
        shape=shape,
        tokens_per_s_per_gpu=float(row["tokens/s/gpu"]),
        tokens_per_s_per_user=float(row["tokens/s/user"]),
        request_rate_rps=float(row["request_rate"]),
        concurrency=int(float(row["concurrency"])),
        ttft_s=float(row["ttft"]) / 1e3,
        tpot_s=float(row["tpot"]) / 1e3,
        power_w=power or None,
        engine=engine,
        deploy=deploy,
    )


def _deployed_args(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Per role, the flag -> value of the vLLM workers in a generated DGD (and their replicas and GPUs)."""
    out: dict[str, dict[str, str]] = {}
    for svc in doc["spec"]["services"].values():
        if svc.get("componentType") != "worker":
            continue
        args = svc["extraPodSpec"]["mainContainer"]["args"]
        flags = {
            a: (args[i + 1] if i + 1 < len(args) else "") for i, a in enumerate(args) if a.startswith("--")
        }
        flags["replicas"] = str(svc.get("replicas", 1))
        flags["gpu"] = str(svc.get("resources", {}).get("limits", {}).get("gpu"))
        out[svc.get("subComponentType") or "mixed"] = flags
    return out


def simulate_at(
    layout: str, rate_rps: float, *, isl: int, osl: int, n: int, slo: SloSpec, seed: int = 0
) -> SimSummary:
    """``layout`` serving ``n`` requests of ISL/OSL tokens arriving as Poisson at ``rate_rps``."""
    requests = poisson_trace(rate_rps, n, prompt_tokens=isl, output_tokens=osl, seed=seed)
    result = Simulation(parse_layout(layout), preset(SIM_MODEL), requests, scenario="aic-peer").run()
    return summarize(result, slo)


def goodput_tokens_per_s_per_gpu(
    layout: str, *, start_rps: float, isl: int, osl: int, n: int, slo: SloSpec, target: float = 0.9
) -> tuple[float, float]:
    """The simulator's goodput of ``layout`` at the SLOs: the highest Poisson rate at which
    ``target`` of the requests meet both (``analytics.goodput.find_goodput``, 5 %), as
    (req/s, output tokens/s/GPU)."""
    gpus = parse_layout(layout).gpus
    result = find_goodput(
        lambda rate: simulate_at(layout, rate, isl=isl, osl=osl, n=n, slo=slo).slo_attainment,
        initial_rate_rps=start_rps, min_rate_rps=0.01, max_rate_rps=100.0, target=target, gpus=gpus,
    )  # fmt: skip
    return result.goodput_rps, result.goodput_rps * osl / gpus


EXPORT_FIELDS = ("replicas", "gpu", "--tensor-parallel-size", "--max-num-seqs", "--max-num-batched-tokens")


def export_differences(peer: PeerConfig) -> list[str]:
    """Where ``phaselens export --format dynamo`` of the same layout differs from AIConfigurator's
    generated DGD in what decides the deployment (services, replicas, GPUs, TP, engine limits)."""
    from phaselens.export import export_document, export_spec

    ours = _deployed_args(export_document(export_spec(peer.layout, SIM_MODEL), "dynamo"))
    if set(ours) != set(peer.engine):
        return [f"worker roles {sorted(ours)} vs its {sorted(peer.engine)}"]
    return [
        f"{role} {key}: {ours[role].get(key)} vs its {peer.engine[role].get(key)}"
        for role in ours
        for key in EXPORT_FIELDS
        if ours[role].get(key) != peer.engine[role].get(key)
    ]


def phaselens_column(rec: dict[str, Any]) -> dict[str, Any]:
    """The phaselens answer for the table, from a layout recommendation as the service stores it
    (the shared contract: ``proposed`` = {"layout", ...}, ``details.predicted`` = METRICS with
    ``details.confidence``): :func:`ask_phaselens`'s row, or ``--rec-json``, one saved from
    ``GET /api/v1/recommendations/{id}``."""
    proposed = rec.get("proposed") or {}
    details = rec.get("details") or {}
    proposed = json.loads(proposed) if isinstance(proposed, str) else proposed
    details = json.loads(details) if isinstance(details, str) else details
    predicted = details.get("predicted") or {}
    confidence = details.get("confidence") or {}
    return {
        "layout": proposed.get("layout"),
        "goodput_rps_per_gpu": predicted.get("goodput_rps_per_gpu"),
        "tokens_per_s_per_gpu": predicted.get("output_tokens_per_s_per_gpu"),
        "tokens_per_s_per_user": predicted.get("output_tokens_per_s_per_user"),
        "ttft_p90_s": predicted.get("ttft_p90_s"),
        "tpot_p90_s": predicted.get("tpot_p90_s"),
        "slo_attainment": predicted.get("slo_attainment"),
        "j_per_token": predicted.get("j_per_token"),
        "confidence": confidence.get("level"),
        "rationale": rec.get("rationale"),
        "trust": details.get("trust", "simulated"),
    }


def _f(x: float | None, scale: float = 1.0, fmt: str = ",.0f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x * scale, fmt)


def compare(peer: PeerConfig, sim: SimSummary, slo: SloSpec) -> list[str]:
    """Where AIConfigurator's prediction and the simulation of its own layout at its claimed load
    disagree (> 15 %), or where its SLO verdict (means) and the percentiles' differ."""
    notes = []
    sim_user = 1.0 / sim.tpot_p50_s if sim.tpot_p50_s > 0 else float("nan")
    for what, p, s in (
        ("tokens/s/GPU", peer.tokens_per_s_per_gpu, sim.output_tokens_per_s_per_gpu),
        ("tokens/s/user (1/TPOT p50)", peer.tokens_per_s_per_user, sim_user),
        ("TTFT (its unloaded vs p50 with queueing)", peer.ttft_s, sim.ttft_p50_s),
        ("TPOT (its mean vs p50)", peer.tpot_s, sim.tpot_p50_s),
    ):
        if p and s == s and abs(s - p) / p > 0.15:
            notes.append(f"{what}: {p:,.3g} predicted vs {s:,.3g} simulated ({(s - p) / p:+.0%})")
    peer_ok = peer.ttft_s <= slo.ttft_s and peer.tpot_s <= slo.tpot_s
    sim_ok = sim.ttft_p90_s <= slo.ttft_s and sim.tpot_p90_s <= slo.tpot_s
    if peer_ok != sim_ok:
        notes.append(
            f"SLO verdict: it says {'met' if peer_ok else 'missed'} on means; the p90s with queueing "
            f"{'meet' if sim_ok else 'miss'} them (TTFT p90 {sim.ttft_p90_s * 1e3:,.0f} ms, "
            f"TPOT p90 {sim.tpot_p90_s * 1e3:.1f} ms; attainment {sim.slo_attainment:.1%})"
        )
    return notes


def print_question(isl: int, osl: int, answer: PeerAnswer, sims: dict[str, SimSummary], slo: SloSpec,
                   goodput: dict[str, tuple[float, float]], rec: dict[str, Any] | None) -> None:  # fmt: skip
    """The side-by-side table of one question."""
    print(
        f"\n== {PEER_MODEL} (phaselens {SIM_MODEL}), 8 x H100 SXM, ISL {isl} / OSL {osl}, SLO TTFT "
        f"{slo.ttft_s * 1e3:g} ms, TPOT {slo.tpot_s * 1e3:g} ms =="
    )
    print(f"{PEER} {PEER_VERSION} ({answer.wall_s:.1f} s): chooses {answer.chosen} ({answer.speedup_text})")
    head = f"{'':44}" + "".join(f"{m + ' (its layout)':>28}" for m in answer.best)
    print(head)
    rows = [
        ("layout", lambda p, s: p.shape),
        ("request rate, req/s (its claim = sim load)", lambda p, s: f"{p.request_rate_rps:.2f}"),
        ("tokens/s/GPU   predicted", lambda p, s: _f(p.tokens_per_s_per_gpu)),
        ("               simulated", lambda p, s: _f(s.output_tokens_per_s_per_gpu)),
        ("tokens/s/user  predicted", lambda p, s: _f(p.tokens_per_s_per_user, fmt=".1f")),
        ("               simulated (1/TPOT p50)", lambda p, s: _f(1 / s.tpot_p50_s, fmt=".1f")),
        ("TTFT, ms       predicted (unloaded, mean)", lambda p, s: _f(p.ttft_s, 1e3)),
        ("               simulated p50 / p90", lambda p, s: f"{_f(s.ttft_p50_s, 1e3)} / {_f(s.ttft_p90_s, 1e3)}"),
        ("TPOT, ms       predicted (mean)", lambda p, s: _f(p.tpot_s, 1e3, ".1f")),
        ("               simulated p50 / p90", lambda p, s: f"{_f(s.tpot_p50_s, 1e3, '.1f')} / {_f(s.tpot_p90_s, 1e3, '.1f')}"),
        ("SLO attainment, simulated (every request)", lambda p, s: f"{s.slo_attainment:.1%}"),
        ("goodput at the SLOs (90 %), simulated: req/s", lambda p, s: f"{goodput[p.mode][0]:.2f}"),
        ("  tokens/s/GPU (vs its predicted)", lambda p, s: f"{goodput[p.mode][1]:,.0f} ({goodput[p.mode][1] / p.tokens_per_s_per_gpu:.2f}x)"),
        ("J/token (in+out)  predicted / simulated", lambda p, s: f"{_f(p.power_w, fmt='.0f') if p.power_w else 'none'} / {s.j_per_token:.2f}"),
        ("J/output token, simulated", lambda p, s: f"{s.j_per_output_token:.2f}"),
    ]  # fmt: skip
    for label, cell in rows:
        print(f"{label:44}" + "".join(f"{cell(answer.best[m], sims[m]):>28}" for m in answer.best))
    for mode, peer in answer.best.items():
        print(f"  {mode} simulated as {peer.layout}")
        diff = export_differences(peer)
        print(f"  {mode}: phaselens export of it vs its generated DGD: " + ("; ".join(diff) if diff else
              f"same workers, replicas, GPUs, TP and engine limits ({', '.join(EXPORT_FIELDS)})"))  # fmt: skip
        for note in compare(peer, sims[mode], slo):
            print(f"  {mode}: {note}")
    agg, dis = sims["agg"], sims["disagg"]
    g_agg, g_dis = goodput["agg"][1], goodput["disagg"][1]
    sim_pick = "disagg" if g_dis > g_agg else "agg"
    print(
        f"verdict: {PEER} picks {answer.chosen} "
        f"({answer.best['disagg'].tokens_per_s_per_gpu / answer.best['agg'].tokens_per_s_per_gpu:.2f}x tokens/s/GPU); "
        f"the simulator: at its claimed loads attainment {agg.slo_attainment:.1%} agg vs {dis.slo_attainment:.1%} "
        f"disagg; goodput at the SLOs disagg/agg {g_dis / g_agg if g_agg else float('inf'):.2f}x -> {sim_pick}"
        + (" (agrees)" if sim_pick == answer.chosen else " (DISAGREES)")
    )
    if rec is not None:
        print_phaselens(rec, osl, answer, goodput.get("phaselens"))


def ask_phaselens(
    isl: int, osl: int, rate_rps: float, current: str, *, n: int, slo: SloSpec, target: float = 0.9
) -> dict[str, Any]:
    """phaselens's answer to the same question: ``analytics.recommend.recommend`` (what ``phaselens
    recommend`` runs) for llama-3.1-70b on the 8 GPUs of ``current`` (AIConfigurator's agg layout),
    the fixed ISL/OSL Poisson trace at ``rate_rps`` (the rate AIConfigurator claims for its pick) and
    the SLOs; the stored row's form (``recommendation_row``). Nothing is measured for a question
    asked on paper, so its confidence is ``low`` ("not checked"), as it says."""
    from analytics.recommend import RecommendInputs, SearchOptions, SloTarget, recommend
    from analytics.recommend.records import recommendation_row

    inputs = RecommendInputs(
        trace=poisson_trace(rate_rps, n, prompt_tokens=isl, output_tokens=osl, seed=0),
        model=SIM_MODEL,
        current=current,
        slo=SloTarget(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s, target=target),
        target="scenario:aiconfigurator-peer",
        trace_desc=f"Poisson {rate_rps:.2f} req/s, {n} requests, ISL {isl} / OSL {osl} fixed",
    )
    t0 = time.perf_counter()
    rec = recommend(inputs, SearchOptions(), progress=lambda m: print(f"  recommend: {m}", file=sys.stderr))
    print(f"  phaselens recommend(): {time.perf_counter() - t0:.1f} s wall", file=sys.stderr)
    return recommendation_row(rec, node="bench")


def print_phaselens(
    rec: dict[str, Any], osl: int, answer: PeerAnswer, same_search: tuple[float, float] | None = None
) -> None:
    """The phaselens column beside AIConfigurator's pick; ``same_search``: the goodput of its
    layout by the table's own search (req/s, tokens/s/GPU), to compare like with like."""
    c = phaselens_column(rec)
    good = c["goodput_rps_per_gpu"]
    trace = ((rec.get("details") or {}).get("inputs") or {}).get("trace") or {}
    print(
        f"phaselens recommend() on {trace.get('desc', 'the trace')} (simulated; confidence {c['confidence']}): {c['layout']}"
    )
    for label, value in (
        ("goodput/GPU at the SLOs, req/s (tokens/s/GPU)", f"{_f(good, fmt='.3f')} ({_f(good, osl)})" if good else "—"),
        ("tokens/s/GPU, tokens/s/user", f"{_f(c['tokens_per_s_per_gpu'])}, {_f(c['tokens_per_s_per_user'], fmt='.1f')}"),
        ("TTFT p90 / TPOT p90, ms", f"{_f(c['ttft_p90_s'], 1e3)} / {_f(c['tpot_p90_s'], 1e3, '.1f')}"),
        ("SLO attainment (whole trace)", _f(c["slo_attainment"], fmt=".1%")),
        ("J/token (in+out)", _f(c["j_per_token"], fmt=".3f")),
    ):  # fmt: skip
        print(f"  {label:46}{value}")
    if same_search is not None:
        print(
            f"  {'goodput by the table search (5 %), req/s (tok/s/GPU)':46}{same_search[0]:.2f} ({same_search[1]:,.0f})"
        )
    print(f"  rationale: {c['rationale']}")
    chosen = answer.best[answer.chosen].layout
    print(
        f"  {PEER} picks {answer.chosen} {chosen}; phaselens "
        + ("the same layout" if c["layout"] == chosen else f"{c['layout']} (they differ)")
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--isl", type=int, default=None, help="one question's ISL (default: 4000/500 and 1000/200)"
    )
    ap.add_argument("--osl", type=int, default=None)
    ap.add_argument("--ttft-ms", type=float, default=1000.0)
    ap.add_argument("--tpot-ms", type=float, default=30.0)
    ap.add_argument("--requests", type=int, default=600, help="requests simulated per layout (600)")
    ap.add_argument("--gpu", default="h100-sxm", choices=sorted(PEER_SYSTEMS))
    ap.add_argument("--venv", type=Path, default=PEER_VENV, help=f"the peer's venv ({PEER_VENV.name})")
    ap.add_argument(
        "--rec-json", type=Path, default=None, help="a phaselens recommendation (JSON) to show beside"
    )
    ap.add_argument(
        "--no-recommend", action="store_true", help="skip phaselens's recommend() for each question"
    )
    args = ap.parse_args()
    slo = SloSpec(ttft_s=args.ttft_ms / 1e3, tpot_s=args.tpot_ms / 1e3)
    exe = ensure_peer(args.venv)
    rec = json.loads(args.rec_json.read_text()) if args.rec_json else None
    questions = [(args.isl, args.osl)] if args.isl and args.osl else list(QUESTIONS)
    print(f"host {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; trust: its figures are "
          f"predicted (its perf database), ours simulated")  # fmt: skip
    for isl, osl in questions:
        answer = ask_peer(isl=isl, osl=osl, ttft_s=slo.ttft_s, tpot_s=slo.tpot_s, gpu=args.gpu, exe=exe)
        sims = {}
        for mode, peer in answer.best.items():
            t0 = time.perf_counter()
            sims[mode] = simulate_at(
                peer.layout, peer.request_rate_rps, isl=isl, osl=osl, n=args.requests, slo=slo
            )
            print(f"  simulated {mode} {peer.layout} at {peer.request_rate_rps:.2f} req/s, {args.requests} "
                  f"requests: {time.perf_counter() - t0:.1f} s wall", file=sys.stderr)  # fmt: skip
        t0 = time.perf_counter()
        goodput = {
            mode: goodput_tokens_per_s_per_gpu(
                peer.layout, start_rps=peer.request_rate_rps, isl=isl, osl=osl, n=args.requests, slo=slo
            )
            for mode, peer in answer.best.items()
        }
        print(f"  goodput searches: {time.perf_counter() - t0:.1f} s wall", file=sys.stderr)
        ours = rec
        search = dict(isl=isl, osl=osl, n=args.requests, slo=slo)
        if ours is None and not args.no_recommend:
            picked = answer.best[answer.chosen]
            ours = ask_phaselens(
                isl, osl, picked.request_rate_rps, answer.best["agg"].layout, n=args.requests, slo=slo
            )
        if ours is not None:
            mine = (ours.get("proposed") or {}).get("layout")
            if mine:
                goodput["phaselens"] = goodput_tokens_per_s_per_gpu(
                    mine, start_rps=goodput[answer.chosen][0], **search
                )
        print_question(isl, osl, answer, sims, slo, goodput, ours)
        if rec is None and not args.no_recommend:
            # the same question at the load its pick sustains at the SLOs (the simulator's goodput)
            rate = goodput[answer.chosen][0]
            at_goodput = ask_phaselens(isl, osl, rate, answer.best["agg"].layout, n=args.requests, slo=slo)
            mine = at_goodput["proposed"]["layout"]
            again = goodput_tokens_per_s_per_gpu(mine, start_rps=rate, **search)
            print_phaselens(at_goodput, osl, answer, again)
    return 0


if __name__ == "__main__":
    sys.exit(main())
