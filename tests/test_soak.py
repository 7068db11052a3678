"""The soak harness (benchmarks/soak.py) for a CI-sized run: a real server at twice its capacity,
abused on purpose, with every one of its checks as an assertion. SHRIKE_SOAK_SECONDS sets the length."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SOAK_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"
SOAK_SECONDS = float(os.environ.get("SHRIKE_SOAK_SECONDS", "60"))


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak", SOAK_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # by path, as `shrike bench soak` loads it
    return module


@pytest.fixture(scope="module")
def summary(soak, default_model_dir, tmp_path_factory):
    args = soak.build_parser().parse_args(["--duration", str(SOAK_SECONDS), "--log-dir",
                                           str(tmp_path_factory.mktemp("soak"))])
    return soak.run(args)


def test_every_request_got_what_it_should(summary):
    outcomes = summary["requests_by_outcome"]
    assert summary["checks"]["every_request_got_what_it_should"], (outcomes, summary["failure_samples"])
    # The mix really happened: served, shed with 503, refused as invalid, and clients leaving in three ways.
    for outcome in ("completed", "overloaded", "refused_as_expected", "client_disconnected", "client_gave_up",
                    "tcp_reset"):
        assert outcomes.get(outcome, 0) > 0, (outcome, outcomes)
    assert summary["tokens_generated"] > 0


def test_no_kv_block_leaked_and_the_server_went_idle(summary):
    assert summary["leaked_blocks"] == 0, summary
    assert summary["stranded_sequences"] == 0, summary
    assert summary["checks"]["idle_afterwards"]


def test_resident_memory_stays_within_its_bound(summary):
    assert summary["checks"]["rss_growth_within_bound"], summary["rss_mib"]


def test_the_step_loop_never_stalled_and_health_stayed_responsive(summary):
    assert summary["checks"]["step_stall_within_bound"], summary["longest_step_stall_s"]
    assert summary["checks"]["health_always_responsive"], (summary["longest_health_s"], summary["health_violations"])
    assert summary["health_checks"] > SOAK_SECONDS  # about two a second


def test_serves_afterwards_and_stops_cleanly(summary):
    assert summary["checks"]["serves_after_the_soak"]
    assert summary["server_exit_code"] == 0
    assert summary["checks"]["no_traceback_in_server_log"], summary["server_log"]
    assert summary["passed"]
