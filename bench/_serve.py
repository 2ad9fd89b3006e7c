"""A real ``corral serve`` process for the benchmarks that measure the daemon from outside."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


class ServeProcess:
    """``corral serve --port 0`` on ``store`` with its own ``home`` and ``token`` (and
    ``extra`` options), started at once; ``url`` once it listens. Its output goes to
    ``home.log``."""

    def __init__(self, store: str, home: Path, token: str, *extra: str) -> None:
        self.log = home.with_name(home.name + ".log")
        env = {**os.environ, "CORRAL_TOKEN": token}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "corral.cli", "serve", "--port", "0"),
                    *("--store", store, "--home", str(home)),
                    *extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + 120
        while True:
            found = re.search(r"listening on (http://\S+)", self.log.read_text(errors="replace"))
            if found:
                self.url = found.group(1)
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"corral serve did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s; idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
