"""A gateway in a child process doing keyed inserts, for the crash test (killed with SIGKILL).

Usage: ``python -m tests.gateway.crash_worker DSN COUNT CONCURRENCY``. Inserts ``n`` for
every ``n`` in ``range(COUNT)`` into ``crash_writes`` with idempotency key ``w-<n>``, from
``CONCURRENCY`` tasks, and prints ``ready`` once connected, then ``done <n> <status>`` after
each write (flushed at once, so the parent can kill it between or during writes), then
``finished``. Retryable refusals are retried with the same key.
"""

from __future__ import annotations

import asyncio
import sys

from corral.gateway._errors import GatewayError
from corral.gateway._gateway import Gateway

AGENT = "crash-agent"


def insert(n: int) -> dict[str, object]:
    return {
        "op": "insert",
        "table": "crash_writes",
        "values": {"n": n},
        "idempotency_key": f"w-{n}",
    }


async def main(dsn: str, count: int, concurrency: int) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(count):
        queue.put_nowait(n)
    async with Gateway.connect(dsn, pool_size=concurrency) as gw:
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
