"""The ``corral`` command as a whole: its table of commands (each built only when run, each
with ``--json``), what ``corral agents`` imports, tables that fit the terminal, text from
agents printed escaped, and exit codes by kind of refusal."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner, Result

from corral import cli
from corral.cli import _output
from corral.cli._app import COMMANDS
from corral.cli._lazy import build
from corral.daemon._wire import tls_for
from tests.support.front_door import BOUND_S, FrontDoor, running_daemon
from tests.support.harness import fail
from tests.support.polling import settle

APP = cli.build_app()
NO_JSON = {"serve", "mcp"}  # they print no answer: the daemon's log, the MCP protocol


async def corral(*args: str, columns: int = 200) -> Result:
    """Run the command in a worker thread, so the daemon on this loop keeps answering."""
    env: dict[str, str | None] = {"CORRAL_URL": None, "CORRAL_TOKEN": None}
    env["COLUMNS"] = str(columns)
    invoke = functools.partial(CliRunner().invoke, APP, list(args), env=env)
    return await asyncio.to_thread(invoke)


@pytest.fixture(autouse=True)
def cli_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home"))


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[FrontDoor]:
    async with running_daemon(tmp_path) as d:
        yield d


# --- the table of commands ------------------------------------------------------------------


def leaves(name: str, command: Any) -> list[tuple[str, Any]]:
    """``command`` and, for a group, each of its subcommands, with their paths."""
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        return [(name, command)]
    return [(f"{name} {sub}", c) for sub, c in subcommands.items()]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_builds_and_its_help_line_is_its_own(name: str) -> None:
    command = build(name)
    assert command.name == name
    line = COMMANDS[name][2]
    assert " ".join((command.help or "").split()).startswith(line.rstrip(".")), line


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - NO_JSON))
def test_every_command_takes_json(name: str) -> None:
    for path, command in leaves(name, build(name)):
        options = {o for p in command.params for o in getattr(p, "opts", ())}
        assert "--json" in options, f"corral {path} has no --json"


def run_python(code: str, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=BOUND_S * 3,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# Runs the command in this interpreter, then prints which modules it imported.
IMPORTED = """
import json, sys
from corral.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
print("\\n=== modules", json.dumps(sorted(sys.modules)))
"""


def imported(output: str) -> set[str]:
    return set(json.loads(output.rsplit("\n=== modules ", 1)[1]))


def test_help_lists_every_command_and_imports_none() -> None:
    out = run_python(IMPORTED, "--help", env={"COLUMNS": "200"})
    for name, (module, _, line) in COMMANDS.items():
        assert re.search(rf"│ {name} +{re.escape(line)}", out), name
        assert f"corral.cli.{module}" not in imported(out)


# What a client command has no use for: the daemon's insides and its server, the gateway,
# and the modules of the other commands.
NOT_FOR_A_CLIENT = (
    "corral.daemon._service",
    "corral.daemon._server",
    "corral.daemon._http",
    "corral.daemon._mcp",
    "corral.daemon.stores",
    "corral.daemon.harnesses",
    "corral.gateway",
    "corral.agent",
    "fastapi",
    "starlette",
    "uvicorn",
    "mcp",
    "sqlite3",
    "psycopg",
    "corral.cli._daemon",
    "corral.cli._decisions",
    "corral.cli._events",
    "corral.cli._gateway",
    "corral.cli._tokens",
)


@pytest.mark.parametrize("args", [["agents"], ["agents", "--json"]])
async def test_agents_imports_no_daemon_and_no_other_command(
    daemon: FrontDoor, args: list[str]
) -> None:
    await daemon.spawn(name="w")
    out = await asyncio.to_thread(
        run_python, IMPORTED, "--url", daemon.url, *args, env={"COLUMNS": "200"}
    )
    modules = imported(out)
    assert "corral.cli._agents" in modules
    found = {m for m in modules for bad in NOT_FOR_A_CLIENT if m == bad or m.startswith(bad + ".")}
    assert found == set()


def test_an_http_client_loads_no_ca_certificates() -> None:
    context = tls_for("http://127.0.0.1:4600")
    assert isinstance(context, ssl.SSLContext)
    assert context.cert_store_stats()["x509_ca"] == 0
    # It would still verify, and so refuse, any TLS it were made to speak.
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert tls_for("https://corral.example") is True


# --- tables that fit the terminal -----------------------------------------------------------


LONG = "a-name-far-longer-than-any-column-would-give-it-on-a-narrow-terminal"


def table_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("│")]


async def test_the_agent_table_fits_60_columns_and_cuts_with_an_ellipsis(
    daemon: FrontDoor,
) -> None:
    daemon.harness.script(LONG, fail("x" * 300))
    first = await daemon.spawn(name=LONG, prompt="go")
    second = await daemon.spawn(name="w", parent=first)
    await settle(lambda: daemon.state(first) == "failed")

    result = await corral("--url", daemon.url, "agents", columns=60)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 60
    rows = table_lines(result.stdout)
    assert len(rows) == 2  # one line an agent: nothing wrapped
    cells = [[c.strip() for c in row.split("│")[1:-1]] for row in rows]
    assert [c[0] for c in cells] == [first, second]  # ids whole
    assert cells[1][5] == first  # the parent's id too
    assert cells[0][1].endswith("…")
    assert LONG.startswith(cells[0][1][:-1])
    assert cells[0][2] == "failed"  # short columns whole

    wide = await corral("--url", daemon.url, "agents", columns=200)
    assert LONG in wide.stdout  # room enough: nothing cut

    shown = await corral("--url", daemon.url, "show", first, columns=60)
    assert shown.exit_code == 0, shown.output
    assert max(len(line) for line in shown.stdout.splitlines()) <= 60
    assert any(re.match(r"│ error +│ x+… │", line) for line in shown.stdout.splitlines())


def test_fit_gives_the_narrow_columns_what_they_need_first() -> None:
    headers = ("id", "a", "b", "c")
    # 4 columns take 13 characters of rule and padding; the id keeps its 10.
    assert _output.fit([10, 12, 40, 80], headers, 13 + 10 + 12 + 30) == [10, 12, 15, 15]
    assert _output.fit([10, 12, 40, 80], headers, 13 + 10 + 8) == [10, 4, 4, 4]  # at least 4
    assert _output.fit([10, 12, 40], headers[:3], 10 + 10 + 12 + 40) == [10, 12, 40]  # it fits


def test_a_cut_cell_ends_with_an_ellipsis_and_wide_characters_count_twice() -> None:
    grid = _output.table("id", "name", title="t")
    grid.add_row("a_1", "漢字漢字漢字")
    grid.add_row("a_2", "x")
    drawn = grid.render(3 * 2 + 1 + 3 + 7).splitlines()
    assert drawn[-3] == "│ a_1 │ 漢字漢… │"
    assert drawn[-2] == "│ a_2 │ x       │"
    assert {cell_len(line) for line in drawn} == {3 * 2 + 1 + 3 + 7}


def test_a_table_is_coloured_for_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    grid = _output.table("id", "state", title="agents")
    grid.add_row("a_1", _output.state("idle"))
    plain = grid.render(40)
    assert "\x1b" not in plain
    coloured = grid.render(40, colour=True)
    assert "\x1b[32midle \x1b[0m" in coloured  # green, as rich's "green" (its padding too)
    assert "\x1b[1mid \x1b[0m" in coloured  # the header bold
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == plain
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert _output.colour_wanted() is False
    monkeypatch.delenv("NO_COLOR")
    assert _output.colour_wanted() is True


def test_a_table_too_wide_for_the_terminal_is_cut_at_its_edge() -> None:
    grid = _output.table(*(f"id{i}" for i in range(6)), title="wide")  # ids are never cut
    grid.add_row(*(f"a_{i}0000000" for i in range(6)))
    for colour in (False, True):
        drawn = grid.render(30, colour=colour)
        shown = re.sub(r"\x1b\[[0-9;]*m", "", drawn).splitlines()
        assert {cell_len(line) for line in shown} == {30}


# --- escaping ---------------------------------------------------------------------------------

HOSTILE = "\x1b]0;title\x07[bold]loud[/bold] \ud800 next"
SHOWN = "\\x1b]0;title\\x07[bold]loud[/bold] \\ud800 next"


def test_a_table_and_a_line_show_hostile_text_as_escapes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    _output.print_table(f"of {HOSTILE}", [{"id": "a_1", "name": HOSTILE}], ["id", "name"])
    _output.say(HOSTILE)
    _output.say(HOSTILE, err=True)
    out, err = capsys.readouterr()
    for text in (out, err):
        assert SHOWN in text
        assert not {"\x1b", "\x07"} & set(text)


async def test_hostile_output_and_errors_are_printed_escaped(daemon: FrontDoor) -> None:
    daemon.harness.script("w", fail(HOSTILE))
    agent = await daemon.spawn(name="w", prompt="go")
    await settle(lambda: daemon.state(agent) == "failed")
    shown = await corral("--url", daemon.url, "show", agent)
    assert shown.exit_code == 0, shown.output
    assert "[bold]loud[/bold]" in shown.stdout  # markup shown, not applied
    assert "\\x1b]0;title\\x07" in shown.stdout
    assert not {"\x1b", "\x07"} & set(shown.stdout)
    exact = json.loads((await corral("--url", daemon.url, "show", agent, "--json")).stdout)
    assert "[bold]loud[/bold]" in exact["error"]
    assert exact["error"].startswith("\x1b]0;title\x07")


# --- exit codes -----------------------------------------------------------------------------


async def test_exit_codes_say_what_happened(daemon: FrontDoor) -> None:
    daemon.harness.script("w", "hang")
    agent = await daemon.spawn(name="w", prompt="go")
    await settle(lambda: agent in daemon.harness.running)

    busy = await corral("--url", daemon.url, "prompt", agent, "again")
    assert busy.exit_code == 75, busy.output  # EX_TEMPFAIL: the same command later
    assert busy.stderr.startswith("error agent_busy:")
    missing = await corral("--url", daemon.url, "show", "a_00000000")
    assert missing.exit_code == 3, missing.output
    usage = await corral("--url", daemon.url, "show")
    assert usage.exit_code == 2, usage.output
    bad = await corral("--url", daemon.url, "budget", agent, "--by", "a", "--why", "b",
                       "--unlimited", "money")  # fmt: skip
    assert bad.exit_code == 2, bad.output

    daemon.harness.release("w")
    await settle(lambda: daemon.state(agent) == "idle")
    stopped = await corral("--url", daemon.url, "stop", agent, "--json")
    assert stopped.exit_code == 0, stopped.output
    assert json.loads(stopped.stdout)["id"] == agent
    await settle(lambda: daemon.state(agent) == "stopped")
    late = await corral("--url", daemon.url, "prompt", agent, "more")
    assert late.exit_code == 4, late.output  # refused in its state, for good
    assert late.stderr.startswith("error agent_not_live:")


async def test_with_json_a_refusal_is_the_daemons_error_body(daemon: FrontDoor) -> None:
    result = await corral("--url", daemon.url, "show", "a_00000000", "--json")
    assert result.exit_code == 3
    assert result.stdout == ""
    error = json.loads(result.stderr)["error"]
    assert (error["code"], error["retryable"]) == ("agent_not_found", False)
    assert error["message"] == "no agent with id 'a_00000000'"
    # Without --json, in the same process: the plain line again.
    plain = await corral("--url", daemon.url, "show", "a_00000000")
    assert plain.stderr == "error agent_not_found: no agent with id 'a_00000000'\n"
