"""The short form of the soak: `chorus loadtest` with 50 clients for a few seconds against a
server it starts on the tiny checkpoint. Nothing may be lost (every accepted request ends,
and the server holds nothing in flight afterwards), nothing may break the protocol, and
the server's memory may not run away. No timing is asserted: the machine may be slow."""

from __future__ import annotations

import asyncio
import json

import pytest

from server.cli.main import main as cli_main
from server.loadtest.clients import run_load
from server.loadtest.report import passed, rss_summary


def test_short_soak_with_50_clients_loses_nothing(tiny_checkpoint, tmp_path, monkeypatch):
    """`chorus loadtest` runs in this process; the server it starts is its own process, forked
    by the tests' fork server (`tests.support.serverproc.LaunchedServer`)."""
    from server.loadtest import cli as loadtest_cli
    from tests.support.serverproc import LaunchedServer

    monkeypatch.setattr(loadtest_cli, "ServerProcess", LaunchedServer)
    out = tmp_path / "report.json"
    status = cli_main(["loadtest", "--clients", "50", "--seconds", "10", "--num-steps", "2,4", "--rss-every", "0.5",
                       "--out", str(out), "--server-log", str(tmp_path / "server.log"),
                       "--", "--model", str(tiny_checkpoint)])
    report = json.loads(out.read_text())
    assert status == 0 and report["passed"], json.dumps({k: v for k, v in report.items()
                                                         if k != "server_rss_mb"}, indent=1)
    assert report["accepted_but_unfinished"] == 0 and report["server_inflight_after"] == 0
    assert report["protocol_violations"] == 0 and report["connection_errors"] == 0
    assert report["outcomes"]["error"] == 0 and report["refused"] == {}
    assert report["outcomes"]["done"] >= 50 and report["outcomes"]["cancelled"] >= 1
    assert report["accepted"] == report["outcomes"]["done"] + report["outcomes"]["cancelled"] \
        - report["cancelled_before_accept"]
    assert report["server_exit_status"] == 0
    rss = report["server_rss_mb"]
    assert len(rss["samples"]) >= 5 and rss["max"] < rss["first"] + 1024, rss  # generous: no runaway


def test_rss_growth_is_measured_after_warm_up():
    flat = rss_summary([(t, 500.0 + min(t, 2) * 50) for t in range(20)])  # grows while warming up
    assert flat["growth_after_warmup"] == 0 and flat["after_warmup"] == 600.0
    leaking = rss_summary([(t, 500.0 + 10 * t) for t in range(20)])
    assert leaking["growth_after_warmup"] > 50


def test_loadtest_is_a_chorus_subcommand(capsys):
    with pytest.raises(SystemExit) as info:
        cli_main(["loadtest", "--help"])
    assert info.value.code == 0 and "--clients" in capsys.readouterr().out


def _assert_clean(report: dict) -> None:
    shown = json.dumps({k: v for k, v in report.items() if k != "server_rss_mb"}, indent=1)
    assert passed(report), shown
    assert report["accepted_but_unfinished"] == 0 and report["server_inflight_after"] == 0, shown
    assert report["protocol_violations"] == 0 and report["connection_errors"] == 0, shown
    assert report["outcomes"]["error"] == 0 and report["refused"] == {}, shown


def test_paced_clients_send_near_the_rate_and_lose_nothing(chorus_server):
    """Open loop: about rate x seconds requests, from two clients that are idle between sends
    (nothing pending must not end a paced client before its deadline). Loose bounds: the
    arrivals are seeded, but a slow machine may hold sends at the cap."""
    rate, seconds = 4.0, 4.0
    report = asyncio.run(run_load(chorus_server.url, clients=2, seconds=seconds, inflight=2, num_steps=[2],
                                  seed=3, rate_per_s=rate))
    _assert_clean(report)
    assert report["settings"]["rate_per_s"] == rate and report["sends_delayed_at_cap"] >= 0
    assert 0.4 * rate * seconds <= report["sent"] <= 2 * rate * seconds, report["sent"]
    assert report["outcomes"]["done"] >= 1


def test_paced_sends_wait_at_the_cap(chorus_server):
    """A rate far above what one request at a time can serve: sends wait for the one in flight
    (counted), so the server never sees more than `inflight` from a client, and nothing breaks."""
    report = asyncio.run(run_load(chorus_server.url, clients=1, seconds=2.0, inflight=1, num_steps=[2],
                                  cancel_rate=0.0, seed=1, rate_per_s=200.0))
    _assert_clean(report)
    assert report["sends_delayed_at_cap"] >= 1 and report["sent"] < 200 * 2.0
    assert report["outcomes"]["done"] == report["sent"]


def test_closed_loop_reports_no_pacing(chorus_server):
    report = asyncio.run(run_load(chorus_server.url, clients=1, seconds=0.5, inflight=1, num_steps=[2]))
    _assert_clean(report)
    assert "rate_per_s" not in report["settings"] and "sends_delayed_at_cap" not in report


def test_a_rate_must_be_positive():
    with pytest.raises(ValueError):
        asyncio.run(run_load("http://127.0.0.1:9", clients=1, seconds=1.0, rate_per_s=0.0))
