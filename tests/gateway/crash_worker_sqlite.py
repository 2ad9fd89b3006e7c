"""A SQLite gateway in a child process doing keyed inserts, for the crash test (SIGKILLed).

Usage: ``python -m tests.gateway.crash_worker_sqlite PATH COUNT CONCURRENCY``. Inserts ``n``
for every ``n`` in ``range(COUNT)`` into ``crash_writes`` of the SQLite file ``PATH`` with
idempotency key ``w-<n>`` (even ``n`` as SQL, odd ``n`` as a structured insert), from
``CONCURRENCY`` tasks. Prints ``ready`` once open, then ``done <n> <status>`` after each write
(flushed at once, so the parent can kill it between or during writes), then ``finished``.
Retryable refusals are retried with the same key.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from corral.gateway._errors import GatewayError
from corral.gateway._sqlite_gateway import SQLiteGateway

AGENT = "crash-agent"


def insert(n: int) -> dict[str, Any]:
    """The request writing ``n``: SQL for even ``n``, a structured insert for odd ``n``."""
    if n % 2 == 0:
        return {
            "sql": "INSERT INTO crash_writes (n) VALUES ($1)",
            "params": [n],
            "idempotency_key": f"w-{n}",
        }
    return {
        "op": "insert",
        "table": "crash_writes",
        "values": {"n": n},
        "idempotency_key": f"w-{n}",
    }


async def main(path: str, count: int, concurrency: int) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(count):
        queue.put_nowait(n)
    async with SQLiteGateway.connect(path, breaker=None) as gw:
        print("ready", flush=True)

        async def worker() -> None:
            while not queue.empty():
                n = queue.get_nowait()
                while True:
                    try:
                        result = await gw.query(AGENT, insert(n))
                    except GatewayError as exc:
                        if not exc.retryable:
                            raise
                        await asyncio.sleep(0.01)
                        continue
                    print(f"done {n} {result.status}", flush=True)
                    break

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    print("finished", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
