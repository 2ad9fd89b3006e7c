"""``make run``: the daemon on http://127.0.0.1:4600 with an example team under supervision.

The team (examples/team/team.json) is a lead with four command-harness workers:
- indexer always succeeds;
- fetcher fails now and then and is retried (onFailure retry, maxRetries 2);
- billing keeps failing, so the circuit breaker holds it (circuit-tripped);
- deployer's failure is sent to a person (onFailure ask): it waits in `corral decisions`.
Spawning uses idempotency keys, so running this again on the same store adds no second team.
Every 15 s indexer and fetcher get a new prompt (for 10 minutes), so events keep coming.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from corral.daemon import ServeConfig, serve
from corral.daemon._server import log_to_stderr

HERE = Path(__file__).resolve().parent
ROUNDS = 40
EVERY_S = 15.0


def team_specs() -> list[dict[str, Any]]:
    specs: list[dict[str, Any]] = json.loads((HERE / "team.json").read_text())
    for spec in specs:
        spec["command"] = [
            sys.executable
            if part == "python"
            else part.replace("{worker}", str(HERE / "worker.py"))
            for part in spec["command"]
        ]
    return specs


async def spawn_team(url: str) -> None:
    ids: dict[str, str] = {}
    token = os.environ.get("CORRAL_TOKEN")  # the daemon takes it too (ServeConfig)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
        for spec in team_specs():
            if "parent" in spec:
                spec["parent"] = ids[spec["parent"]]
            body = {**spec, "idempotencyKey": f"example-team-{spec['name']}"}
            answer = await client.post("/agents", json=body)
            if answer.status_code >= 400:
                print(f"team: could not spawn {spec['name']}: {answer.text}", flush=True)
                return
            ids[spec["name"]] = answer.json()["id"]
        print("team: " + ", ".join(f"{name} {agent}" for name, agent in ids.items()), flush=True)
        print(
            "Try in another terminal:\n"
            "  .venv/bin/corral agents\n"
            "  .venv/bin/corral events --follow\n"
            "  .venv/bin/corral decisions\n"
            f'  .venv/bin/corral prompt {ids["deployer"]} "go ahead" --by you '
            '--why "release checked"\n'
            "Ctrl-C stops the daemon; `make run` again picks up where it left off.",
            flush=True,
        )
        for _ in range(ROUNDS):
            await asyncio.sleep(EVERY_S)
            for name in ("indexer", "fetcher"):
                agent = (await client.get(f"/agents/{ids[name]}")).json()
                if agent.get("state") == "idle":
                    await client.post(f"/agents/{ids[name]}/prompt", json={"text": "next batch"})


async def main() -> None:
    tasks: set[asyncio.Task[None]] = set()

    def ready(url: str) -> None:
        task = asyncio.get_running_loop().create_task(spawn_team(url))
        tasks.add(task)

    log_to_stderr()
    port = int(os.environ.get("CORRAL_PORT", "4600"))
    await serve(ServeConfig(port=port), ready=ready)
    for task in tasks:
        task.cancel()


if __name__ == "__main__":
    asyncio.run(main())
