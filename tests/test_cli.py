"""The ``corral`` command against a real daemon on loopback (typer's CliRunner, and real
processes for ``serve`` and ``events --follow``)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner, Result

from corral import cli
from corral.daemon import (
    AgentBusyError,
    AgentNotFoundError,
    AgentNotLiveError,
    AgentPausedError,
    DaemonError,
    DaemonUnreachableError,
    InvalidSpecError,
    RemoteError,
    UnauthorizedError,
)
from corral.daemon._token_file import ensure_token_file
from corral.kernel import InvalidArgumentError
from tests.support.front_door import FrontDoor, free_port, running_daemon, serve_env
from tests.support.harness import fail
from tests.support.polling import settle

APP = cli.build_app()
SPEC: dict[str, Any] = {"name": "w", "harness": "command", "command": ["true"]}


async def corral(*args: str, env: dict[str, str | None] | None = None) -> Result:
    """Run the command in a worker thread, so the daemon on this loop keeps answering."""
    runner = CliRunner()
    base: dict[str, str | None] = {"CORRAL_URL": None, "CORRAL_TOKEN": None, "COLUMNS": "200"}
    invoke = functools.partial(runner.invoke, APP, list(args), env={**base, **(env or {})})
    return await asyncio.to_thread(invoke)


@pytest.fixture(autouse=True)
def cli_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the command line looks for a local daemon's token file: this test's own
    ``home`` (the ``--home`` of the daemons it starts), never the working directory's."""
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[FrontDoor]:
    async with running_daemon(tmp_path) as d:
        yield d


def spec_file(tmp_path: Path, filename: str = "spec.json", **spec: Any) -> str:
    path = tmp_path / filename
    path.write_text(json.dumps({**SPEC, **spec}))
    return str(path)


async def spawn(daemon: FrontDoor, tmp_path: Path, **spec: Any) -> str:
    result = await corral("--url", daemon.url, "spawn", spec_file(tmp_path, **spec), "--json")
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["id"])


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return result.stdout


def refused(result: Result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    return result.stderr


# --- reading ------------------------------------------------------------------------------


async def test_spawn_agents_and_show(daemon: FrontDoor, tmp_path: Path) -> None:
    out = ok(await corral("--url", daemon.url, "spawn", spec_file(tmp_path, prompt="go")))
    first = out.split()[0]
    assert re.fullmatch(r"a_[0-9a-f]{8}", first)
    assert out.split()[1:] == ["w", "running"]
    await settle(lambda: daemon.state(first) == "idle")
    second = await spawn(daemon, tmp_path, name="v")

    table = ok(await corral("--url", daemon.url, "agents"))
    header = next(line for line in table.splitlines() if "id" in line and "state" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]] == [
        "id",
        "name",
        "state",
        "reason",
        "turns",
        "parent",
    ]
    rows = {
        cells[0]: cells
        for line in table.splitlines()
        if "a_" in line
        for cells in [[c.strip() for c in line.split("│")[1:-1]]]
    }
    assert rows[first] == [first, "w", "idle", "turn-done", "1", ""]
    assert rows[second] == [second, "v", "idle", "spawned", "0", ""]

    listed = json.loads(ok(await corral("--url", daemon.url, "agents", "--json")))
    assert [a["id"] for a in listed] == [first, second]

    shown = ok(await corral("--url", daemon.url, "show", first))
    assert re.search(r"state\s+│\s+idle", shown)
    assert re.search(r"lastOutput\s+│\s+ok", shown)
    record = json.loads(ok(await corral("--url", daemon.url, "show", first, "--json")))
    assert (record["id"], record["state"], record["turns"]) == (first, "idle", 1)


