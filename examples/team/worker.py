"""An example worker for the command harness: the prompt on stdin, the result on stdout.

``python worker.py MODE``:
- ``steady``: always succeeds;
- ``flaky``: fails the first attempt of every third prompt, so a retry recovers it;
- ``broken``: always fails (a missing credential), so the circuit breaker trips;
- ``careful``: fails once, and its failures go to a person;
- ``auditor``: reads the shop database through the daemon's gateway, then hunts for orders
  with statuses that do not exist: every empty answer is ``suspiciously_empty`` (the table
  has rows, the filter matched none), and after five of them the gateway freezes it until a
  person reinstates it (``corral gateway reinstate``).
It keeps a counter in its own working directory, which lives as long as the agent.
"""

from __future__ import annotations

import json
import os
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


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "steady"
    prompt = sys.stdin.read().strip()
    agent = os.environ.get("CORRAL_AGENT_NAME", "worker")
    n = attempt()
    if mode == "auditor":
        return audit(agent)
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
