"""``GET /agents`` with 1,000 agents: p50 and p99 of a page, and how big the answer is.

Goal (issue 13, lean lists): the list stays fast and small however much the agents printed.
Each of the 1,000 agents ran one turn whose output is 10 KB, and has a secret in its spec's
env; the app runs in process over httpx's ASGI transport (no sockets), on SQLite. Run with
``.venv/bin/python -m bench bench_list``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench._harness import row
from corral.daemon import AgentService, TurnRequest, TurnResult, create_app, open_store

AGENTS = 1_000
REQUESTS = 200
OUTPUT = "x" * 10_000
SPEC = {"name": "noop", "harness": "command", "command": ["-"], "env": {"API_KEY": "sk-secret"}}


class Printer:
    """A harness whose every turn prints OUTPUT at once (no process: the list is measured)."""

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        return TurnResult(output=OUTPUT)

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False


async def wait_until(check: object, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the agents did not settle")
        await asyncio.sleep(0.05)


async def timings(client: httpx.AsyncClient, params: dict[str, str]) -> tuple[list[float], int]:
    """Milliseconds of each of REQUESTS requests, and the answer's size in bytes."""
    size = len((await client.get("/agents", params=params)).content)  # warm-up
    took = []
    for _ in range(REQUESTS):
        start = time.perf_counter()
        answer = await client.get("/agents", params=params)
        took.append((time.perf_counter() - start) * 1000)
        assert answer.status_code == 200, answer.text
    return took, size


async def measure(home: Path) -> list[str]:
    store = open_store(f"sqlite:///{home / 'corral.db'}")
    await store.open()
    service = AgentService(store, home=home, harnesses={"command": Printer()})
    await service.start()
    for i in range(AGENTS):
        await service.spawn({**SPEC, "name": f"agent-{i}", "prompt": "one turn"})
    await wait_until(lambda: all(a["state"] == "idle" for a in service.list_agents()))
    full = len(json.dumps(service.list_agents()).encode())  # what the list served before
    rows = []
    transport = httpx.ASGITransport(app=create_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        for label, params in [
            ("first page (default limit 100)", {}),
            ("all 1,000 in one page (limit 1000)", {"limit": "1000"}),
            ("page 5 of 10 (limit 100, cursor)", {"limit": "100", "cursor": ""}),
            ("filtered: name=agent-500", {"name": "agent-500"}),
        ]:
            if "cursor" in params:
                cursor = None
                for _ in range(4):
                    page = (
                        await client.get(
                            "/agents",
                            params={"limit": "100", **({"cursor": cursor} if cursor else {})},
                        )
                    ).json()
                    cursor = page["nextCursor"]
                params = {"limit": "100", "cursor": str(cursor)}
            took, size = await timings(client, params)
            took.sort()
            p99 = took[int(len(took) * 0.99) - 1]
            rows.append(
                row(label, f"{statistics.median(took):.2f} ms", f"{p99:.2f} ms", f"{size:,} B")
            )
    rows.append(row("(before: every full record, as JSON)", "", "", f"{full:,} B"))
    await service.close()
    await store.close()
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(measure(Path(tmp)))
    print(f"GET /agents, {AGENTS:,} agents with 10 KB of output each, {REQUESTS} requests\n")
    print(row("request", "p50", "p99", "answer"))
    print(row("---", "---:", "---:", "---:"))
    for line in rows:
        print(line)


if __name__ == "__main__":
    main()