async def test_supervision_from_the_command_line(daemon: FrontDoor, tmp_path: Path) -> None:
    parent = await spawn(daemon, tmp_path, name="boss")
    daemon.harness.script("w", fail("no access"))
    child = await spawn(daemon, tmp_path, prompt="go", onFailure="ask", parent=parent)
    await settle(lambda: daemon.state(child) == "blocked")

    shown = await corral("--url", daemon.url, "decisions")
    assert shown.exit_code == 0, shown.output
    assert shown.stderr.startswith("resolve with: corral decide ID retry [--text PROMPT]")
    decisions = shown.stdout
    (row,) = [line for line in decisions.splitlines() if child in line]
    assert re.search(rf"blocked\s+│\s+{child}\s+│\s+w\s+│\s+ask\s+│\s+no access", row)
    (waiting,) = json.loads(ok(await corral("--url", daemon.url, "decisions", "--json")))
    assert (waiting["agentId"], waiting["reason"]) == (child, "ask")

    inbox = ok(await corral("--url", daemon.url, "inbox", parent))
    assert re.search(rf"w \({child}\)\s+│\s+supervision\s+│\s+pending\s+│\s+ask", inbox)
    (notice,) = json.loads(ok(await corral("--url", daemon.url, "inbox", parent, "--json")))
    assert (notice["from"], notice["kind"]) == (child, "supervision")

    said = ok(
        await corral(
            "--url", daemon.url, "prompt", child, "try again", "--by", "ana", "--why", "fixed"
        )
    )
    assert said == f"{child}: prompt accepted\n"
    await settle(lambda: daemon.state(child) == "idle")
    assert daemon.harness.prompts(child) == ["go", "try again"]
    (resolution,) = daemon.service.resolutions()
    assert (resolution["by"], resolution["why"], resolution["answer"]) == ("ana", "fixed", "retry")
    assert json.loads(ok(await corral("--url", daemon.url, "decisions", "--json"))) == []

    stopped = ok(await corral("--url", daemon.url, "stop", child, "--key", "k1"))
    assert stopped == f"{child}: stop accepted\n"
    again = ok(await corral("--url", daemon.url, "stop", child, "--key", "k1"))
    assert again == stopped  # the same key answers the first answer
    assert daemon.state(child) == "stopped"

    err = refused(await corral("--url", daemon.url, "prompt", child), 4)
    assert err.startswith(f"error agent_not_live: agent '{child}' is stopped;")

    restarted = ok(await corral("--url", daemon.url, "restart", child, "--why", "again"))
    assert restarted == f"{child}: restart accepted, runs turn 3\n"
    await settle(lambda: daemon.state(child) == "idle")
    err = refused(await corral("--url", daemon.url, "rm", parent), 4)
    assert err.startswith(f"error agent_live: agent '{parent}' is idle;")
    stopped = ok(await corral("--url", daemon.url, "stop", parent, "--now"))
    assert stopped == f"{parent}: stop accepted, 2 agents, children first\n  {child}\n  {parent}\n"
    gone = json.loads(ok(await corral("--url", daemon.url, "rm", parent, "--json")))
    assert gone == {"id": parent, "deleted": [child, parent]}
    refused(await corral("--url", daemon.url, "show", child), 3)


HOSTILE = "\x1b[2J\x1b]0;pwned\x07red\r\nforged line\u202e"
SHOWN = "\\x1b[2J\\x1b]0;pwned\\x07red\\r\\nforged line\\u202e"


async def test_text_from_agents_is_printed_escaped_and_json_stays_exact(
    daemon: FrontDoor, tmp_path: Path
) -> None:
    parent = await spawn(daemon, tmp_path, name="boss")
    daemon.harness.script("w", fail(HOSTILE))
    child = await spawn(daemon, tmp_path, prompt="go", onFailure="ask", parent=parent)
    await settle(lambda: daemon.state(child) == "blocked")
    for args in (["decisions"], ["show", child], ["inbox", parent]):
        result = await corral("--url", daemon.url, *args)
        assert result.exit_code == 0, result.output
        shown = result.stdout
        assert not {"\x1b", "\r", "\u202e"} & set(shown), args
        assert "pwned" in shown or args[0] == "inbox", args  # the inbox shows the reason
    decisions = (await corral("--url", daemon.url, "decisions")).stdout
    assert SHOWN[:20] in decisions
    assert not any(line.startswith("forged line") for line in decisions.splitlines())
    exact = json.loads(ok(await corral("--url", daemon.url, "show", child, "--json")))
    assert exact["error"] == HOSTILE
    # A refusal's message (here the daemon's, naming a wrong id) is printed escaped too.
    err = refused(await corral("--url", daemon.url, "stop", "a_\x1b[2J"), 2)
    assert "\x1b" not in err
    assert "error invalid_request:" in err


