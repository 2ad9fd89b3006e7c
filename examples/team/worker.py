"""An example worker for the command harness: the prompt on stdin, the result on stdout.

``python worker.py MODE``:
- ``steady``: always succeeds;
- ``flaky``: fails the first attempt of every third prompt, so a retry recovers it;
- ``broken``: always fails (a missing credential), so the circuit breaker trips;
- ``careful``: fails once, and its failures go to a person;
- ``auditor``: reads the shop database through the daemon's gateway, then hunts for orders
  with statuses that do not exist: every empty answer is ``suspiciously_empty`` (the table
  has rows, the filter matched none), and after five of them the gateway freezes it until a
  person reinstates it (``corral gateway reinstate``);
- ``counter``: counts the refunded orders in the table its prompt names last ("table X", "the
  table is called X") through the gateway; a table that does not exist fails the turn, with
  the gateway's "did you mean ...?" in the error;
- ``coordinator``: a parent with ``wake: true``, run by the daemon when its children's notices
  reach it (the notices are its prompt). With the ``corral`` command line (``$CORRAL_CLI``,
  its own token) it lists its children and re-prompts each one held on a table that does not
  exist with the table the gateway suggested; a child that finished is reported.
It keeps a counter in its own working directory, which lives as long as the agent.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def attempt() -> int:
    counter = Path("attempts.txt")
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    return n


def gateway(request: dict[str, Any]) -> dict[str, Any]:
    """One request to the daemon's gateway as this agent; the answer or the error body."""
    body = {"target": "shop", "agent": os.environ["CORRAL_AGENT_ID"], **request}
    headers = {"Content-Type": "application/json"}
    if os.environ.get("CORRAL_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['CORRAL_TOKEN']}"
    call = urllib.request.Request(
        os.environ["CORRAL_URL"] + "/gateway/query",
        data=json.dumps(body).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(call, timeout=30) as answer:
            result: dict[str, Any] = json.load(answer)
            return result
    except urllib.error.HTTPError as exc:
        error: dict[str, Any] = json.load(exc)
        return error


def audit(agent: str) -> int:
    refunded = gateway({"op": "count", "table": "orders", "where": {"status": "refunded"}})
    if "error" in refunded:
        print(f"{agent}: the gateway refused: {refunded['error']['code']}")
        return 0
    print(f"{agent}: {refunded['rows'][0]['count']} refunded orders")
    for status in ("lost", "missing", "misplaced", "unknown", "stolen", "gone"):
        found = gateway({"op": "find", "table": "orders", "where": {"status": status}})
        if "error" in found:
            print(f"{agent}: the gateway stopped me: {found['error']['code']}")
            return 0
        print(f"{agent}: status {status!r}: {found['rowCount']} rows ({found['emptiness']})")
    return 0


def count(agent: str, prompt: str) -> int:
    tables = re.findall(r"table (?:is called )?([A-Za-z_][\w.]*)", prompt)
    table = tables[-1] if tables else "orders"
    found = gateway({"op": "count", "table": table, "where": {"status": "refunded"}})
    if "error" in found:
        print(f"{agent}: {found['error']['code']}: {found['error']['message']}", file=sys.stderr)
        return 1
    print(f"{agent}: {found['rows'][0]['count']} refunded orders in table {table}")
    return 0


def corral(*args: str) -> str:
    """One ``corral`` command as this agent (CORRAL_URL and CORRAL_TOKEN are its own)."""
    done = subprocess.run(
        [os.environ["CORRAL_CLI"], *args], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


def coordinate(agent: str) -> int:
    me = os.environ["CORRAL_AGENT_ID"]
    # The list holds summaries (no output): each child's record in full comes from `show`.
    listed = json.loads(corral("agents", "--parent", me, "--json"))
    children = [json.loads(corral("show", a["id"], "--json")) for a in listed]
    for child in children:
        error = child.get("lastError") or ""
        suggested = re.search(r"did you mean ([\w.]+)", error)
        if child["state"] == "blocked" and suggested:
            table = suggested.group(1).rstrip("?")
            corral(
                "prompt",
                child["id"],
                f"count the refunded orders: the table is called {table}",
                "--why",
                f"the gateway says the table is {table}",
            )
            print(f"{agent}: re-prompted {child['name']}: the table is called {table}")
        elif child["state"] == "blocked":
            print(f"{agent}: {child['name']} is held and needs a person: {error}")
        elif child["state"] == "idle" and child.get("lastOutput"):
            print(f"{agent}: {child['name']} reported: {child['lastOutput'].strip()}")
    return 0


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "steady"
    prompt = sys.stdin.read().strip()
    agent = os.environ.get("CORRAL_AGENT_NAME", "worker")
    n = attempt()
    if mode == "auditor":
        return audit(agent)
    if mode == "counter":
        return count(agent, prompt)
    if mode == "coordinator":
        return coordinate(agent)
    if mode == "flaky" and n % 3 == 1:
        print(f"{agent}: upstream timed out on attempt {n}", file=sys.stderr)
        return 1
    if mode == "broken":
        print(f"{agent}: credential BILLING_API_KEY is not set", file=sys.stderr)
        return 2
    if mode == "careful" and n == 1:
        print(f"{agent}: refusing to touch production without a person's go-ahead", file=sys.stderr)
        return 3
    last_line = prompt.splitlines()[-1] if prompt else ""
    print(f"{agent} finished attempt {n}: {last_line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
