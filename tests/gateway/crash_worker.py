"""The crash test's two halves: a gateway in a child process doing keyed inserts, and the
parent that kills it with SIGKILL at random points.

Child: ``python -m tests.gateway.crash_worker ENGINE TARGET COUNT CONCURRENCY`` (ENGINE
``postgresql`` with a DSN, or ``sqlite`` with a file path). Inserts ``n`` for every ``n`` in
``range(COUNT)`` into ``crash_writes`` with idempotency key ``w-<n>`` (even ``n`` as SQL, odd
``n`` as a structured insert), from ``CONCURRENCY`` tasks. Prints ``ready`` once open, then
``done <n> <status>`` after each write (flushed at once, so the parent can kill it between
or during writes), then ``finished``. Retryable refusals are retried with the same key.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

from corral.gateway import Gateway, GatewayError, SQLiteGateway

AGENT = "crash-agent"
REPO = Path(__file__).resolve().parents[2]


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


async def kill_at_random_points(engine: str, target: str, count: int, seed: int) -> int:
    """Start the child up to six times, each time killing it with SIGKILL a random moment
    after a random number of its writes (before, during or after a commit), until it
    finishes; the number of kills."""
    rng = random.Random(seed)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])}
    kills = 0
    for _ in range(6):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.gateway.crash_worker",
            engine,
            target,
            str(count),
            "4",
            cwd=REPO,
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        wanted = rng.randint(5, 40)
        done = 0
        finished = False
        try:
            while done < wanted:
                line = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode()
                assert line, f"worker exited early (seed {seed})"
                if line.startswith("finished"):
                    finished = True
                    break
                done += line.startswith("done ")
            if not finished:
                await asyncio.sleep(rng.uniform(0, 0.004))
                proc.send_signal(signal.SIGKILL)
                kills += 1
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        if finished:
            break
    return kills


async def main(engine: str, target: str, count: int, concurrency: int) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(count):
        queue.put_nowait(n)
    connector = (
        Gateway.connect(target, pool_size=concurrency)
        if engine == "postgresql"
        else SQLiteGateway.connect(target, breaker=None)
    )
    async with connector as gw:
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
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
