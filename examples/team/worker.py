"""An example worker for the command harness: the prompt on stdin, the result on stdout.

``python worker.py MODE``:
- ``steady``: always succeeds;
- ``flaky``: fails the first attempt of every third prompt, so a retry recovers it;
- ``broken``: always fails (a missing credential), so the circuit breaker trips;
- ``careful``: fails once, and its failures go to a person.
It keeps a counter in its own working directory, which lives as long as the agent.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def attempt() -> int:
    counter = Path("attempts.txt")
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    return n


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "steady"
    prompt = sys.stdin.read().strip()
    agent = os.environ.get("CORRAL_AGENT_NAME", "worker")
    n = attempt()
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
