"""A command-harness worker for tests: ``cmd_worker.py MODE [ARGS...]``.

Modes:
- ``report NAME...``: prints JSON ``{"prompt", "cwd", "pid", "env": {NAME: value}}``.
- ``fail CODE LINES``: writes ``LINES`` numbered lines to stderr, exits with ``CODE``.
- ``signal``: kills itself with SIGTERM.
- ``big OUT_BYTES ERR_BYTES CODE``: writes that many bytes to stdout and stderr,
  interleaved, then exits with ``CODE``; the last stderr line is ``END-OF-STDERR``.
- ``family``: starts a grandchild, writes ``pids.json`` (``{"child", "grandchild"}``) in its
  working directory, then sleeps.
- ``escape``: starts a grandchild in a session of its own that keeps stdout open, writes
  ``pids.json``, prints ``bye`` and exits 0.
- ``orphan``: starts a grandchild in its own process group, writes ``pids.json``, prints
  ``done`` and exits 0.
- ``ignore-stdin``: prints ``ignored`` without reading stdin, exits 0.
- ``sleep SECONDS``: sleeps, then prints ``slept`` and exits 0.
- ``await-file NAME``: writes ``pids.json`` (``{"child"}``), waits (up to 60 s) for file
  ``NAME`` in its working directory, then prints ``<prompt> -> <the file's text>``, writes
  ``stderr of <the file's text>`` to stderr and exits with the file's text as its code (a
  stand-in for ``corral check "..." || exit 1``, whose verdict a test gives by the file).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def write_pids(**pids: int) -> None:
    tmp = "pids.json.tmp"
    with open(tmp, "w") as f:
        json.dump(pids, f)
    os.replace(tmp, "pids.json")


def main(mode: str, *args: str) -> int:
    if mode == "report":
        prompt = sys.stdin.read()
        env = {name: os.environ.get(name) for name in args}
        print(json.dumps({"prompt": prompt, "cwd": os.getcwd(), "pid": os.getpid(), "env": env}))
        return 0
    if mode == "fail":
        code, lines = int(args[0]), int(args[1])
        for i in range(lines):
            print(f"stderr line {i}", file=sys.stderr)
        return code
    if mode == "signal":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        return 0
    if mode == "big":
        out_left, err_left, code = int(args[0]), int(args[1]), int(args[2])
        block = b"o" * 65536
        eblock = b"e" * 65536
        while out_left or err_left:
            n = min(out_left, len(block))
            sys.stdout.buffer.write(block[:n])
            out_left -= n
            m = min(err_left, len(eblock))
            sys.stderr.buffer.write(eblock[:m])
            err_left -= m
        sys.stdout.flush()
        sys.stderr.buffer.write(b"\nEND-OF-STDERR\n")
        sys.stderr.flush()
        return code
    if mode == "family":
        grandchild = subprocess.Popen(SLEEPER, stdin=subprocess.DEVNULL)
        write_pids(child=os.getpid(), grandchild=grandchild.pid)
        time.sleep(60)
        return 0
    if mode == "escape":
        grandchild = subprocess.Popen(SLEEPER, stdin=subprocess.DEVNULL, start_new_session=True)
        write_pids(child=os.getpid(), grandchild=grandchild.pid)
        print("bye", flush=True)
        return 0
    if mode == "orphan":
        grandchild = subprocess.Popen(SLEEPER, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        write_pids(child=os.getpid(), grandchild=grandchild.pid)
        print("done", flush=True)
        return 0
    if mode == "ignore-stdin":
        print("ignored", flush=True)
        return 0
    if mode == "sleep":
        time.sleep(float(args[0]))
        print("slept", flush=True)
        return 0
    if mode == "await-file":
        prompt = sys.stdin.read()
        write_pids(child=os.getpid())
        deadline = time.monotonic() + 60
        while not os.path.exists(args[0]) and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(args[0]) as f:
            text = f.read().strip()
        print(f"{prompt} -> {text}", flush=True)
        print(f"stderr of {text}", file=sys.stderr, flush=True)
        return int(text)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
