"""The example in docs/gateway.md runs as written, against a real PostgreSQL database."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.gateway.corpus import load_shop_postgres

DOC = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"


@pytest.mark.postgres
async def test_gateway_doc_example_runs(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        load_shop_postgres(conn)
    parts = conninfo_to_dict(postgres_dsn)
    url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    example = next(b for b in blocks if "async def main" in b)
    assert "postgresql://postgres@127.0.0.1:5432/shop" in example
    namespace: dict[str, object] = {"__name__": "gateway_doc"}
    exec(
        compile(
            example.replace("postgresql://postgres@127.0.0.1:5432/shop", url), str(DOC), "exec"
        ),
        namespace,
    )
    await namespace["main"]()  # type: ignore[operator]
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("suspiciously_empty")
    assert lines[2] == "ok replayed"
    assert lines[3] == "unknown_column ['total']"
