"""The example tour that ``make run`` shows must keep telling the truth."""

import subprocess
import sys
from pathlib import Path

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
