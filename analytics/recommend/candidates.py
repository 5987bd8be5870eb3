"""The layouts a recommendation searches: structures (aggregated replicas × TP, xPyD with TP per
pool, GPU type) and the engine settings that decide the answer (chunk size via
``max_num_batched_tokens``, chunked prefill on/off, ``max_num_seqs`` per pool).

A candidate is a ``serving.sim.layout`` string (what the simulator, the store and the export read),
built by :func:`layout_text` from a :class:`Structure` and per-role :class:`Settings`. The settings are
searched coarse to fine (:data:`COARSE`, then :func:`fine_settings` around a structure's best).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from analytics.recommend.inputs import tp_degrees
from serving.config import ModelConfig
from serving.sim.layout import Layout

#: chunk sizes (max_num_batched_tokens with chunked prefill on) tried on a mixed pool, fine stage
MIXED_CHUNKS = (256, 512, 1024, 2048, 4096, 8192)
#: max_num_seqs tried per pool that decodes (mixed, decode), fine stage
MAX_SEQS = (64, 128, 256, 512)
#: max_num_batched_tokens tried on a prefill pool, fine stage
PREFILL_TOKENS = (2048, 4096, 8192, 16384)
#: vLLM's defaults (serving.sim.layout.PoolSpec's)
DEFAULT_TOKENS, DEFAULT_SEQS = 8192, 256


@dataclass(frozen=True, slots=True)
class Settings:
    """One pool's engine settings."""

    max_num_batched_tokens: int = DEFAULT_TOKENS
    chunked_prefill: bool = True
    max_num_seqs: int = DEFAULT_SEQS

    def options(self, role: str | None) -> list[str]:
        """Layout options for these settings (``role.`` prefixed when ``role`` is given)."""
        p = f"{role}." if role else ""
        out = []
        if role != "decode":  # a decode pool prefills nothing (its KV arrives from the prefill pool)
            out.append(f"{p}max_num_batched_tokens={self.max_num_batched_tokens}")
            if not self.chunked_prefill:
                out.append(f"{p}chunked_prefill=off")
        if role != "prefill":  # a prefill pool's batch is bounded by its tokens
            out.append(f"{p}max_num_seqs={self.max_num_seqs}")
        return out

    def text(self) -> str:
        chunk = f"chunk {self.max_num_batched_tokens}" if self.chunked_prefill else "no chunking"
        return f"{chunk}, max_num_seqs {self.max_num_seqs}"


