"""Action checks (``POST /agents/{id}/actions``) against ``GET /healthz`` on the same server.

Goal (issue 11): a check with 3 allowing rules costs little more than the HTTP round trip.
Run with ``.venv/bin/python -m bench bench_oversight``.

A real ``corral serve`` runs in a subprocess on loopback, with an explicit bearer token that
every request carries; one persistent ``httpx.Client`` sends the requests one at a time, one
of each case in turn (after a warm-up), so that drift on a shared machine weighs on every case
alike. Then ``AgentService.check_action`` is timed alone, in this process, on agents with the
same rules (no HTTP), the same way.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench._harness import row
from corral.daemon import AgentService, PythonHarness, open_store

WARMUP = 100
REQUESTS = 1_000  # of each case, taken in turn
IN_PROCESS_CALLS = 10_000
BASE = {"harness": "python", "function": "bench._noop_agent:turn"}

# The rules the issue names: an ask and two blocks, none matching the allowed action.
THREE = [
    {"match": "drop table", "verdict": "block", "reason": "no schema changes"},
    {"match": "deploy", "verdict": "ask", "reason": "deploys need a person"},
    {"match": "rm -rf", "verdict": "block"},
]
# The same without the ask (the service skips its approval machinery when no rule asks).
THREE_NO_ASK = [
    {"match": "drop table", "verdict": "block", "reason": "no schema changes"},
    {"match": "truncate", "verdict": "warn"},
    {"match": "rm -rf", "verdict": "block"},
]
# Three allow rules; the action matches the last one, so all three are looked at.
THREE_ALLOW = [
    {"match": "status", "verdict": "allow"},
    {"match": "read", "verdict": "allow"},
    {"match": "list", "verdict": "allow"},
]
# The three as regexes (Python's syntax; `(?i)` ignores case).
THREE_REGEX = [
    {"match": {"regex": r"(?i)\bdrop\s+table\b"}, "verdict": "block"},
    {"match": {"regex": r"(?i)\bdeploy(s|ed|ing)?\b"}, "verdict": "ask"},
    {"match": {"regex": r"(?i)\brm\s+-[a-z]*r[a-z]*f"}, "verdict": "block"},
]
HEALTHZ = "`GET /healthz` (no token check)"
LEAN = "`GET /healthz`, `http.client` instead of httpx (for scale)"
NO_RULES = "check, no rules"
ACTION = "list the files in /srv/app/logs"
BLOCKED = "drop table users"

AGENTS = {
    "none": [],
    "three": THREE,
    "three-no-ask": THREE_NO_ASK,
    "three-allow": THREE_ALLOW,
    "three-regex": THREE_REGEX,
}


@dataclass(frozen=True)
class Case:
    label: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    expect: str | None = None  # the verdict the check must answer


def cases(ids: dict[str, str]) -> list[Case]:
    def check(label: str, agent: str, action: str, expect: str) -> Case:
        return Case(label, "POST", f"/agents/{ids[agent]}/actions", {"action": action}, expect)

    return [
        Case(HEALTHZ, "GET", "/healthz"),
        Case("`GET /agents/{id}` (token checked)", "GET", f"/agents/{ids['none']}"),
        check(NO_RULES, "none", ACTION, "allowed"),
        check("check, 3 rules (block, ask, block), none match", "three", ACTION, "allowed"),
        check("check, 3 rules (block, warn, block), none match", "three-no-ask", ACTION, "allowed"),
        check("check, 3 allow rules, the 3rd matches", "three-allow", ACTION, "allowed"),
        check("check, 3 regex rules, none match", "three-regex", ACTION, "allowed"),
        check("check, 3 rules, the 1st (block) matches", "three", BLOCKED, "blocked"),
    ]


def percentile(ordered: list[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def summary(samples: list[float]) -> tuple[float, float, float]:
    """p50, p99 and mean, in microseconds."""
    ordered = sorted(samples)
    return (
        percentile(ordered, 0.50) * 1e6,
        percentile(ordered, 0.99) * 1e6,
        statistics.fmean(ordered) * 1e6,
    )


def start_server(tmp: Path, token: str) -> tuple[subprocess.Popen[str], str]:
    """A real ``corral serve`` on a free loopback port; answers it and its URL."""
    command = [
        sys.executable,
        "-m",
        "corral.cli",
        "serve",
        "--port",
        "0",
        "--token",
        token,
        "--store",
        f"sqlite:///{tmp / 'corral.db'}",
        "--home",
        str(tmp / "home"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_TOKEN"}
    log = tmp / "serve.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            command, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    assert process.stdout is not None
    line = process.stdout.readline()  # "corral: listening on http://127.0.0.1:PORT (...)"
    if "listening on " not in line:
        process.kill()
        process.wait()
        raise RuntimeError(f"corral serve did not start: {line!r} {log.read_text()[-2000:]}")
    return process, line.split("listening on ", 1)[1].split()[0]


def http_figures(tmp: Path) -> tuple[dict[str, list[float]], list[Case]]:
    token = secrets.token_urlsafe(24)
    process, url = start_server(tmp, token)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            ids = {}
            for name, rules in AGENTS.items():
                spec = {**BASE, "name": name, "guardrails": rules}
                response = client.post("/agents", json=spec)
                response.raise_for_status()
                ids[name] = response.json()["id"]
            measured = cases(ids)
            for case in measured:  # each answers what it should, before it is timed
                response = client.request(case.method, case.path, json=case.body)
                response.raise_for_status()
                if case.expect is not None and response.json()["verdict"] != case.expect:
                    raise RuntimeError(f"{case.label}: {response.json()}")
                for _ in range(WARMUP):
                    client.request(case.method, case.path, json=case.body)
            # For scale: the same healthz through the standard library's leaner client.
            lean = http.client.HTTPConnection(client.base_url.host, client.base_url.port)
            measured.insert(1, Case(LEAN, "GET", "/healthz"))

            def lean_healthz() -> None:
                lean.request("GET", "/healthz")
                lean.getresponse().read()

            for _ in range(WARMUP):
                lean_healthz()
            send, clock = client.request, time.perf_counter
            calls: list[Callable[[], object]] = [
                lean_healthz
                if case.label == LEAN
                else functools.partial(send, case.method, case.path, json=case.body)
                for case in measured
            ]
            samples: dict[str, list[float]] = {case.label: [] for case in measured}
            plan = [(call, samples[case.label]) for call, case in zip(calls, measured, strict=True)]
            for _ in range(REQUESTS):  # one request of each case in turn
                for call, times in plan:
                    started = clock()
                    call()
                    times.append(clock() - started)
            lean.close()
    finally:
        process.terminate()
        process.wait(10)
    return samples, measured


async def in_process_figures(tmp: Path) -> dict[str, list[float]]:
    """``AgentService.check_action`` alone, for the same agents and actions."""
    store = open_store(f"sqlite:///{tmp / 'in-process.db'}")
    await store.open()
    service = AgentService(store, home=tmp / "in-process", harnesses={"python": PythonHarness()})
    await service.start()
    try:
        ids = {}
        for name, rules in AGENTS.items():
            ids[name] = (await service.spawn({**BASE, "name": name, "guardrails": rules})).body[
                "id"
            ]
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "no rules": lambda: service.check_action(ids["none"], ACTION),
            "3 rules (block, ask, block)": lambda: service.check_action(ids["three"], ACTION),
            "3 rules (block, warn, block)": lambda: service.check_action(
                ids["three-no-ask"], ACTION
            ),
            "3 allow rules": lambda: service.check_action(ids["three-allow"], ACTION),
            "3 regex rules": lambda: service.check_action(ids["three-regex"], ACTION),
            "3 rules, blocked": lambda: service.check_action(ids["three"], BLOCKED),
        }
        samples: dict[str, list[float]] = {label: [] for label in calls}
        for call in calls.values():
            for _ in range(WARMUP):
                await call()
        clock = time.perf_counter
        for _ in range(IN_PROCESS_CALLS):  # one call of each check in turn
            for label, call in calls.items():
                started = clock()
                await call()
                samples[label].append(clock() - started)
        return samples
    finally:
        await service.close()
        await store.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        samples, measured = http_figures(Path(tmp))
        local = asyncio.run(in_process_figures(Path(tmp)))
    p50s = {case.label: summary(samples[case.label])[0] for case in measured}
    health, plain = p50s[HEALTHZ], p50s[NO_RULES]

    def share(extra: float) -> str:
        return f"{extra:+,.0f} us ({extra / health * 100:+.0f} %)"

    print(f"HTTP through `corral serve` on loopback, {REQUESTS:,} sequential requests per case:\n")
    print(row("request", "p50", "p99", "mean", "p50 over healthz", "p50 over no rules"))
    print(row("---", "---:", "---:", "---:", "---:", "---:"))
    for case in measured:
        p50, p99, mean = summary(samples[case.label])
        over_plain = "" if case.expect is None else share(p50 - plain)
        cells = (f"{p50:,.0f} us", f"{p99:,.0f} us", f"{mean:,.0f} us", share(p50 - health))
        print(row(case.label, *cells, over_plain))
    print("\n(percentages are of `GET /healthz`'s p50)")
    print(f"\n`AgentService.check_action` in process, {IN_PROCESS_CALLS:,} calls each:\n")
    print(row("check", "p50", "p99", "mean", "p50 over no rules"))
    print(row("---", "---:", "---:", "---:", "---:"))
    alone = summary(local["no rules"])[0]
    for label, times in local.items():
        p50, p99, mean = summary(times)
        cells = (f"{p50:,.1f} us", f"{p99:,.1f} us", f"{mean:,.1f} us", f"{p50 - alone:+,.1f} us")
        print(row(label, *cells))


if __name__ == "__main__":
    main()
