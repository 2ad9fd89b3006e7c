"""``make run``: the daemon on http://127.0.0.1:4600 with an example team under supervision.

The team (examples/team/team.json) is a lead with command-harness workers:
- indexer always succeeds;
- fetcher fails now and then and is retried (onFailure retry, maxRetries 2);
- billing keeps failing, so the circuit breaker holds it (circuit-tripped);
- deployer's failure is sent to a person (onFailure ask): it waits in `corral decisions`;
- auditor reads the shop database (.corral/shop.db, given to the daemon as
  ``--db shop=...``) through the gateway, and keeps reading empty answers as absence until
  the gateway freezes it: the freeze waits in `corral decisions` too;
- releaser is a shell worker that asks before it deploys (``corral check "deploy ..." ||
  exit 3``): its spec's guardrails send deploys to a person, so it waits, and the approval
  waits in `corral decisions` until someone runs `corral approve ID` (or `deny`);
- coordinator (``wake: true``, ``mayAnswer: ["blocked"]``) resolves its held worker by itself:
  counter asks the gateway for table ``order``, which does not exist, and is held (onFailure
  ask); the notice wakes coordinator, which reads the gateway's "did you mean orders?" in
  counter's error through `corral agents` and re-prompts it (`corral prompt`, its own
  token) with the table's name; counter succeeds, and its "done" wakes coordinator again,
  which reports it.
Spawning uses idempotency keys, so running this again on the same store adds no second team.
Every 15 s indexer and fetcher get a new prompt (for 10 minutes), so events keep coming.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import httpx

from corral.console import Console, console_url
from corral.daemon import ServeConfig, read_token_file, serve, token_path
from corral.daemon._server import log_to_stderr

HERE = Path(__file__).resolve().parent
ROUNDS = 40
EVERY_S = 15.0


STATUSES = ("paid", "shipped", "refunded", "open")


def ensure_shop(path: Path) -> Path:
    """Create the shop at ``path`` unless it exists; idempotent."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp)
    try:
        conn.executescript(
            """
            CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL,
                                    country TEXT NOT NULL);
            CREATE TABLE orders (id INTEGER PRIMARY KEY,
                                 customer_id INTEGER NOT NULL REFERENCES customers (id),
                                 status TEXT NOT NULL, total NUMERIC NOT NULL);
            """
        )
        conn.executemany(
            "INSERT INTO customers VALUES (?, ?, ?)",
            [(1, "Alice", "FR"), (2, "Bob", "DE"), (3, "Chloe", "US"), (4, "Dario", "IT")],
        )
        conn.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?)",
            [(i, 1 + i % 4, STATUSES[i % len(STATUSES)], 10 + 7 * i) for i in range(1, 25)],
        )
        conn.commit()
    finally:
        conn.close()
    tmp.replace(path)  # whole or not at all
    return path


def team_specs() -> list[dict[str, Any]]:
    specs: list[dict[str, Any]] = json.loads((HERE / "team.json").read_text())
    for spec in specs:
        uses_cli = "CORRAL_CLI" in spec.get("env", {})
        if uses_cli or any("CORRAL_CLI" in part for part in spec["command"]):
            # The `corral` command of this environment, for shell workers.
            cli = Path(sys.executable).with_name("corral")
            spec["env"] = {**spec.get("env", {}), "CORRAL_CLI": str(cli)}
        spec["command"] = [
            sys.executable
            if part == "python"
            else part.replace("{worker}", str(HERE / "worker.py"))
            for part in spec["command"]
        ]
    return specs


async def spawn_team(url: str) -> None:
    ids: dict[str, str] = {}
    run_id = ""
    # The daemon's token: CORRAL_TOKEN if set (the daemon takes it too), else the one it made
    # in .corral/token (or $CORRAL_HOME/token), which `corral` also reads by itself.
    token = os.environ.get("CORRAL_TOKEN") or read_token_file(token_path())
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
            run_id = answer.json()["runId"]
        print("team: " + ", ".join(f"{name} {agent}" for name, agent in ids.items()), flush=True)
        print(
            "Try in another terminal:\n"
            "  .venv/bin/corral agents\n"
            "  .venv/bin/corral events --follow\n"
            "  .venv/bin/corral decisions            # the releaser's approval, the holds\n"
            '  .venv/bin/corral approve ID --why "release checked"   # the approval\'s id\n'
            f'  .venv/bin/corral prompt {ids["deployer"]} "go ahead" --why "release checked"\n'
            f"  .venv/bin/corral inbox {ids['coordinator']}   # the notices that woke it\n"
            f"  .venv/bin/corral session {ids['counter']}   # its task, the failure, the fix\n"
            f"  .venv/bin/corral run {run_id}   # the team as a tree, usage against limits\n"
            "  .venv/bin/corral gateway status\n"
            f"  .venv/bin/corral gateway reinstate {ids['auditor']} --target shop "
            '--reason "filter fixed"\n'
            "  .venv/bin/corral gateway query me "
            '"SELECT status, count(*) FROM orders GROUP BY status"\n'
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
        where = "CORRAL_TOKEN" if os.environ.get("CORRAL_TOKEN") else str(token_path())
        print(f"console: {console_url(url)}  (log in with the token in {where})", flush=True)
        task = asyncio.get_running_loop().create_task(spawn_team(url))
        tasks.add(task)

    log_to_stderr()
    port = int(os.environ.get("CORRAL_PORT", "4600"))
    shop = ensure_shop(Path(".corral") / "shop.db")
    await serve(ServeConfig(port=port, databases={"shop": str(shop)}), ready=ready, front=Console)
    for task in tasks:
        task.cancel()


if __name__ == "__main__":
    asyncio.run(main())