@dataclass(frozen=True, slots=True)
class Structure:
    """Which GPUs, split how: ``pools`` is ((role, replicas, tp), ...) — one mixed pool, or a
    prefill and a decode pool."""

    gpu: str
    pools: tuple[tuple[str, int, int], ...]
    extra: tuple[str, ...] = ()  # layout-wide options carried over from the current layout

    @property
    def gpus(self) -> int:
        return sum(n * tp for _, n, tp in self.pools)

    @property
    def aggregated(self) -> bool:
        return self.pools[0][0] == "mixed"

    def roles(self) -> tuple[str, ...]:
        return tuple(r for r, _, _ in self.pools)

    def text(self) -> str:
        if self.aggregated:
            _, n, tp = self.pools[0]
            return f"agg {n}×TP{tp} on {self.gpus} {self.gpu}"
        (_, x, tpp), (_, y, tpd) = self.pools
        return f"{x}P(TP{tpp}) {y}D(TP{tpd}) on {self.gpus} {self.gpu}"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A structure with settings per role; ``layout`` its layout string."""

    structure: Structure
    settings: tuple[tuple[str, Settings], ...] = field(default=())

    @property
    def layout(self) -> str:
        return layout_text(self.structure, dict(self.settings))

    @property
    def gpus(self) -> int:
        return self.structure.gpus

    def setting(self, role: str) -> Settings:
        return dict(self.settings).get(role, Settings())

    def with_setting(self, role: str, s: Settings) -> Candidate:
        d = dict(self.settings)
        d[role] = s
        return replace(self, settings=tuple(sorted(d.items())))


def layout_text(structure: Structure, settings: dict[str, Settings]) -> str:
    """The layout string of ``structure`` with ``settings`` (roles without settings: the defaults)."""
    if structure.aggregated:
        _, n, tp = structure.pools[0]
        parts = [f"agg:{n * tp}x{structure.gpu}:tp{tp}", *settings.get("mixed", Settings()).options(None)]
    else:
        (_, x, tpp), (_, y, tpd) = structure.pools
        parts = [f"{x}p{y}d:{structure.gpu}:prefill.tp={tpp}:decode.tp={tpd}"]
        for role in ("prefill", "decode"):
            parts += settings.get(role, Settings()).options(role)
    return ":".join([*parts, *structure.extra])


def layout_wide_options(current: Layout) -> tuple[str, ...]:
    """The current layout's layout-wide options a candidate keeps (links, engine profile, memory
    utilization), where they differ from the defaults."""
    out = []
    if current.kv_link != "infiniband":
        out.append(f"kv_link={current.kv_link}")
    if current.tp_link != "nvlink":
        out.append(f"tp_link={current.tp_link}")
    if current.profile:
        out.append(f"profile={current.profile}")
    if current.gpu_memory_utilization != 0.9:
        out.append(f"gpu_memory_utilization={current.gpu_memory_utilization:g}")
    return tuple(out)


def structures(
    shape: ModelConfig,
    gpus: Sequence[str],
    budget: int,
    *,
    extra: tuple[str, ...] = (),
    gpu_memory_utilization: float = 0.9,
) -> Iterator[Structure]:
    """Every structure on exactly ``budget`` GPUs of one type of ``gpus``: aggregated ``budget/tp``
    replicas of TP ``tp``; xPyD with a TP per pool (x·tp_p + y·tp_d = budget)."""
    for gpu in gpus:
        tps = tp_degrees(shape, gpu, budget, gpu_memory_utilization)
        for tp in tps:
            if budget % tp == 0:
                yield Structure(gpu, (("mixed", budget // tp, tp),), extra)
        for tpp in tps:
            for tpd in tps:
                for x in range(1, budget // tpp + 1):
                    rest = budget - x * tpp
                    if rest >= tpd and rest % tpd == 0:
                        yield Structure(gpu, (("prefill", x, tpp), ("decode", rest // tpd, tpd)), extra)


def coarse(structure: Structure) -> list[Candidate]:
    """The coarse settings of a structure: a mixed pool with 512- and 8192-token chunks (the
    setting that flips the verdict on disaggregation), the other pools at vLLM's defaults."""
    base = Candidate(structure)
    if structure.aggregated:
        return [base.with_setting("mixed", Settings(max_num_batched_tokens=c)) for c in (512, DEFAULT_TOKENS)]
    return [base.with_setting("prefill", Settings()).with_setting("decode", Settings())]


def fine_settings(best: Candidate, peak_in_flight: float | None = None) -> Iterator[Candidate]:
    """Settings around ``best``, one knob at a time (coarse to fine: the chunk, then the batch).
    ``peak_in_flight``: the most requests a replica held at once in ``best``'s run; a
    ``max_num_seqs`` at or above it changes nothing there, so only lower ones are tried."""
    seqs = [n for n in MAX_SEQS if peak_in_flight is None or n < peak_in_flight]
    if best.structure.aggregated:
        s = best.setting("mixed")
        for c in MIXED_CHUNKS:
            yield best.with_setting("mixed", replace(s, max_num_batched_tokens=c, chunked_prefill=True))
        yield best.with_setting(
            "mixed", replace(s, chunked_prefill=False, max_num_batched_tokens=DEFAULT_TOKENS)
        )
        for n in seqs:
            yield best.with_setting("mixed", replace(s, max_num_seqs=n))
    else:
        for n in seqs:
            yield best.with_setting("decode", replace(best.setting("decode"), max_num_seqs=n))
        for t in PREFILL_TOKENS:
            yield best.with_setting("prefill", replace(best.setting("prefill"), max_num_batched_tokens=t))


def all_settings(structure: Structure) -> Iterator[Candidate]:
    """Every setting combination of a structure (the unpruned search of bench/recommend.py)."""
    base = Candidate(structure)
    if structure.aggregated:
        for n in MAX_SEQS:
            for c in MIXED_CHUNKS:
                yield base.with_setting("mixed", Settings(max_num_batched_tokens=c, max_num_seqs=n))
            yield base.with_setting("mixed", Settings(chunked_prefill=False, max_num_seqs=n))
    else:
        for t in PREFILL_TOKENS:
            for n in MAX_SEQS:
                yield base.with_setting("prefill", Settings(max_num_batched_tokens=t)).with_setting(
                    "decode", Settings(max_num_seqs=n)
                )
