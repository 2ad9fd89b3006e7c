"""Per-database gateway settings (``corral serve --db-option NAME.OPTION=VALUE``): parsed and
typed, gathered per target, refused up front (unknown target, unknown option, an option of
the other engine, a bad value), carried by ``ServeConfig`` to ``Databases.open``, and shown
with the other limits in ``GET /gateway``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.daemon import ServeConfig, TargetOptions
from corral.daemon._databases import Databases
from corral.daemon._targets import parse_db_setting, target_options
from corral.gateway import Gateway, GatewayError
from corral.kernel import InvalidArgumentError
from tests.gateway.corpus import shop_sqlite_file
from tests.test_cli import corral, ok, refused

TARGETS = {"shop": "postgresql://127.0.0.1/shop", "local": "sqlite:///local.db"}


def test_settings_are_parsed_and_typed() -> None:
    assert parse_db_setting("shop.agent_role=gw_agents") == ("shop", "agent_role", "gw_agents")
    assert parse_db_setting("shop.max_bytes=8388608") == ("shop", "max_bytes", 8388608)
    assert parse_db_setting("local.max_statement_chars=5_000") == (
        "local",
        "max_statement_chars",
        5000,
    )
    assert parse_db_setting("shop.replay_cache_bytes=0") == ("shop", "replay_cache_bytes", 0)


@pytest.mark.parametrize(
    ("text", "argument", "expected"),
    [
        ("shop", "value", "NAME.OPTION=VALUE"),
        ("shop=max_bytes", "value", "NAME.OPTION=VALUE"),
        ("9shop.max_bytes=1", "NAME", "a letter"),
        ("shop.max_rows=10", "OPTION", "one of agent_role, max_bytes"),
        ("shop.max_bytes=lots", "max_bytes", "a whole number"),
        ("shop.max_bytes=-1", "max_bytes", "a whole number"),
        ("shop.max_bytes=0", "max_bytes", "a positive integer"),
        ("shop.max_statement_chars=0", "max_statement_chars", "a positive integer"),
        ("shop.replay_cache_bytes=1.5", "replay_cache_bytes", "a whole number"),
        ("shop.agent_role= ", "agent_role", "non-empty"),
    ],
)
def test_a_malformed_setting_is_refused_naming_what(
    text: str, argument: str, expected: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        parse_db_setting(text)
    assert (caught.value.where, caught.value.argument) == ("--db-option", argument)
    assert expected in caught.value.expected


def test_settings_are_gathered_per_target() -> None:
    settings = [
        parse_db_setting("shop.agent_role=gw_agents"),
        parse_db_setting("shop.max_bytes=1024"),
        parse_db_setting("local.max_bytes=2048"),
    ]
    assert target_options(TARGETS, settings) == {
        "shop": TargetOptions(agent_role="gw_agents", max_bytes=1024),
        "local": TargetOptions(max_bytes=2048),
    }
    assert target_options(TARGETS, []) == {}


@pytest.mark.parametrize(
    ("settings", "argument", "expected"),
    [
        (["nope.max_bytes=1"], "NAME", "a database given with --db (local, shop)"),
        (["shop.max_bytes=1", "shop.max_bytes=2"], "OPTION", "given once per database"),
        (["local.agent_role=gw_agents"], "agent_role", "left out for local, a SQLite database"),
        (["local.replay_cache_bytes=1"], "replay_cache_bytes", "PostgreSQL only"),
    ],
)
def test_a_setting_that_does_not_fit_its_target_is_refused(
    settings: list[str], argument: str, expected: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        target_options(TARGETS, [parse_db_setting(s) for s in settings])
    assert (caught.value.where, caught.value.argument) == ("--db-option", argument)
    assert expected in caught.value.expected


def test_target_options_check_their_values() -> None:
    assert TargetOptions().given() == {}
    for bad in ({"max_bytes": 0}, {"max_bytes": True}, {"agent_role": ""}, {"agent_role": 3}):
        with pytest.raises(InvalidArgumentError):
            TargetOptions(**bad)
    with pytest.raises(InvalidArgumentError):
        TargetOptions(replay_cache_bytes=-1)


def test_serve_config_refuses_options_that_do_not_fit(tmp_path: Path) -> None:
    config = ServeConfig(databases=TARGETS, db_options={"shop": TargetOptions(agent_role="a")})
    assert config.db_options == {"shop": TargetOptions(agent_role="a")}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"nope": TargetOptions(max_bytes=1)}, "options"),
        ({"local": TargetOptions(agent_role="a")}, "agent_role"),
        ({"shop": {"max_bytes": 1}}, "options['shop']"),
    ]
    for options, argument in cases:
        with pytest.raises(InvalidArgumentError) as caught:
            ServeConfig(databases=TARGETS, db_options=options)
        assert (caught.value.where, caught.value.argument) == ("ServeConfig", argument)


async def test_serve_passes_the_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from corral.daemon import _server

    seen: list[Any] = []

    async def fake_serve(config: Any, **kwargs: Any) -> None:
        seen.append(config)

    monkeypatch.setattr(_server, "serve", fake_serve)
    # Its handler would hold the runner's stderr, closed once the command returns.
    monkeypatch.setattr(_server, "log_to_stderr", lambda **_: None)
    dbs = ["--db", f"shop={TARGETS['shop']}", "--db", f"local={TARGETS['local']}"]
    settings = ["--db-option", "shop.agent_role=gw_agents", "--db-option", "local.max_bytes=64"]
    ok(await corral("serve", "--home", str(tmp_path), *dbs, *settings))
    [config] = seen
    assert config.db_options == {
        "shop": TargetOptions(agent_role="gw_agents"),
        "local": TargetOptions(max_bytes=64),
    }


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("nope.max_bytes=1", "--db-option: NAME must be a database given with --db"),
        ("shop.colour=red", "--db-option: OPTION must be one of agent_role"),
        ("local.agent_role=x", "--db-option: agent_role must be left out for local"),
        ("shop.max_bytes=big", "--db-option: max_bytes must be a whole number, got 'big'"),
    ],
)
async def test_serve_refuses_a_bad_setting_before_starting(
    tmp_path: Path, setting: str, message: str
) -> None:
    dbs = ["--db", f"shop={TARGETS['shop']}", "--db", f"local={TARGETS['local']}"]
    args = ["serve", "--home", str(tmp_path), *dbs, "--db-option", setting]
    err = refused(await corral(*args), 2)
    assert err.startswith(f"error invalid_argument: {message}"), err


async def test_the_limits_a_target_enforces_are_shown(tmp_path: Path) -> None:
    path = shop_sqlite_file(tmp_path)
    databases = await Databases.open(
        {"local": f"sqlite:///{path}"},
        max_rows=50,
        statement_timeout_s=2,
        options={"local": TargetOptions(max_bytes=4096)},
    )
    try:
        [local] = databases.targets()
        assert local["limits"] == {
            "maxRows": 50,
            "maxBytes": 4096,
            "maxStatementChars": 100_000,
            "statementTimeoutS": 2,
            "agentRole": False,
        }
        # The option reaches the gateway: a row over 4,096 bytes is too large.
        with pytest.raises(GatewayError) as caught:
            await databases.query("local", "a", {"sql": "SELECT zeroblob(5000) AS big"})
        assert caught.value.code == "result_too_large"
        assert "max_bytes=4096" in str(caught.value)
    finally:
        await databases.close()
    async with Gateway.connect(f"sqlite:///{path}") as gw:
        assert Databases({"local": gw}).targets()[0]["limits"] is None


async def test_the_gateway_checks_the_values_too(tmp_path: Path) -> None:
    path = shop_sqlite_file(tmp_path)
    with pytest.raises(InvalidArgumentError) as caught:
        await Databases.open(
            {"local": f"sqlite:///{path}"},
            options={"local": TargetOptions(max_statement_chars=2_000_000)},
        )
    assert caught.value.argument == "max_statement_chars"
    with pytest.raises(InvalidArgumentError) as caught:
        await Databases.open(
            {"local": f"sqlite:///{path}"}, options={"local": TargetOptions(agent_role="a")}
        )
    assert (caught.value.where, caught.value.argument) == ("Databases.open", "agent_role")
