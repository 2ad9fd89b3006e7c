"""A tool command of an ``openai`` agent, for tests: ``tool_worker.py MODE [ARGS...]``.

The tool's arguments arrive as JSON on stdin. Modes:
- ``report NAME...``: prints JSON ``{"arguments", "cwd", "env": {NAME: value}}``.
- ``touch``: creates the file ``arguments["path"]`` (relative to its working directory) and
  prints ``made <path>``.
- ``fail CODE``: writes ``broken: <arguments>`` to stderr, exits with ``CODE``.
- ``big BYTES``: prints that many ``o`` bytes.
- ``hang``: starts a grandchild, writes ``pids.json`` (``{"child", "grandchild"}``) in its
  working directory, then sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main(mode: str, *args: str) -> int:
    arguments = json.loads(sys.stdin.read())
    if mode == "report":
        env = {name: os.environ.get(name) for name in args}
        print(json.dumps({"arguments": arguments, "cwd": os.getcwd(), "env": env}))
        return 0
    if mode == "touch":
        path = arguments["path"]
        with open(path, "x") as f:
            f.write("made by the tool\n")
        print(f"made {path}")
        return 0
    if mode == "fail":
        print(f"broken: {json.dumps(arguments)}", file=sys.stderr)
        return int(args[0])
    if mode == "big":
        sys.stdout.write("o" * int(args[0]))
        return 0
    if mode == "hang":
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
        grandchild = subprocess.Popen(sleeper, stdin=subprocess.DEVNULL)
        with open("pids.json.tmp", "w") as f:
            json.dump({"child": os.getpid(), "grandchild": grandchild.pid}, f)
        os.replace("pids.json.tmp", "pids.json")
        time.sleep(60)
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
