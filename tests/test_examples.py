"""The example tour that ``make run`` shows must keep telling the truth."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_tour_shows_budget_deadline_and_guardrail() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "tour.py")],
        capture_output=True,
        text=True,
        timeout=25,
        check=True,
    )
    out = done.stdout
    assert "stopped: budget_exhausted: tokens budget exhausted: used 1200 of a limit of 1000" in out
    assert "the model was called 3 times, not 9" in out
    assert "deadline_exceeded: deadline exceeded" in out
    assert "delete_table({'name': 'customers'}) -> refused" in out
    assert "the table was dropped: False" in out
    assert done.stderr == ""


@pytest.mark.timeout(90)  # a real daemon, a team of seven and a dozen CLI processes
def test_make_run_team_shows_each_policy(tmp_path: Path) -> None:
    """examples/team/run.py (what ``make run`` starts), read back through the CLI."""
    import json
    import os
    import re
    import signal
    import time

    import httpx

    # No token given, as `make run` gives none: the daemon makes .corral/token, which the
    # team script and the command line (run in the same directory) read by themselves.
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_TOKEN", "CORRAL_HOME")}
    env["CORRAL_PORT"] = "0"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "team" / "run.py")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    try:
        url = console = ""
        deadline = time.monotonic() + 20
        while not (url and console) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            match = re.search(r"listening on (http://\S+)", line)
            url = match.group(1) if match else url
            match = re.search(r"^console: (http://\S+)", line)
            console = match.group(1) if match else console
        assert url, "the daemon did not say where it listens"
        assert console == f"{url}/", "make run did not print the console's address"
        # The console answers there: its login page, for a browser with no session yet.
        login = httpx.get(console, follow_redirects=True, timeout=20)
        assert login.status_code == 200, login.text
        assert 'data-testid="login-form"' in login.text
        token_file = tmp_path / ".corral" / "token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        anonymous = subprocess.run(
            [sys.executable, "-m", "corral.cli", "--url", url, "agents"],
            capture_output=True,
            text=True,
            timeout=20,
            env=env,
            cwd=elsewhere,  # no .corral/token here: nothing to send, so refused
        )
        assert anonymous.returncode == 77, anonymous.stderr
        assert anonymous.stderr.startswith("error unauthorized:")

        def agents() -> dict[str, dict[str, object]]:
            done = subprocess.run(
                [sys.executable, "-m", "corral.cli", "--url", url, "agents", "--json"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
                env=env,
                cwd=tmp_path,
            )
            return {a["name"]: a for a in json.loads(done.stdout)}

        def cli_of(url: str) -> list[str]:
            return [sys.executable, "-m", "corral.cli", "--url", url]

        def shown(agent: dict[str, object]) -> dict[str, object]:
            # The list holds summaries: an agent's output and prompt are in its full record.
            done = subprocess.run(
                [*cli_of(url), "show", str(agent["id"]), "--json"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
                env=env,
                cwd=tmp_path,
            )
            record: dict[str, object] = json.loads(done.stdout)
            return record

        def settled(found: dict[str, dict[str, object]]) -> bool:
            # The coordinator was woken twice: by its counter's hold, then by its "done".
            resolved = [
                (found.get(n, {}).get("state"), found.get(n, {}).get("turns"))
                for n in ("coordinator", "counter")
            ]
            if resolved != [("idle", 2), ("idle", 2)]:
                return False
            want = {
                "indexer": "idle",
                "fetcher": "idle",
                "billing": "blocked",
                "deployer": "blocked",
                "auditor": "idle",
                "releaser": "waiting",  # on a person: its deploy asks for an approval
            }
            return all(found.get(n, {}).get("state") == s for n, s in want.items())

        found: dict[str, dict[str, object]] = {}
        while time.monotonic() < deadline + 20 and not settled(found):
            found = agents()
            time.sleep(0.1)
        assert settled(found), found
        assert found["billing"]["reason"] == "circuit-tripped"
        assert found["deployer"]["reason"] == "ask"
        assert found["fetcher"]["turns"] == 2  # failed once, retried
        # The coordinator resolved its held counter with no one's help: the gateway's "did
        # you mean orders?" in the counter's error became the correction it was prompted with.
        counter, coordinator = shown(found["counter"]), shown(found["coordinator"])
        assert counter["lastOutput"] == "counter: 6 refunded orders in table orders\n"
        assert counter["lastPrompt"] == "count the refunded orders: the table is called orders"
        assert "counter reported: counter: 6 refunded orders" in str(coordinator["lastOutput"])
        decisions = subprocess.run(
            [sys.executable, "-m", "corral.cli", "--url", url, "decisions"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
            env={**env, "COLUMNS": "200"},  # a wide table: no cell is wrapped
            cwd=tmp_path,
        )
        assert "circuit-tripped" in decisions.stdout
        assert "deployer" in decisions.stdout
        assert "gateway_frozen" in decisions.stdout
        auditor = str(found["auditor"]["id"])
        assert auditor in decisions.stdout
        assert "the gateway stopped me: agent_frozen" in str(shown(found["auditor"])["lastOutput"])
        reinstated = subprocess.run(
            [
                sys.executable,
                "-m",
                "corral.cli",
                "--url",
                url,
                "gateway",
                "reinstate",
                auditor,
                "--target",
                "shop",
                "--by",
                "you",
                "--reason",
                "filter fixed",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
            env=env,
            cwd=tmp_path,
        )
        # The record names the daemon's token ("operator"); "--by you" is kept as a note.
        assert reinstated.stdout.strip() == f"{auditor} reinstated in shop by operator"

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "corral.cli", "--url", url, *args],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
                env=env,
                cwd=tmp_path,
            )

        releaser = str(found["releaser"]["id"])
        waiting = json.loads(cli("decisions", "--json").stdout)
        (approval,) = [d for d in waiting if d["kind"] == "approval"]
        assert approval["agentId"] == releaser
        assert approval["action"] == "deploy web 2.4 to production"
        assert approval["context"] == {"version": "2.4", "from": "staging"}
        assert found["releaser"]["decision"] == approval["id"]
        approved = cli("approve", approval["id"], "--why", "release checked")
        assert approved.stdout.strip() == f"{approval['id']}: approve recorded"
        while time.monotonic() < deadline + 40 and agents()["releaser"]["state"] != "idle":
            time.sleep(0.1)
        done = shown(agents()["releaser"])
        assert (done["state"], done["lastOutput"]) == ("idle", "web 2.4 is live\n")
        (answered,) = [
            d
            for d in json.loads(cli("decisions", "--resolved", "--json").stdout)
            if d["id"] == approval["id"]
        ]
        assert (answered["answer"], answered["by"]) == ("approve", "operator")
        (held,) = [
            d
            for d in json.loads(cli("decisions", "--resolved", "--json").stdout)
            if d["agentId"] == counter["id"]
        ]
        assert (held["answer"], held["by"]) == ("retry", coordinator["id"])
        assert held["why"] == "the gateway says the table is orders"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
        proc.stdout.close()
    assert proc.returncode == 0
