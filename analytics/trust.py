"""Trust labels: where a figure comes from, carried by every result of the analytics.

``measured`` (NVML, DCGM, an engine's own metrics), ``emulated`` (a modeled GPU paced by real work),
``simulated`` (virtual time), ``host-bound`` (an emulated window the host could not keep pace with),
``estimated`` (percentiles from Prometheus histogram buckets, energy integrated from power, phase
shares inferred from engine metrics), ``unvalidated`` (a modeled figure on a GPU or precision the GPU
model was never checked against measurements on: ``serving.devices.gpu_specs.fidelity``). A figure built from several sources carries all their labels;
``notes`` say how (a fallback taken, a bucket bound, a fit's quality). Row labels come from the
store's ``trust_label(node, source, emulated)`` macro, the one SQL definition.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

MEASURED = "measured"
EMULATED = "emulated"
SIMULATED = "simulated"
HOST_BOUND = "host-bound"
ESTIMATED = "estimated"
UNVALIDATED = "unvalidated"
LABELS = (MEASURED, EMULATED, SIMULATED, HOST_BOUND, ESTIMATED, UNVALIDATED)
#: what each label says of a figure, in words (the reports' legend)
MEANINGS = {
    MEASURED: "read from the hardware or the engine (NVML, DCGM, engine metrics)",
    EMULATED: "from a modelled GPU paced by the real work it ran",
    SIMULATED: "from the simulator, in virtual time: a model, not a measurement",
    HOST_BOUND: "from emulated windows the host could not keep pace with",
    ESTIMATED: "derived: percentiles from histogram buckets, energy integrated from power, shares inferred",
    UNVALIDATED: "from the GPU model on a GPU or precision (B200, GB200, FP8) no measurement has checked it on",
}


@dataclass(slots=True)
class Trust:
    """The labels of one figure (or table) and the notes that explain them."""

    labels: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def add(self, label: str, note: str | None = None) -> Trust:
        if label not in LABELS:
            raise ValueError(f"unknown trust label {label!r}; allowed: {', '.join(LABELS)}")
        self.labels.add(label)
        if note and note not in self.notes:
            self.notes.append(note)
        return self

    def merge(self, others: Iterable[Trust]) -> Trust:
        for o in others:
            self.labels |= o.labels
            self.notes += [n for n in o.notes if n not in self.notes]
        return self

    def to_dict(self) -> dict[str, list[str]]:
        return {"labels": [label for label in LABELS if label in self.labels], "notes": list(self.notes)}

    def __str__(self) -> str:
        return ", ".join(label for label in LABELS if label in self.labels) or "no data"
