"""Bad values on the command line: each is refused with one line naming the flag and what is allowed,
before anything is made or stored (the real `phaselens` entry point, in process)."""

from __future__ import annotations

import pytest

from collector.store import Store
from phaselens.cli import attach_dash_values, build_parser, main


@pytest.fixture
def empty_store(tmp_path):
    db = tmp_path / "s.duckdb"
    Store.open(db).close()
    return db


def _reports(db) -> int:
    with Store.open(db, read_only=True) as store:
        return int(store.query("SELECT count(*) AS n FROM reports")["n"].iloc[0])


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_a_negative_since_reaches_the_span_check(command, empty_store, capsys):
    # argparse alone read `--since -5m` as a missing value ("expected one argument") after the usage
    assert main([command, "--db", str(empty_store), "--since", "-5m"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        f"phaselens {command}: error: time span since='-5m' must be > 0 and at most 36500d (3153600000 s); "
        "use e.g. 90s, 30m, 1h or 2d"
    )
    assert _reports(empty_store) == 0


def test_a_negative_from_store_span_reaches_its_check(empty_store, capsys):
    argv = ["simulate", "--layout", "agg:1xh100-sxm", "--from-store", "-1h", "--db", str(empty_store)]
    assert main(argv) == 2
    assert (
        capsys.readouterr().err.strip()
        == "phaselens simulate: error: --from-store: time span '-1h' must be > 0 and at most 36500d "
        "(3153600000 s); use e.g. 90s, 30m, 1h or 2d"
    )


def test_only_a_one_value_option_takes_a_dash_value():
    parser = build_parser()
    argv = ["analyze", "--since", "-5m", "--json", "--node", "-1", "--start-s=-3", "--", "--since", "-2h"]
    assert attach_dash_values(parser, argv) == [
        "analyze",
        "--since=-5m",
        "--json",
        "--node=-1",
        "--start-s=-3",
        "--",
        "--since",
        "-2h",
    ]
    # a flag keeps its neighbour; an option name after a one-value option stays an option
    assert attach_dash_values(parser, ["analyze", "--json", "-5"]) == ["analyze", "--json", "-5"]
    assert attach_dash_values(parser, ["analyze", "--since", "--json"]) == ["analyze", "--since", "--json"]
    assert attach_dash_values(parser, ["--help"]) == ["--help"]


@pytest.mark.parametrize("flag", ["--out", "--json-out"])
def test_report_refuses_an_output_it_cannot_write_before_making_the_report(
    flag, empty_store, tmp_path, capsys
):
    missing = tmp_path / "absent" / "r.html"
    assert main(["report", "--db", str(empty_store), flag, str(missing)]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"phaselens report: error: {flag} {missing}: the folder {missing.parent} does not exist"
    )
    assert main(["report", "--db", str(empty_store), flag, str(tmp_path)]) == 2
    assert "is a folder; give a file name" in capsys.readouterr().err
    assert _reports(empty_store) == 0  # nothing was made and stored
    assert not missing.parent.exists()


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--scrape-timeout-s", "0", "--scrape-timeout-s must be in [0.1, 300] s, got 0"),
        ("--max-page-bytes", "10", "--max-page-bytes must be in [1024, 1073741824] (1 KiB to 1 GiB), got 10"),
        ("--max-backoff-s", "0.5", "--max-backoff-s must be in [1, 3600] s, got 0.5"),
    ],
)
def test_scrape_limits_out_of_range_are_refused(flag, value, says, tmp_path, capsys):
    db = tmp_path / "never.duckdb"
    assert main(["collect", "--db", str(db), "--no-nvml", flag, value]) == 2
    assert capsys.readouterr().err.strip() == f"phaselens collect: error: {says}"
    assert not db.exists()  # refused before the store was made


def test_scrape_limits_reach_the_sources():
    from phaselens.cli.collect import collect_settings

    limits = ["--scrape-timeout-s", "2", "--max-page-bytes", "65536", "--max-backoff-s", "3"]
    args = build_parser().parse_args(
        [
            "collect",
            "--no-nvml",
            "--dcgm",
            "http://d:9400/metrics",
            "--engine",
            "http://v:8000/metrics",
            *limits,
        ]
    )
    sources = collect_settings(args).build_sources()
    assert [(s.timeout_s, s.max_page_bytes, s.backoff.max_s) for s in sources] == [(2.0, 65536, 3.0)] * 2
    for s in sources:
        s.close()


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "--db", "DB"],
        ["simulate", "--layout", "agg:1xh100-sxm", "--no-store"],
        ["goodput", "--layout", "agg:1xh100-sxm"],
        ["recommend", "--layout", "agg:8xh100-sxm:tp2", "--poisson", "2", "--num-requests", "5"],
    ],
    ids=lambda argv: argv[0],
)
@pytest.mark.parametrize(
    ("flag", "value"), [("--slo-ttft-ms", "0"), ("--slo-tpot-ms", "-5"), ("--slo-ttft-ms", "inf")]
)
def test_an_slo_in_ms_out_of_range_is_named_in_ms(argv, flag, value, empty_store, capsys):
    """Every command's ms SLO option is checked in ms: the message names the option, its unit
    (milliseconds, never "seconds") and what is allowed, before anything is simulated or read."""
    argv = [str(empty_store) if a == "DB" else a for a in argv]
    assert main([*argv, flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"must be a finite number of milliseconds > 0, got {value}"), err
    assert flag in err and " seconds" not in err
    assert err.count("\n") == 0
