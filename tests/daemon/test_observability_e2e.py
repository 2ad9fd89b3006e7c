"""Metrics, traces and logs through a real ``corral serve``: a small team's turns and a
database's requests scraped from ``GET /metrics`` and parsed by prometheus-client's parser,
the turns' spans received over OTLP/HTTP by a collector stand-in, the log lines JSON."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from corral.runtime._tracing import otel_trace_id
from tests.daemon.test_metrics import samples, value
from tests.support.serve_process import ServeProcess, until_state, wait_for


class _Collector(BaseHTTPRequestHandler):
    received: list[bytes]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path == "/v1/traces":
            self.received.append(body)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[bytes]]]:
    """An OTLP/HTTP endpoint on loopback that keeps what it is sent."""
    received: list[bytes] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def spans_of(received: list[bytes]) -> list[Any]:
    found = []
    for body in received:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                found.extend(scope.spans)
    return found


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in span.attributes:
        kind = item.value.WhichOneof("value")
        out[item.key] = getattr(item.value, kind)
    return out


@pytest.mark.timeout(90)
def test_a_team_s_activity_in_metrics_traces_and_json_logs(
    tmp_path: Path, collector: tuple[str, list[bytes]]
) -> None:
    endpoint, received = collector
    shop = tmp_path / "shop.db"
    with sqlite3.connect(shop) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        db.execute("INSERT INTO orders VALUES (1, 9.5)")
    args = ("--db", f"shop=sqlite:///{shop}", "--log-format", "json", "--otlp-endpoint", endpoint)
    daemon = ServeProcess(tmp_path, *args)
    with daemon, daemon.client() as api:
        worker = {"harness": "command", "command": ["sh", "-c", "echo done"], "prompt": "go"}
        good = api.post("/agents", json={**worker, "name": "good"}).json()["id"]
        bad_spec = {**worker, "name": "bad", "command": ["sh", "-c", "exit 3"]}
        bad = api.post("/agents", json=bad_spec).json()["id"]
        until_state(api, good, "idle")
        until_state(api, bad, "failed")
        ok = api.post("/gateway/query", json={"agent": good, "sql": "SELECT * FROM orders"})
        assert ok.status_code == 200, ok.text
        refused = api.post("/gateway/query", json={"agent": good, "sql": "SELECT * FROM x"})
        assert refused.status_code == 400

        def scraped() -> dict[Any, float] | None:
            found = samples(api.get("/metrics").text)
            ended = sum(
                value(found, "corral_turns_total", harness="command", outcome=outcome)
                for outcome in ("completed", "failed")
            )
            return found if ended == 2 else None

        found = wait_for(scraped, "both turns in the metrics")
        assert value(found, "corral_turns_total", harness="command", outcome="completed") == 1
        assert value(found, "corral_turns_total", harness="command", outcome="failed") == 1
        assert value(found, "corral_turn_duration_seconds_count", harness="command") == 2
        assert value(found, "corral_agents", state="idle") == 1
        assert value(found, "corral_agents", state="failed") == 1
        assert value(found, "corral_decisions_pending", kind="blocked") == 0
        requests = "corral_gateway_requests_total"
        assert value(found, requests, target="shop", outcome="genuinely_empty") == 0
        assert value(found, requests, target="shop", outcome="ok") == 1
        assert value(found, requests, target="shop", outcome="unknown_table") == 1
        assert value(found, "corral_gateway_frozen_agents", target="shop") == 0
        # An agent's token never reads the daemon's numbers; no token at all is refused too.
        with daemon.client(daemon.agent_token(good)) as as_agent:
            assert as_agent.get("/metrics").status_code == 403
        with daemon.client(None) as anonymous:
            assert anonymous.get("/metrics").status_code == 401
        runs = {a: api.get(f"/agents/{a}").json()["runId"] for a in (good, bad)}
        log = daemon.log()

    # Stopping the daemon flushed the spans it still had batched.
    def trace_of(agent: str) -> bytes:
        return otel_trace_id(runs[agent]).to_bytes(16, "big")

    turns = {
        attributes(s)["corral.agent.id"]: s for s in spans_of(received) if s.name == "corral.turn"
    }
    assert {a: s.trace_id for a, s in turns.items()} == {good: trace_of(good), bad: trace_of(bad)}
    assert attributes(turns[good])["corral.turn.outcome"] == "completed"
    assert attributes(turns[bad])["corral.turn.outcome"] == "failed"
    queries = [s for s in spans_of(received) if s.name == "corral.gateway.query"]
    # The operator queried for the good agent: its queries join that agent's run's trace.
    assert [q.trace_id for q in queries] == [trace_of(good)] * 2
    assert sorted(attributes(q)["corral.gateway.outcome"] for q in queries) == [
        "ok",
        "unknown_table",
    ]

    lines = [line for line in log.splitlines() if line.strip()]
    logged = [json.loads(line) for line in lines if not line.startswith("corral: listening")]
    assert logged, log
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in logged)
    changes = [e for e in logged if e.get("agentId") == bad and "failed" in e["message"]]
    assert changes, logged
    assert changes[0]["level"] == "INFO"