async def test_budget_raises_a_budget_from_the_command_line(
    daemon: FrontDoor, tmp_path: Path
) -> None:
    agent = await spawn(daemon, tmp_path, prompt="go", budget={"maxTurns": 1})
    await settle(lambda: daemon.state(agent) == "idle")
    err = refused(await corral("--url", daemon.url, "prompt", agent, "more"), 4)
    assert err.startswith(f"error budget_exhausted: agent '{agent}': turns budget exhausted")
    assert f"corral budget {agent}" in err
    shown = await corral("--url", daemon.url, "decisions")
    assert "held on a budget: corral decide ID budget --budget" in shown.stderr

    said = ok(
        await corral(
            "--url",
            daemon.url,
            "budget",
            agent,
            "--max-turns",
            "3",
            "--unlimited",
            "cost-usd",
            "--by",
            "ana",
            "--why",
            "worth it",
        )
    )
    assert said.startswith(f"{agent}: budget maxTokens=unlimited, maxCostUsd=unlimited, maxTurns=3")
    assert "idle" in said
    (resolution,) = daemon.service.resolutions()
    assert (resolution["answer"], resolution["by"], resolution["why"]) == (
        "budget",
        "ana",
        "worth it",
    )
    bad = refused(
        await corral(
            "--url", daemon.url, "budget", agent, "--unlimited", "money", "--by", "a", "--why", "b"
        ),
        2,
    )
    assert "--unlimited must be one of tokens, cost-usd, turns, deadline-s" in bad
    missing = await corral("--url", daemon.url, "budget", agent, "--max-turns", "4")
    assert missing.exit_code == 2  # --by and --why are required


async def test_events_reads_the_log(daemon: FrontDoor, tmp_path: Path) -> None:
    a = await spawn(daemon, tmp_path, prompt="go")
    await settle(lambda: daemon.state(a) == "idle")
    b = await spawn(daemon, tmp_path, name="v")
    lines = ok(await corral("--url", daemon.url, "events", "--json")).splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "agent.created"
    assert events[-1]["agentId"] == b

    only_b = ok(await corral("--url", daemon.url, "events", "--agent", b, "--json"))
    assert {json.loads(line)["agentId"] for line in only_b.splitlines()} == {b}
    later = ok(await corral("--url", daemon.url, "events", "--after", "2", "--json"))
    assert [json.loads(line)["seq"] for line in later.splitlines()] == [
        e["seq"] for e in events[2:]
    ]

    text = ok(await corral("--url", daemon.url, "events")).splitlines()
    assert len(text) == len(events)
    assert re.match(rf"\s+1\s+\S+\s+agent\.created\s+{a}\s+{{", text[0])


async def test_events_follow_streams_live_events(daemon: FrontDoor, tmp_path: Path) -> None:
    first = await spawn(daemon, tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "corral.cli",
        "--url",
        daemon.url,
        "events",
        "--follow",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert (json.loads(line)["seq"], json.loads(line)["agentId"]) == (1, first)
        second = await spawn(daemon, tmp_path, name="v")
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert (json.loads(line)["seq"], json.loads(line)["agentId"]) == (2, second)
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, stderr
    assert b"Traceback" not in stderr


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
async def test_a_reader_that_goes_away_ends_events_quietly(
    daemon: FrontDoor, tmp_path: Path, as_json: bool
) -> None:
    # `corral events --follow | head -1`: once the reader is gone, the next event ends the
    # command with the status of a SIGPIPE, and no traceback.
    await spawn(daemon, tmp_path)
    read_end, write_end = os.pipe()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "corral.cli",
        "--url",
        daemon.url,
        "events",
        "--follow",
        *(["--json"] if as_json else []),
        stdout=write_end,
        stderr=asyncio.subprocess.PIPE,
    )
    os.close(write_end)
    try:
        first = b""
        while b"\n" not in first:
            chunk = await asyncio.wait_for(asyncio.to_thread(os.read, read_end, 65536), 20)
            assert chunk, "the command ended before its first line"
            first += chunk
    finally:
        os.close(read_end)
    await spawn(daemon, tmp_path, name="v")
    _, stderr = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 141, stderr
    assert stderr == b""


# --- errors -------------------------------------------------------------------------------


