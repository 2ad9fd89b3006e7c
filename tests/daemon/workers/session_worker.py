"""A command agent that works from its session (``CORRAL_SESSION_FILE``), for the session tests.

Its task is the first prompt of its session (or this turn's prompt, on its first turn). It
needs to know the table's name: until a prompt says ``users_v2`` it fails, as a worker
querying the wrong table would. Its output says what it did and how much it had been told.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    prompt = sys.stdin.read()
    with open(os.environ["CORRAL_SESSION_FILE"], encoding="utf-8") as lines:
        session = [json.loads(line) for line in lines]
    told = [m["content"] for m in session if m["role"] == "user"]
    task = told[0] if told else prompt
    if os.environ.get("NEEDS_TABLE") and "users_v2" not in prompt:
        print('relation "users" does not exist', file=sys.stderr)
        return 1
    print(json.dumps({"task": task, "prompt": prompt, "seen": len(session)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
