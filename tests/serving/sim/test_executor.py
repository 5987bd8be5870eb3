"""The simulator's executor: the GPU model's estimate of a batch, cached exactly unless rounding is asked;
the busy intervals' values of each estimate, a row of its table."""

from serving.config import preset
from serving.devices.base import IterationWork
from serving.devices.gpu_model import predict_iteration
from serving.devices.gpu_specs import gpu_spec
from serving.scheduler import IterationTally
from serving.sim.executor import GpuModelExecutor, round_bits
from serving.sim.layout import parse_layout
from serving.sim.records import Busy, BusyTable, busy_values

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


def test_each_execution_names_its_estimates_busy_values_row() -> None:
    ex = GpuModelExecutor(gpu_spec("h100-sxm"), SHAPE, POOL)
    works = [_decode(8, 40_001), _decode(4, 9_000), _decode(8, 40_001)]
    rows = [ex._entry(w)[2] for w in works]
    assert rows[0] == rows[2] != rows[1]  # one row per distinct estimate, shared by its hits
    for work, row in zip(works, rows, strict=True):
        values = tuple(column[row] for column in ex.busy_table.columns)
        assert values == busy_values(ex.estimate(work))


def test_busy_intervals_settle_each_iterations_values_from_its_row() -> None:
    table = BusyTable()
    a = table.add((500.0, 1980, 0.9, 0.5, 0.6, 0.7, 0.4, False))
    b = table.add((350.5, 1755, 0.2, 0.1, 0.0, 0.8, 1.0, True))
    busy = Busy(table)
    for i, row in enumerate([a, b, b]):
        busy.add(float(i), i + 0.5, row, 100 * i)
    busy.settle()
    busy.add(3.0, 3.5, a, 300)  # settled again later: only the new iteration is appended
    busy.settle()
    assert list(busy.power_w) == [500.0, 350.5, 350.5, 500.0]
    assert list(busy.sm_clock_mhz) == [1980, 1755, 1755, 1980]
    assert list(busy.mem_active) == [0.4, 1.0, 1.0, 0.4]
    assert list(busy.capped) == [0, 1, 1, 0]
    assert list(busy.kv_bytes) == [0, 100, 200, 300] and list(busy.end_s) == [0.5, 1.5, 2.5, 3.5]