async def test_refusals_print_the_code_and_exit_by_kind(daemon: FrontDoor, tmp_path: Path) -> None:
    err = refused(await corral("--url", daemon.url, "show", "a_00000000"), 3)
    assert err == "error agent_not_found: no agent with id 'a_00000000'\n"

    bad = spec_file(tmp_path, "bad.json", harness="nope", extra=1)
    err = refused(await corral("--url", daemon.url, "spawn", bad), 2)
    assert err.startswith("error invalid_spec: invalid agent spec: 2 problem(s):")
    assert "extra: unknown field" in err

    err = refused(await corral("--url", daemon.url, "spawn", str(tmp_path / "none.json")), 2)
    assert err.startswith("error invalid_spec: invalid agent spec: 1 problem(s): (file): cannot")
    (tmp_path / "junk.json").write_text("{nope")
    err = refused(await corral("--url", daemon.url, "spawn", str(tmp_path / "junk.json")), 2)
    assert "junk.json is not JSON" in err
    (tmp_path / "list.json").write_text("[]")
    err = refused(await corral("--url", daemon.url, "spawn", str(tmp_path / "list.json")), 2)
    assert "list.json must hold a JSON object" in err
    assert json.loads(ok(await corral("--url", daemon.url, "agents", "--json"))) == []

    usage = await corral("--url", daemon.url, "show")
    assert usage.exit_code == 2
    assert "Missing argument" in usage.stderr


async def test_spawn_reads_the_spec_from_stdin(daemon: FrontDoor) -> None:
    runner = CliRunner()
    args = ["--url", daemon.url, "spawn", "-", "--json"]
    result = await asyncio.to_thread(functools.partial(runner.invoke, APP, args, json.dumps(SPEC)))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "w"


async def test_no_daemon_exits_69_with_a_clear_message() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    err = refused(await corral("--url", url, "agents"), 69)
    assert err.startswith(f"error daemon_unreachable: no daemon answers at {url} (")
    err = refused(await corral("--url", url, "events", "--follow"), 69)
    assert err.startswith(f"error daemon_unreachable: no daemon answers at {url} (")
    err = refused(await corral("--url", "localhost:4600", "agents"), 2)
    assert err.startswith("error invalid_argument: HttpApi: url must be an http")


async def test_url_and_token_from_the_environment(tmp_path: Path) -> None:
    async with running_daemon(tmp_path, token="s3cret") as d:
        env: dict[str, str | None] = {"CORRAL_URL": d.url, "CORRAL_TOKEN": "s3cret"}
        assert json.loads(ok(await corral("agents", "--json", env=env))) == []
        err = refused(await corral("--token", "wrong", "agents", env=env), 77)
        assert err == "error unauthorized: a valid bearer token is required\n"
        err = refused(await corral("--url", d.url, "agents"), 77)
        assert err.startswith("error unauthorized:")


# --- where the token comes from ----------------------------------------------------------------


async def test_the_token_file_of_a_local_daemon_is_read(cli_home: Path, tmp_path: Path) -> None:
    token, _ = ensure_token_file(cli_home)
    async with running_daemon(tmp_path, token=token) as d:
        assert json.loads(ok(await corral("--url", d.url, "agents", "--json"))) == []
        localhost = d.url.replace("127.0.0.1", "localhost")
        assert json.loads(ok(await corral("--url", localhost, "agents", "--json"))) == []
        # --token, then CORRAL_TOKEN, win over the file.
        err = refused(await corral("--url", d.url, "--token", "wrong", "agents"), 77)
        assert err.startswith("error unauthorized:")
        env: dict[str, str | None] = {"CORRAL_TOKEN": "wrong"}
        err = refused(await corral("--url", d.url, "agents", env=env), 77)
        assert err.startswith("error unauthorized:")
        # An empty CORRAL_TOKEN is no token: the file is read.
        env = {"CORRAL_TOKEN": ""}
        assert json.loads(ok(await corral("--url", d.url, "agents", "--json", env=env))) == []


def write_token(home: Path, token: str, mode: int) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "token").write_text(token + "\n")
    (home / "token").chmod(mode)


class RecordingApi:
    """Stands in for ``HttpApi``: records the URL and the token each command would send."""

    sent: ClassVar[list[tuple[str, str | None]]] = []

    def __init__(self, url: str, *, token: str | None = None, blocking: bool = False) -> None:
        self.sent.append((url, token))

    async def __aenter__(self) -> RecordingApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def list_agents(self, **filters: Any) -> list[Any]:
        return []


