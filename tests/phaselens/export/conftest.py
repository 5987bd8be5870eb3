"""The published CRDs the export tests validate against (tests/data/crds/README.md says which
files, from where, and why they are looked up rather than committed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from phaselens.export.crd import load_crd

REPO = Path(__file__).resolve().parents[3]
DGD_CRD = "nvidia.com_dynamographdeployments.yaml"
PCS_CRD = "grove.io_podcliquesets.yaml"
GROVE_EXAMPLE = "tas-disagg-inference.yaml"


def crd_dirs() -> list[Path]:
    """Where the CRDs may lie, first found first: $PHASELENS_CRD_DIR, tests/data/crds, then the
    steering repo's shared/crds (in the checkout, beside it as CI lays it, or at /work/shared)."""
    env = os.environ.get("PHASELENS_CRD_DIR")
    dirs = [Path(env)] if env else []
    return [
        *dirs,
        REPO / "tests/data/crds",
        REPO / "shared/crds",
        REPO.parent / "shared/crds",
        Path("/work/shared/crds"),
    ]


def crd_file(name: str) -> Path:
    """The path of a published CRD file, or a skip that says where it was looked for."""
    for d in crd_dirs():
        if (d / name).is_file():
            return d / name
    pytest.skip(
        f"{name} is in none of {', '.join(map(str, crd_dirs()))} (tests/data/crds/README.md: where it comes from)"
    )


@pytest.fixture(scope="session")
def dgd_crd() -> dict:
    return load_crd(crd_file(DGD_CRD))


@pytest.fixture(scope="session")
def pcs_crd() -> dict:
    return load_crd(crd_file(PCS_CRD))


@pytest.fixture(scope="session")
def grove_example() -> Path:
    return crd_file(GROVE_EXAMPLE)
