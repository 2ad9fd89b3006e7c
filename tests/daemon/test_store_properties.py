"""Property tests of the stores (hypothesis): any JSON value, any Unicode string (lone
surrogates and NUL included), in an event, round-trips through SQLite and PostgreSQL (append,
read, reopen, replay equals state) or is refused with ``UnstorableValueError``, writing
nothing; and what a spawn or a harness brings in is taken, refused or stored escaped.

``make test`` runs a few examples (``CORRAL_FUZZ_EXAMPLES``, default 10); ``make
fuzz-stores`` many more.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.daemon import (
    AgentService,
    InvalidSpecError,
    NewEvent,
    SQLiteStore,
    Store,
    TurnResult,
    UnstorableValueError,
)
from corral.daemon.stores import PostgresStore
from tests.support.harness import ScriptedHarness

EXAMPLES = int(os.environ.get("CORRAL_FUZZ_EXAMPLES", "10"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Every code point, surrogates included (hypothesis leaves them out unless told).
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=30)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield key
            yield from strings(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from strings(inner)


def keepable(value: Any) -> bool:
    """What every store can keep: no string holds NUL or a lone surrogate."""
    return not any(
        c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF for text in strings(value) for c in text
    )


Factory = Callable[[], Store]


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Factory]:
    """Makes a factory of one fresh store (each call: a new file, or a new schema), which
    opens that same store each time it is called."""
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None

    def fresh() -> Factory:
        name = uuid.uuid4().hex[:12]
        if dsn is None:
            return lambda: SQLiteStore(tmp_path / f"{name}.db")
        return lambda: PostgresStore(dsn, schema=f"p_{name}")

    return fresh


async def _round_trip(factory: Factory, value: Any, agent_id: str) -> None:
    store = factory()
    await store.open()
    try:
        await store.append([NewEvent("gateway.agent_frozen", "a_1", {"first": True})])
        before = store.state.snapshot()
        events = [NewEvent("gateway.agent_frozen", agent_id, {"value": value})]
        if keepable(value) and keepable(agent_id):
            written = await store.append(events)
            assert [(e.agent_id, e.data) for e in written] == [(agent_id, {"value": value})]
        else:
            with pytest.raises(UnstorableValueError):
                await store.append(events)
            assert store.state.snapshot() == before
        read = await store.read()
    finally:
        await store.close()
    again = factory()
    await again.open()
    try:
        assert [(e.agent_id, e.data) for e in await again.read()] == [
            (e.agent_id, e.data) for e in read
        ]
        assert (await again.replay()).snapshot() == again.state.snapshot()
        assert again.state.last_seq == len(read)
    finally:
        await again.close()


@SETTINGS
@given(value=JSON_VALUES, agent_id=ANY_TEXT.filter(bool))
def test_any_json_value_round_trips_or_is_refused(
    new_store: Callable[[], Factory], value: Any, agent_id: str
) -> None:
    asyncio.run(_round_trip(new_store(), value, agent_id))


async def _spawn_and_run(factory: Factory, home: Path, spec: dict[str, Any], output: str) -> None:
    store = factory()
    await store.open()
    harness = ScriptedHarness()
    harness.script(spec["name"], TurnResult(output=output))
    service = AgentService(store, home=home, harnesses={"command": harness})
    await service.start()
    try:
        # A refusal is right only for text no store keeps, or a control character in the
        # name (each of those is one that str.isprintable refuses too).
        refused = not keepable(spec) or any(not c.isprintable() for c in spec["name"])
        try:
            created = (await service.spawn(spec)).body
        except InvalidSpecError:
            if refused:
                return
            raise
        await asyncio.wait_for(service.settled(created["id"]), 10)
        record = service.get(created["id"])
        assert record["spec"]["prompt"] == spec["prompt"]
        expected = "".join(
            "\ufffd" if c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF else c for c in output
        )
        assert record["lastOutput"] == expected
        json.dumps(service.list_agents(), ensure_ascii=False).encode()  # valid UTF-8
    finally:
        await service.close()
        await store.close()
    again = factory()
    await again.open()
    try:
        assert (await again.replay()).snapshot() == again.state.snapshot()
        assert again.state.agents[created["id"]]["lastOutput"] == expected
    finally:
        await again.close()


@SETTINGS
@given(name=ANY_TEXT.filter(bool), prompt=ANY_TEXT.filter(bool), output=ANY_TEXT)
def test_spawns_are_taken_or_refused_and_outputs_stored_escaped(
    new_store: Callable[[], Factory], tmp_path: Path, name: str, prompt: str, output: str
) -> None:
    spec = {"name": name[:200], "harness": "command", "command": ["worker"], "prompt": prompt}
    asyncio.run(_spawn_and_run(new_store(), tmp_path / uuid.uuid4().hex, spec, output))