@pytest.mark.parametrize(
    ("url", "sent"),
    [
        ("http://127.0.0.1:4600", True),
        ("http://127.8.9.10:4600", True),
        ("https://localhost:4600/", True),
        ("http://[::1]:4600", True),
        ("http://192.0.2.10:4600", False),
        ("https://corral.example.com", False),
        ("http://127.0.0.1.example.com:4600", False),
        ("http://localhost.example.com:4600", False),
        ("http://0.0.0.0:4600", False),
    ],
)
async def test_the_token_file_is_sent_to_loopback_only(
    cli_home: Path, monkeypatch: pytest.MonkeyPatch, url: str, sent: bool
) -> None:
    from corral.daemon import _client

    token, _ = ensure_token_file(cli_home)
    monkeypatch.setattr(_client, "HttpApi", RecordingApi)
    RecordingApi.sent = []
    assert json.loads(ok(await corral("--url", url, "agents", "--json"))) == []
    assert RecordingApi.sent == [(url, token if sent else None)]
    # A token given explicitly goes wherever the URL says: the person chose it.
    ok(await corral("--url", url, "--token", "given", "agents", "--json"))
    assert RecordingApi.sent[-1] == (url, "given")


async def test_a_token_file_others_can_read_is_not_sent(
    cli_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.daemon import _client

    write_token(cli_home, "seen-by-others", 0o644)
    monkeypatch.setattr(_client, "HttpApi", RecordingApi)
    RecordingApi.sent = []
    err = refused(await corral("--url", "http://127.0.0.1:4600", "agents"), 2)
    assert err.startswith(f"error token_file_unsafe: the token file {cli_home / 'token'} is open")
    assert "chmod 600" in err
    assert RecordingApi.sent == []


# --- named operator tokens ---------------------------------------------------------------------


async def test_token_create_list_and_revoke(tmp_path: Path) -> None:
    async with running_daemon(tmp_path, token="s3cret") as d:
        env: dict[str, str | None] = {"CORRAL_URL": d.url, "CORRAL_TOKEN": "s3cret"}
        made = await corral("token", "create", "alice", env=env)
        assert made.exit_code == 0, made.output
        alice = made.stdout.strip()
        assert made.stdout == alice + "\n"  # the secret alone, for $(corral token create ...)
        assert alice.startswith("corral-op.alice.")
        assert "shown this once" in made.stderr
        as_alice: dict[str, str | None] = {**env, "CORRAL_TOKEN": alice}
        bob = json.loads(ok(await corral("token", "create", "bob", "--json", env=as_alice)))
        assert (bob["name"], bob["by"]) == ("bob", "alice")
        listed = json.loads(ok(await corral("token", "list", "--json", env=env)))
        assert [(t["name"], t["by"]) for t in listed] == [("alice", "operator"), ("bob", "alice")]
        table = ok(await corral("token", "list", env=env))
        assert "alice" in table
        assert alice not in table
        assert bob["token"] not in table
        err = refused(await corral("token", "create", "alice", env=env), 4)
        assert err.startswith("error token_exists: a token named 'alice' is live since")
        err = refused(await corral("token", "create", "9lives", env=env), 2)
        assert err.startswith("error invalid_request: invalid token name")
        said = ok(await corral("token", "revoke", "alice", env=as_alice))
        assert said == "token alice revoked by alice\n"
        err = refused(await corral("agents", env=as_alice), 77)
        assert err.startswith("error unauthorized:")
        err = refused(await corral("token", "revoke", "alice", env=env), 3)
        assert err.startswith("error token_not_found: no live token named 'alice'")
        agent_id = str((await d.service.spawn(SPEC)).body["id"])
        as_agent: dict[str, str | None] = {**env, "CORRAL_TOKEN": d.agent_token(agent_id)}
        err = refused(await corral("token", "list", env=as_agent), 77)
        assert err.startswith("error out_of_scope:")


# --- serve --------------------------------------------------------------------------------


async def test_serve_passes_its_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from corral.daemon import _server

    seen: list[Any] = []

    async def fake_serve(config: Any, **kwargs: Any) -> None:
        seen.append(config)

    monkeypatch.setattr(_server, "serve", fake_serve)
    store = f"sqlite:///{tmp_path}/x.db"
    args = ["serve", "--host", "::1", "--port", "0", "--store", store, "--home", str(tmp_path)]
    ok(await corral(*args, "--token", "t0k"))
    ok(await corral("--token", "global", "serve"))
    first, second = seen
    assert (first.host, first.port, first.store, Path(first.home), first.token) == (
        "::1",
        0,
        store,
        tmp_path,
        "t0k",
    )
    assert (second.host, second.port, second.token) == ("127.0.0.1", 4600, "global")


async def test_serve_refuses_a_public_host_without_a_token() -> None:
    err = refused(await corral("serve", "--host", "0.0.0.0"), 2)
    assert err.startswith("error token_required: refusing to listen on '0.0.0.0' without a token")


async def test_serve_reports_a_store_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "corral.db"
    path.write_text("not a database at all " * 50)
    err = refused(
        await corral("serve", "--port", "0", "--store", str(path), "--home", str(tmp_path)), 1
    )
    assert err.startswith("error store_unavailable: the store sqlite:")
    assert "file is not a database" in err


async def test_serve_runs_the_daemon_until_sigterm(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "corral.cli",
        "serve",
        "--port",
        "0",
        "--store",
        f"sqlite:///{tmp_path}/corral.db",
        "--home",
        str(tmp_path / "home"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=serve_env(),
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert found, line
        url = found.group(1)
        # No token given: the daemon made one in its home, where the command line finds it.
        assert f"bearer token in {tmp_path / 'home' / 'token'}" in line
        upper = [sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"]
        spec = spec_file(tmp_path, command=upper, prompt="hello")
        agent_id = ok(await corral("--url", url, "spawn", spec)).split()[0]

        async def output() -> Any:
            shown = ok(await corral("--url", url, "show", agent_id, "--json"))
            return json.loads(shown)["lastOutput"]

        for _ in range(200):  # bounded: the turn is a real process
            if await output():
                break
            await asyncio.sleep(0.05)
        assert (await output()).strip() == "HELLO"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, stderr


# --- without the extra, and exit codes ----------------------------------------------------


def test_main_without_typer_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "typer", None)
    with pytest.raises(SystemExit) as exited:
        cli.main(["agents"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "pip install 'corral[daemon]'" in err


def test_main_runs_the_app(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for command in ("serve", "spawn", "agents", "show", "prompt", "stop", "events", "mcp"):
        assert command in out


def test_exit_codes() -> None:
    """One mapping from the typed error: unreachable, then retryable, then HTTP status."""
    assert cli.exit_code(InvalidSpecError([{"field": "x", "message": "y"}])) == 2
    assert cli.exit_code(InvalidArgumentError("f", "x", "an int", "s")) == 2
    assert cli.exit_code(RemoteError("teapot", "short", status=418)) == 2
    assert cli.exit_code(DaemonError("plain")) == 2  # the family's status is 400
    assert cli.exit_code(AgentNotFoundError("a_1")) == 3
    assert cli.exit_code(RemoteError("gone", "no such thing", status=404)) == 3
    assert cli.exit_code(AgentNotLiveError("a_1", "stopped")) == 4
    assert cli.exit_code(RemoteError("agent_frozen", "frozen", status=423)) == 4
    assert cli.exit_code(UnauthorizedError()) == 77
    assert cli.exit_code(RemoteError("out_of_scope", "not yours", status=403)) == 77
    assert cli.exit_code(AgentBusyError("a_1")) == 75
    assert cli.exit_code(AgentPausedError("a_1", "ops")) == 75
    assert cli.exit_code(RemoteError("pool_exhausted", "later", status=429, retryable=True)) == 75
    assert cli.exit_code(RemoteError("shutting_down", "bye", status=503, retryable=True)) == 75
    assert cli.exit_code(DaemonUnreachableError("http://x", "refused")) == 69
    assert cli.exit_code(RemoteError("internal_error", "boom", status=500)) == 1


async def test_nodes_of_a_daemon_alone(daemon: FrontDoor, tmp_path: Path) -> None:
    said = ok(await corral("--url", daemon.url, "nodes"))
    assert said == "this daemon runs alone on its store (started without --node)\n"
    listed = json.loads(ok(await corral("--url", daemon.url, "nodes", "--json")))
    assert listed == {"node": None, "leaseS": None, "nodes": []}
    err = refused(await corral("--url", daemon.url, "spawn", spec_file(tmp_path), "--node", "b"), 2)
    assert err.startswith("error node_not_found: no live daemon named 'b'")
    assert daemon.store.state.agents == {}
