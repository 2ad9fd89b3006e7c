"""Three ``corral serve --node`` daemons on one machine, sharing one PostgreSQL database.

    python examples/cluster/run.py postgresql://postgres@127.0.0.1:5432/corral_cluster

(or the DSN in ``CORRAL_PG``; the database must exist: ``createdb corral_cluster``). Starts
nodes n1, n2 and n3 on http://127.0.0.1:4601-4603, each with its own home under
``.corral-cluster/`` and one shared token (``CORRAL_TOKEN``, else the one kept in
``.corral-cluster/token``), spawns a small team spread over them, prints the nodes and their
agents, then prompts a worker through a random daemon every few seconds and prints the
nodes again, until Ctrl-C stops the three daemons. Running it again picks up where it left
off (the spawns use idempotency keys). See examples/cluster/README.md for what to try.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

NODES = ("n1", "n2", "n3")
START_BOUND_S = 60.0  # importing the daemon takes seconds on a busy machine; a bound only
WORKER = "import sys; print('did: ' + sys.stdin.read().strip())"


class Daemon:
    """``corral serve --node NAME`` in a process of its own; its output is printed with its
    name in front."""

    def __init__(self, name: str, port: int, home: Path, store: str, token: str, lease_s: float):
        self.name = name
        self.url = ""
        self.command = [
            sys.executable,
            "-m",
            "corral.cli",
            "serve",
            "--node",
            name,
            "--store",
            store,
            "--home",
            str(home),
            "--port",
            str(port),
            "--lease-s",
            f"{lease_s:g}",
        ]
        self.env = {**os.environ, "CORRAL_TOKEN": token, "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen[str] | None = None
        self._listening = threading.Event()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
        threading.Thread(target=self._echo, daemon=True).start()

    def _echo(self) -> None:
        proc = self.proc
        if proc is None or proc.stdout is None:
            return
        for line in proc.stdout:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                self.url = found.group(1)
                self._listening.set()
            print(f"[{self.name}] {line}", end="", flush=True)

    def wait_listening(self) -> None:
        deadline = time.monotonic() + START_BOUND_S
        while not self._listening.wait(0.1):
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{self.name} did not start (see its output above)")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(20)


def shared_token(directory: Path) -> str:
    """``CORRAL_TOKEN``, else the token kept in ``directory/token`` (made the first time)."""
    given = os.environ.get("CORRAL_TOKEN")
    if given:
        return given
    path = directory / "token"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(32) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def spawn_team(api: httpx.Client) -> dict[str, str]:
    """A worker on each node, and a lead on n1 with a helper (a child goes to its parent's
    node); agent ids by name. Idempotency keys: a second run spawns nothing new."""
    ids: dict[str, str] = {}
    worker = [sys.executable, "-c", WORKER]
    team: list[tuple[str, str | None, dict[str, Any]]] = [
        (f"worker-{node}", node, {"prompt": f"hello from {node}"}) for node in NODES
    ]
    team += [("lead", "n1", {"prompt": "plan"}), ("helper", None, {"parent": "lead"})]
    for name, node, extra in team:
        spec: dict[str, Any] = {"name": name, "harness": "command", "command": worker, **extra}
        if "parent" in spec:
            spec["parent"] = ids[spec["parent"]]
        answer = api.post(
            "/agents",
            params={"node": node} if node else {},
            json={**spec, "idempotencyKey": f"example-cluster-{name}"},
        )
        answer.raise_for_status()
        ids[name] = answer.json()["id"]
    return ids


def show_nodes(api: httpx.Client) -> None:
    """What ``corral nodes`` shows: each daemon, whether it is live, its agents."""
    found = api.get("/nodes").json()
    print(f"nodes (lease {found['leaseS']:g} s), as {found['node']} sees them:", flush=True)
    for n in found["nodes"]:
        state = "live" if n["live"] else ("stopped" if n["stopped"] else "dead")
        print(
            f"  {n['name']:<4} {state:<8} heartbeat {n['heartbeatAgeS']:4.1f} s ago  "
            f"{n['agentCount']} agent(s)  {n['url']}",
            flush=True,
        )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsn", nargs="?", default=os.environ.get("CORRAL_PG"))
    parser.add_argument("--dir", type=Path, default=Path(".corral-cluster"))
    parser.add_argument("--base-port", type=int, default=4601, help="0: ports the OS picks")
    parser.add_argument("--lease-s", type=float, default=4.0)
    parser.add_argument("--every-s", type=float, default=5.0, help="between two prompts")
    parser.add_argument("--for-s", type=float, default=None, help="stop after this long")
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("give the PostgreSQL database's DSN (or set CORRAL_PG)")
    token = shared_token(args.dir)
    daemons = [
        Daemon(
            name,
            0 if args.base_port == 0 else args.base_port + i,
            args.dir / name,
            args.dsn,
            token,
            args.lease_s,
        )
        for i, name in enumerate(NODES)
    ]
    signal.signal(signal.SIGTERM, _interrupt)  # stopped like Ctrl-C: the daemons too
    try:
        for daemon in daemons:
            daemon.start()
        for daemon in daemons:
            daemon.wait_listening()
        clients = [
            httpx.Client(base_url=d.url, headers={"authorization": f"Bearer {token}"}, timeout=30)
            for d in daemons
        ]
        ids = spawn_team(clients[0])
        print("team: " + ", ".join(f"{name} {agent}" for name, agent in ids.items()), flush=True)
        show_nodes(clients[1])
        print(
            f"Try in another terminal (token in {args.dir / 'token'} unless CORRAL_TOKEN):\n"
            f"  CORRAL_TOKEN=$(cat {args.dir / 'token'}) .venv/bin/corral --url "
            f"{daemons[2].url} nodes\n"
            f"  kill -9 {daemons[1].proc.pid if daemons[1].proc else 'PID'}   # n2: the others "
            "adopt its agents within 1.25x the lease\n"
            "Ctrl-C stops the three daemons.",
            flush=True,
        )
        deadline = None if args.for_s is None else time.monotonic() + args.for_s
        rng = random.Random()
        workers = [ids[f"worker-{node}"] for node in NODES]
        while deadline is None or time.monotonic() < deadline:
            time.sleep(args.every_s)  # the example's pace
            via = rng.randrange(len(clients))
            agent = rng.choice(workers)
            try:
                answer = clients[via].post(f"/agents/{agent}/prompt", json={"text": "next"})
                print(f"prompt {agent} through {NODES[via]}: {answer.status_code}", flush=True)
                show_nodes(clients[via])
            except httpx.HTTPError as exc:
                print(f"prompt through {NODES[via]}: {exc!r}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        for daemon in daemons:
            daemon.stop()
        print("stopped the three daemons", flush=True)


if __name__ == "__main__":
    main()
