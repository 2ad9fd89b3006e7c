"""``corral serve --db NAME=DSN`` in a real process, driven by ``corral gateway ...``: targets,
queries, a breaker that freezes an agent, the freeze in ``corral decisions``, reinstatement
with who and why, and history. Against a real PostgreSQL and a real SQLite file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.corpus import SHOP_ROWS, shop_sqlite_file
from tests.gateway.gateway_support import separated_roles, shop_dsn
from tests.support.front_door import bearer, serve_env
from tests.test_cli import cli_home, corral, ok, refused

__all__ = ["cli_home", "shop_dsn"]  # fixtures: the command line finds the token of --home

pytestmark = pytest.mark.postgres


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, *args: str) -> AsyncIterator[tuple[str, str]]:
    """``corral serve --port 0 ...args`` in its own process: its URL and the line it printed;
    stopped with SIGTERM, which must end it cleanly."""
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
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=serve_env(),
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert found, line
        yield found.group(1), line
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, stderr
    assert b"Traceback" not in stderr


@pytest.fixture
async def daemon_url(tmp_path: Path, shop_dsn: str) -> AsyncIterator[str]:
    local = shop_sqlite_file(tmp_path)
    async with serving(
        tmp_path, "--db", f"shop={shop_dsn}", "--db", f"local=sqlite:///{local}"
    ) as (url, line):
        assert "databases local, shop" in line
        yield url


async def gw(url: str, *args: str) -> str:
    return ok(await corral("--url", url, "gateway", *args))


async def test_targets_and_queries(daemon_url: str) -> None:
    targets = json.loads(await gw(daemon_url, "targets", "--json"))
    assert [(t["name"], t["dialect"]) for t in targets] == [
        ("local", "sqlite"),
        ("shop", "postgresql"),
    ]
    table = await gw(daemon_url, "targets")
    assert "postgresql" in table
    assert "sqlite" in table

    sql = "SELECT id, status FROM orders WHERE status = $1 ORDER BY id"
    answer = json.loads(
        await gw(daemon_url, "query", "a-1", sql, "-p", '"paid"', "-t", "shop", "--json")
    )
    _, rows = SHOP_ROWS["orders"]
    assert [r["id"] for r in answer["rows"]] == sorted(o[0] for o in rows if o[2] == "paid")

    result = await corral(
        "--url", daemon_url, "gateway", "query", "a-1", sql, "-p", "nothing-like-it", "-t", "shop"
    )
    assert result.exit_code == 0, result.output
    assert "0 row(s), suspiciously_empty" in result.stdout
    assert result.stderr.startswith("warning: suspiciously empty:")

    write = json.dumps(
        {"op": "update", "table": "orders", "where": {"id": 3}, "set": {"status": "refunded"}}
    )
    first = await gw(daemon_url, "query", "a-1", write, "--key", "r-3", "-t", "local")
    again = await gw(daemon_url, "query", "a-1", write, "--key", "r-3", "-t", "local")
    assert first.strip() == "1 row(s)"
    assert "replayed: the stored result, nothing ran" in again

    err = refused(
        await corral("--url", daemon_url, "gateway", "query", "a-1", write, "-t", "local"), 2
    )
    assert err.startswith("error idempotency_key_required:")
    err = refused(await corral("--url", daemon_url, "gateway", "query", "a-1", "SELECT 1"), 3)
    assert err.startswith("error unknown_target: several databases are configured")


async def test_freeze_decide_reinstate_and_history(daemon_url: str) -> None:
    for _ in range(3):
        await gw(
            daemon_url, "freeze", "bot-1", "--reason", "runaway loop", "--by", "ops", "-t", "shop"
        )
    err = refused(
        await corral("--url", daemon_url, "gateway", "query", "bot-1", "SELECT 1", "-t", "shop"), 4
    )
    assert err.startswith("error agent_frozen:")

    frozen = json.loads(await gw(daemon_url, "status", "--json"))
    assert [(f["target"], f["agentId"], f["reason"]) for f in frozen] == [
        ("shop", "bot-1", "runaway loop")
    ]
    decisions = await corral("--url", daemon_url, "decisions")
    assert decisions.exit_code == 0, decisions.output
    assert "gateway_frozen" in decisions.stdout
    assert "bot-1" in decisions.stdout
    assert decisions.stderr.startswith("frozen in a database: corral decide ID reinstate")
    status = await gw(daemon_url, "status", "bot-1", "-t", "shop")
    assert "frozen" in status
    assert "runaway loop" in status

    err = refused(
        await corral(
            "--url", daemon_url, "gateway", "reinstate", "bot-1", "--by", "dana", "-t", "shop"
        ),
        2,
    )
    assert "--reason" in err
    done = await gw(
        daemon_url, "reinstate", "bot-1", "--by", "dana", "--reason", "loop fixed", "-t", "shop"
    )
    assert done.strip() == "bot-1 reinstated in shop by operator"  # the token's name
    assert json.loads(await gw(daemon_url, "status", "--json")) == []
    history = json.loads(await gw(daemon_url, "history", "bot-1", "-t", "shop", "--json"))
    assert [(h["kind"], h["by"], h["reason"]) for h in history] == [
        ("freeze", "operator", "runaway loop"),
        ("reinstatement", "operator", "loop fixed"),
    ]
    resolved = json.loads(
        ok(
            await corral(
                "--url",
                daemon_url,
                "gateway",
                "query",
                "bot-1",
                "SELECT 1 AS x",
                "-t",
                "shop",
                "--json",
            )
        )
    )
    assert resolved["rows"] == [{"x": 1}]


@pytest.fixture
def roles(shop_dsn: str) -> Iterator[tuple[str, str]]:
    """An owner's DSN and an agent role, made as docs/gateway.md "Deploying on PostgreSQL"
    lists (roles are the cluster's: unique names, dropped after)."""
    with separated_roles(shop_dsn, writes="INSERT, UPDATE, DELETE") as made:
        yield made


async def test_serve_with_an_agent_role_and_limits_per_database(
    tmp_path: Path, roles: tuple[str, str]
) -> None:
    dsn, agent_role = roles
    local = shop_sqlite_file(tmp_path)
    async with serving(
        tmp_path,
        "--db",
        f"shop={dsn}",
        "--db",
        f"local=sqlite:///{local}",
        "--db-option",
        f"shop.agent_role={agent_role}",
        "--db-option",
        "shop.max_bytes=8388608",
        "--db-option",
        "local.max_statement_chars=5000",
    ) as (url, _):
        sql = "SELECT current_user AS u, count(*) AS n FROM orders"
        answer = json.loads(await gw(url, "query", "a-1", sql, "-t", "shop", "--json"))
        assert answer["rows"] == [{"u": agent_role, "n": len(SHOP_ROWS["orders"][1])}]
        async with httpx.AsyncClient(base_url=url, headers=bearer(tmp_path / "home")) as http:
            targets = (await http.get("/gateway")).json()["targets"]
    limits = {t["name"]: t["limits"] for t in targets}
    assert limits == {
        "local": {
            "maxRows": 1000,
            "maxBytes": 16 * 1024 * 1024,
            "maxStatementChars": 5000,
            "statementTimeoutS": 5.0,
            "agentRole": False,
        },
        "shop": {
            "maxRows": 1000,
            "maxBytes": 8388608,
            "maxStatementChars": 100_000,
            "statementTimeoutS": 5.0,
            "agentRole": True,
        },
    }
    # Nothing of the DSN or of the role's name is shown.
    shown = json.dumps(targets)
    assert agent_role not in shown
    assert dsn not in shown
    assert "corral_owner_" not in shown


async def test_serve_refuses_a_bad_or_repeated_db(tmp_path: Path) -> None:
    base = ["serve", "--port", "0", "--home", str(tmp_path)]
    err = refused(await corral(*base, "--db", "shop"), 2)
    assert err.startswith("error invalid_argument: --db: value must be NAME=DSN")
    err = refused(await corral(*base, "--db", "a=x.db", "--db", "a=y.db"), 2)
    assert "a name given once" in err
    err = refused(await corral(*base, "--db", "s=mysql://h/db"), 2)
    assert "postgresql://" in err


async def test_text_from_agents_is_shown_not_interpreted(daemon_url: str) -> None:
    # A reason (an agent can freeze itself with its own token) or a row value holding rich
    # markup must neither crash nor restyle what a person reads.
    await gw(daemon_url, "freeze", "bot-[red]", "--reason", "[/x] oops [bold]", "-t", "shop")
    decisions = await corral("--url", daemon_url, "decisions")
    assert decisions.exit_code == 0, decisions.output
    assert "[/x] oops [bold]" in decisions.stdout
    assert "bot-[red]" in decisions.stdout
    assert "[/x] oops [bold]" in await gw(daemon_url, "status")
    assert "[/x] oops [bold]" in await gw(daemon_url, "status", "bot-[red]", "-t", "shop")
    assert "[/x] oops" in await gw(daemon_url, "history", "bot-[red]", "-t", "shop")

    sql = "SELECT $1::text AS v, $2::text AS w"
    table = await gw(daemon_url, "query", "a-1", sql, "-p", "[/bold] x", "-p", "NaN", "-t", "shop")
    assert "[/bold] x" in table
    assert "NaN" in table
    only_local = json.loads(await gw(daemon_url, "status", "-t", "local", "--json"))
    assert only_local == []
