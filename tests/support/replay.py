"""The event log's first invariant, checked from outside a daemon: its projections are what
a replay of its log gives."""

from __future__ import annotations

import asyncio

from corral.daemon import open_store


def assert_projections_equal_replay(store_url: str) -> None:
    """Open the store at ``store_url`` (the daemons using it may have died) and assert that
    its stored projections equal a replay of its log."""

    async def check() -> None:
        opened = open_store(store_url)
        await opened.open()
        try:
            assert (await opened.replay()).snapshot() == opened.state.snapshot()
        finally:
            await opened.close()

    asyncio.run(check())
