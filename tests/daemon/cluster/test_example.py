"""examples/cluster/run.py, the three-node setup on one machine, must keep telling the truth:
three daemons on one PostgreSQL database, a team spread over them, the nodes shown live
with their agents, and all three stopped at the end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import store_url
from tests.support.front_door import serve_env

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]


def test_the_three_node_example_runs(tmp_path: Path, postgres_dsn: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "cluster" / "run.py"),
            store_url(postgres_dsn),
            "--dir",
            str(tmp_path / "cluster"),
            "--base-port",
            "0",
            "--for-s",
            "0",  # stop once the team is spawned and the nodes shown
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env=serve_env(),
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"^team: worker-n1 a_\w+, worker-n2 a_\w+, worker-n3 a_\w+, lead", out, re.M)
    shown = dict(re.findall(r"^  (n\d)\s+live\s+heartbeat .*?(\d+) agent\(s\)", out, re.M))
    # A worker on each node; the lead's helper went to the lead's node.
    assert shown == {"n1": "3", "n2": "1", "n3": "1"}, out
    assert (tmp_path / "cluster" / "token").stat().st_mode & 0o777 == 0o600
    assert out.rstrip().endswith("stopped the three daemons")
