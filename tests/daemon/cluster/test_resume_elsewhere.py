"""An SSE client resuming on another daemon with the Last-Event-ID the first one gave it: the
second may not have read that far yet (it reads the log when woken by the commit's NOTIFY);
it reads the log before refusing a cursor beyond its last event, which a browser's
EventSource would take as fatal (it does not reconnect after an error answer)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from corral.daemon import AgentService, create_app
from corral.daemon.stores._postgres import PostgresStore
from tests.support.harness import ScriptedHarness

pytestmark = pytest.mark.postgres


async def test_a_cursor_from_another_daemon_is_read_up_to(
    tmp_path: Path, postgres_dsn: str
) -> None:
    first, second = PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)
    await first.open()
    await second.open()
    services = [
        AgentService(store, home=tmp_path / name, harnesses={"command": ScriptedHarness()})
        for store, name in ((first, "a"), (second, "b"))
    ]
    try:
        for service in services:
            await service.start()
        spec = {"name": "w", "harness": "command", "command": ["worker"]}
        await services[0].spawn(spec)
        last = first.state.last_seq
        assert second.state.last_seq < last, "the second daemon has not read the log yet"
        transport = httpx.ASGITransport(app=create_app(services[1]))
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            answer = await client.get(
                "/events",
                params={"format": "json"},
                headers={"Last-Event-ID": str(last)},  # it saw the last event
            )
        assert answer.status_code == 200, answer.text
        assert (answer.json()["events"], answer.json()["lastSeq"]) == ([], last)
    finally:
        for service in services:
            await service.close()
        await first.close()
        await second.close()
