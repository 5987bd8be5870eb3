"""The simulator's executor: the GPU model's estimate of a batch, cached exactly unless rounding is asked."""

from serving.config import preset
from serving.devices.base import IterationWork
from serving.devices.gpu_model import predict_iteration
from serving.devices.gpu_specs import gpu_spec
from serving.scheduler import IterationTally
from serving.sim.executor import GpuModelExecutor, round_bits
from serving.sim.layout import parse_layout

SHAPE = preset("llama-3.1-8b")
POOL = parse_layout("agg:1xh100-sxm").pools[0]


def _decode(batch: int, context: int) -> IterationTally:
    return IterationTally("decode", 0, batch, context, batch, context, batch)


def test_cached_estimates_are_the_models_own() -> None:
    ex = GpuModelExecutor(gpu_spec("h100-sxm"), SHAPE, POOL)
    for work in (_decode(8, 40_001), _decode(8, 40_002), _decode(8, 40_001)):
        assert ex.estimate(work) == predict_iteration("h100-sxm", SHAPE, IterationWork(*work), tp=1)
    assert (ex.hits, ex.misses) == (1, 2)


def test_rounding_the_context_shares_estimates_within_its_bound() -> None:
    ex = GpuModelExecutor(gpu_spec("h100-sxm"), SHAPE, POOL, context_bits=10)
    a, b = ex.estimate(_decode(8, 40_001)), ex.estimate(_decode(8, 40_030))
    assert a is b and (ex.hits, ex.misses) == (1, 1)
    exact = predict_iteration("h100-sxm", SHAPE, IterationWork(*_decode(8, 40_030)), tp=1)
    assert abs(b.time_s - exact.time_s) / exact.time_s < 2**-10


def test_round_bits() -> None:
    assert round_bits(1023, 10) == 1023
    assert round_bits(40_001, 10) == round_bits(40_030, 10) == 40_000  # steps of 64 above 2^15
    assert all(abs(round_bits(x, 10) - x) / x <= 2**-10 for x in range(1, 200_000, 97))
