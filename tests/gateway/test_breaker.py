"""Per-agent breakers: signals, rolling windows, freezes with evidence, reinstatement,
durability on SQLite and PostgreSQL, callbacks and concurrency."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from corral.daemon import http_status
from corral.gateway import (
    BreakerPolicy,
    Freeze,
    FreezeJournal,
    GatewayError,
    PostgresFreezeJournal,
    Reinstatement,
    RequestOutcome,
    SQLiteFreezeJournal,
)
from corral.gateway._breaker import _MAX_REQUEST_CHARS, Breakers
from corral.gateway._breaker_records import OUTCOME_SIGNALS, SIGNALS, Signal, record_from_dict
from corral.gateway._errors import CODES
from corral.kernel import InvalidArgumentError, UsageError
from corral.runtime import FakeClock

POLICY = BreakerPolicy(window_s=10.0, max_errors=3, max_refusals=4, max_suspicious_empties=2)
CODE_OF: dict[Signal, str] = {
    "errors": "database_error",
    "refusals": "unknown_column",
    "suspicious_empties": "suspiciously_empty",
}
LABEL: dict[Signal, str] = {
    "errors": "errors",
    "refusals": "refusals",
    "suspicious_empties": "suspicious empties",
}


def outcome(code: str = "database_error", request: str = "SELECT 1", **kw: Any) -> RequestOutcome:
    return RequestOutcome(request=request, code=code, **kw)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "freezes.db"


@pytest.fixture
async def breakers(clock: FakeClock, journal_path: Path) -> AsyncIterator[Breakers]:
    async with Breakers(POLICY, journal=SQLiteFreezeJournal(journal_path), clock=clock) as b:
        yield b


async def trip(b: Breakers, agent_id: str, signal: Signal = "errors") -> Freeze:
    threshold = b.policy.threshold(signal)
    assert threshold is not None
    freeze = None
    for i in range(threshold):
        freeze = await b.observe(agent_id, outcome(CODE_OF[signal], f"q{i}"))
    assert freeze is not None
    return freeze


class GatedJournal(SQLiteFreezeJournal):
    """A real journal whose writes can be held at a gate or made to fail."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered = asyncio.Event()
        self.gate: asyncio.Event | None = None
        self.failing = False

    async def _before_write(self) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.failing:
            raise GatewayError("database_unavailable", "the journal is down (test)")

    async def record_freeze(self, freeze: Freeze) -> None:
        await self._before_write()
        await super().record_freeze(freeze)

    async def record_reinstatement(self, reinstatement: Reinstatement) -> None:
        await self._before_write()
        await super().record_reinstatement(reinstatement)


# --- policy and outcomes ------------------------------------------------------------------


def test_policy_defaults_and_thresholds() -> None:
    policy = BreakerPolicy()
    assert (policy.window_s, policy.max_errors, policy.max_refusals) == (60.0, 5, 10)
    assert policy.max_suspicious_empties == 5
    assert policy.thresholds == {"errors": 5, "refusals": 10, "suspicious_empties": 5}
    assert BreakerPolicy(max_refusals=None).threshold("refusals") is None


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, "60", True, None])
def test_policy_refuses_a_bad_window(value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        BreakerPolicy(window_s=value)
    assert info.value.argument == "window_s"
    assert "BreakerPolicy: window_s must be a finite number > 0" in str(info.value)


@pytest.mark.parametrize("name", ["max_errors", "max_refusals", "max_suspicious_empties"])
@pytest.mark.parametrize("value", [0, -2, 1.5, "5", True])
def test_policy_refuses_a_bad_threshold(name: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        BreakerPolicy(**{name: value})
    assert info.value.argument == name
    assert "a positive integer or None" in str(info.value)


def test_policy_is_frozen_and_keyword_only() -> None:
    with pytest.raises(TypeError):
        BreakerPolicy(60.0)  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        POLICY.max_errors = 9  # type: ignore[misc]


def test_every_gateway_code_has_a_documented_signal() -> None:
    assert set(CODES) <= set(OUTCOME_SIGNALS)
    errors = {
        "database_error",
        "invalid_data",
        "constraint_violation",
        "transaction_conflict",
        "statement_timeout",
        "result_too_large",
        "read_only_violation",
    }
    refusals = {
        "parse_error",
        "statement_too_complex",
        "multiple_statements",
        "forbidden_statement",
        "forbidden_function",
        "unknown_table",
        "unknown_column",
        "invalid_operation",
        "idempotency_key_required",
        "idempotency_conflict",
    }
    for code, signal in OUTCOME_SIGNALS.items():
        if code in errors:
            assert signal == "errors", code
        elif code in refusals:
            assert signal == "refusals", code
        elif code == "suspiciously_empty":
            assert signal == "suspicious_empties"
        else:
            assert signal is None, code


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"request": "q", "code": "nope"}, "code"),
        ({"request": "q", "code": 5}, "code"),
        ({"request": None, "code": "ok"}, "request"),
        ({"request": "q", "code": "ok", "at": datetime(2026, 1, 1)}, "at"),
        ({"request": "q", "code": "ok", "message": 5}, "message"),
    ],
)
def test_request_outcome_refuses_bad_fields(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        RequestOutcome(**kwargs)
    assert info.value.argument == argument


def test_request_outcome_from_error_and_round_trip() -> None:
    error = GatewayError("unknown_column", "no column 'stauts' in orders")
    at = datetime(2026, 3, 1, tzinfo=UTC)
    made = RequestOutcome.from_error("SELECT stauts FROM orders", error, at=at)
    assert (made.code, made.message, made.signal, made.at) == (
        "unknown_column",
        "no column 'stauts' in orders",
        "refusals",
        at,
    )
    assert RequestOutcome.from_dict(made.to_dict()) == made
    with pytest.raises(InvalidArgumentError):
        RequestOutcome.from_error("q", ValueError("x"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a breaker record"):
        record_from_dict({"kind": "other"})


# --- signals and windows ------------------------------------------------------------------


@pytest.mark.parametrize("signal", SIGNALS)
async def test_each_signal_trips_at_its_threshold_and_not_before(
    breakers: Breakers, clock: FakeClock, signal: Signal
) -> None:
    threshold = POLICY.threshold(signal)
    assert threshold is not None
    for i in range(threshold - 1):
        assert await breakers.observe("a", outcome(CODE_OF[signal], f"q{i}")) is None
        clock.advance(1)
    assert not breakers.is_frozen("a")
    breakers.check("a")
    assert breakers.status("a").counts[signal] == threshold - 1

    freeze = await breakers.observe("a", outcome(CODE_OF[signal], "last"))
    assert freeze is not None
    assert (freeze.signal, freeze.count, freeze.threshold, freeze.window_s) == (
        signal,
        threshold,
        threshold,
        10.0,
    )
    assert freeze.automatic
    assert freeze.by is None
    assert breakers.is_frozen("a")
    assert breakers.current_freeze("a") == freeze
    with pytest.raises(GatewayError) as info:
        breakers.check("a")
    error = info.value
    assert (error.code, http_status(error), error.retryable) == ("agent_frozen", 423, False)
    assert f"freeze {freeze.id}" in error.message
    assert f"{threshold} {LABEL[signal]} within 10 s" in error.message
    assert f"threshold of {threshold}" in error.message
    assert error.details["freeze_id"] == freeze.id
    assert error.details["signal"] == signal
    assert (error.details["count"], error.details["threshold"]) == (threshold, threshold)
    assert error.details["window_s"] == 10.0


@pytest.mark.parametrize("code", sorted(OUTCOME_SIGNALS))
async def test_every_code_counts_only_toward_its_signal(breakers: Breakers, code: str) -> None:
    signal = OUTCOME_SIGNALS[code]
    for _ in range(20):
        await breakers.observe("a", outcome(code))
        if breakers.is_frozen("a"):
            break
    status = breakers.status("a")
    if signal is None:
        assert not status.frozen
        assert dict(status.counts) == dict.fromkeys(SIGNALS, 0)
    else:
        assert status.frozen
        assert status.freeze is not None
        assert status.freeze.signal == signal
        assert status.freeze.count == POLICY.threshold(signal)


async def test_signals_count_separately(breakers: Breakers) -> None:
    for code in ["database_error"] * 2 + ["parse_error"] * 3 + ["suspiciously_empty"]:
        await breakers.observe("a", outcome(code))
    status = breakers.status("a")
    assert not status.frozen
    assert dict(status.counts) == {"errors": 2, "refusals": 3, "suspicious_empties": 1}
    assert dict(status.thresholds) == {"errors": 3, "refusals": 4, "suspicious_empties": 2}
    assert status.window_s == 10.0
    assert status.to_dict()["counts"] == {"errors": 2, "refusals": 3, "suspicious_empties": 1}


async def test_the_rolling_window_forgets_old_events(breakers: Breakers, clock: FakeClock) -> None:
    await breakers.observe("a", outcome(request="t0"))
    clock.advance(5)
    await breakers.observe("a", outcome(request="t5"))
    clock.advance(5)  # t=10: the t0 event is exactly window_s old and forgotten
    assert await breakers.observe("a", outcome(request="t10")) is None
    assert breakers.status("a").counts["errors"] == 2
    clock.advance(4.9)
    freeze = await breakers.observe("a", outcome(request="t14.9"))
    assert freeze is not None
    assert [e.request for e in freeze.evidence] == ["t5", "t10", "t14.9"]


async def test_counts_drop_to_zero_once_the_window_has_passed(
    breakers: Breakers, clock: FakeClock
) -> None:
    for _ in range(2):
        await breakers.observe("a", outcome())
    clock.advance(10)
    assert breakers.status("a").counts["errors"] == 0
    for _ in range(2):
        assert await breakers.observe("a", outcome()) is None


async def test_a_disabled_signal_never_trips(journal_path: Path) -> None:
    policy = BreakerPolicy(max_refusals=None)
    async with Breakers(policy, journal=SQLiteFreezeJournal(journal_path)) as b:
        for _ in range(50):
            assert await b.observe("a", outcome("parse_error")) is None
        status = b.status("a")
        assert not status.frozen
        assert status.counts["refusals"] == 0
        assert status.thresholds["refusals"] is None


async def test_agents_are_counted_apart(breakers: Breakers) -> None:
    for agent in ("a", "b"):
        for _ in range(2):
            await breakers.observe(agent, outcome())
    assert not breakers.is_frozen("a")
    assert not breakers.is_frozen("b")
    await breakers.observe("a", outcome())
    assert breakers.is_frozen("a")
    assert not breakers.is_frozen("b")
    breakers.check("b")
    assert set(breakers.frozen_agents()) == {"a"}


async def test_evidence_holds_the_window_across_signals_in_order(
    breakers: Breakers, clock: FakeClock
) -> None:
    await breakers.observe("a", outcome("database_error", "too old"))
    clock.advance(11)
    given_at = datetime(2025, 12, 31, tzinfo=UTC)
    await breakers.observe("a", outcome("unknown_table", "SELECT * FROM ordrs", at=given_at))
    clock.advance(1)
    seen = [clock.now()]
    error = GatewayError("statement_timeout", "statement ran past 5 s")
    await breakers.observe("a", RequestOutcome.from_error("SELECT pg_sleep(9)", error))
    clock.advance(1)
    await breakers.observe("a", outcome("suspiciously_empty", "find orders status=opne"))
    clock.advance(1)
    seen.append(clock.now())
    freeze = await breakers.observe("a", outcome("suspiciously_empty", "find orders id=0"))
    assert freeze is not None
    assert freeze.signal == "suspicious_empties"
    assert [(e.code, e.request) for e in freeze.evidence] == [
        ("unknown_table", "SELECT * FROM ordrs"),
        ("statement_timeout", "SELECT pg_sleep(9)"),
        ("suspiciously_empty", "find orders status=opne"),
        ("suspiciously_empty", "find orders id=0"),
    ]
    assert freeze.evidence[0].at == given_at
    assert freeze.evidence[1].at == seen[0]
    assert freeze.evidence[1].message == "statement ran past 5 s"
    assert freeze.evidence[3].at == seen[1]
    assert "2 suspicious empties within 10 s reached the threshold of 2" in freeze.reason
    assert (await breakers.history("a")) == [freeze]


async def test_a_huge_request_is_cut_in_the_evidence(breakers: Breakers) -> None:
    long_sql = "SELECT " + "x" * (_MAX_REQUEST_CHARS * 2)
    for _ in range(3):
        freeze = await breakers.observe("a", outcome(request=long_sql))
    assert freeze is not None
    assert freeze.evidence[0].request == long_sql[:_MAX_REQUEST_CHARS] + "..."


async def test_outcomes_while_frozen_are_not_counted(breakers: Breakers) -> None:
    await trip(breakers, "a")
    for _ in range(10):
        assert await breakers.observe("a", outcome()) is None
    assert dict(breakers.status("a").counts) == dict.fromkeys(SIGNALS, 0)
    assert len(await breakers.history("a")) == 1


# --- reinstating and freezing by hand -----------------------------------------------------


@pytest.mark.parametrize("field", ["by", "reason"])
@pytest.mark.parametrize("value", ["", "   ", None, 7])
async def test_reinstate_needs_by_and_reason(breakers: Breakers, field: str, value: Any) -> None:
    await trip(breakers, "a")
    kwargs = {"by": "alice", "reason": "stale enum value"} | {field: value}
    with pytest.raises(InvalidArgumentError) as info:
        await breakers.reinstate("a", **kwargs)
    assert info.value.argument == field
    assert f"Breakers.reinstate: {field} must be a non-empty string" in str(info.value)
    assert breakers.is_frozen("a")
    assert [r.kind for r in await breakers.history("a")] == ["freeze"]


async def test_reinstate_of_an_agent_not_frozen_is_refused(breakers: Breakers) -> None:
    with pytest.raises(UsageError, match="agent 'a' is not frozen"):
        await breakers.reinstate("a", by="alice", reason="why not")
    assert await breakers.history("a") == []


async def test_reinstate_is_recorded_and_starts_counting_afresh(
    breakers: Breakers, clock: FakeClock
) -> None:
    first = await trip(breakers, "a")
    clock.advance(30)
    record = await breakers.reinstate("a", by="alice", reason="stale enum value, not an attack")
    assert (record.by, record.reason, record.freeze_id) == (
        "alice",
        "stale enum value, not an attack",
        first.id,
    )
    assert record.at == clock.now()
    assert not breakers.is_frozen("a")
    breakers.check("a")
    assert dict(breakers.status("a").counts) == dict.fromkeys(SIGNALS, 0)
    for _ in range(2):
        assert await breakers.observe("a", outcome()) is None
    second = await breakers.observe("a", outcome())
    assert second is not None
    assert second.id != first.id
    history = await breakers.history("a")
    assert history == [first, record, second]
    assert [r.kind for r in history] == ["freeze", "reinstatement", "freeze"]


async def test_concurrent_reinstates_lift_the_freeze_once(breakers: Breakers) -> None:
    await trip(breakers, "a")
    results = await asyncio.gather(
        breakers.reinstate("a", by="alice", reason="checked"),
        breakers.reinstate("a", by="bob", reason="checked too"),
        return_exceptions=True,
    )
    assert sum(isinstance(r, Reinstatement) for r in results) == 1
    assert sum(isinstance(r, UsageError) for r in results) == 1
    assert [r.kind for r in await breakers.history("a")] == ["freeze", "reinstatement"]


async def test_manual_freeze(breakers: Breakers) -> None:
    await breakers.observe("a", outcome("parse_error", "SELEC 1"))
    freeze = await breakers.freeze("a", reason="looping on refunds", by="ops")
    assert (freeze.signal, freeze.by, freeze.reason, freeze.automatic) == (
        None,
        "ops",
        "looping on refunds",
        False,
    )
    assert [e.request for e in freeze.evidence] == ["SELEC 1"]
    with pytest.raises(GatewayError) as info:
        breakers.check("a")
    assert info.value.code == "agent_frozen"
    assert f"freeze {freeze.id}" in info.value.message
    assert "frozen by ops: looping on refunds" in info.value.message
    assert info.value.details["by"] == "ops"
    # Idempotent: the freeze in effect is kept and returned.
    again = await breakers.freeze("a", reason="another reason")
    assert again == freeze
    assert await breakers.history("a") == [freeze]
    anonymous = await breakers.freeze("b", reason="suspected leak")
    assert anonymous.by is None
    with pytest.raises(GatewayError, match="frozen by an operator: suspected leak"):
        breakers.check("b")


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [({"reason": ""}, "reason"), ({"reason": None}, "reason"), ({"reason": "r", "by": ""}, "by")],
)
async def test_manual_freeze_refuses_bad_arguments(
    breakers: Breakers, kwargs: dict[str, Any], argument: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        await breakers.freeze("a", **kwargs)
    assert info.value.argument == argument
    assert not breakers.is_frozen("a")


# --- on_freeze ----------------------------------------------------------------------------


async def test_on_freeze_plain_function(journal_path: Path) -> None:
    calls: list[tuple[str, Freeze]] = []
    journal = SQLiteFreezeJournal(journal_path)
    async with Breakers(POLICY, journal=journal, on_freeze=lambda a, f: calls.append((a, f))) as b:
        freeze = await trip(b, "a")
        assert calls == [("a", freeze)]
        manual = await b.freeze("b", reason="manual")
        assert calls[1:] == [("b", manual)]


async def test_on_freeze_coroutine_is_awaited(journal_path: Path) -> None:
    calls: list[str] = []

    async def drain(agent_id: str, freeze: Freeze) -> None:
        await asyncio.sleep(0)
        calls.append(f"{agent_id}:{freeze.id}")

    async with Breakers(POLICY, journal=SQLiteFreezeJournal(journal_path), on_freeze=drain) as b:
        freeze = await trip(b, "a")
        assert calls == [f"a:{freeze.id}"]


async def test_a_raising_on_freeze_is_logged(
    journal_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(agent_id: str, freeze: Freeze) -> None:
        raise RuntimeError("pool already closed")

    caplog.set_level(logging.ERROR, logger="corral.gateway.breaker")
    async with Breakers(POLICY, journal=SQLiteFreezeJournal(journal_path), on_freeze=broken) as b:
        freeze = await trip(b, "a")
        assert b.is_frozen("a")
        assert await b.history("a") == [freeze]
    [record] = [r for r in caplog.records if r.name == "corral.gateway.breaker"]
    assert "on_freeze failed for agent 'a'" in record.getMessage()
    assert freeze.id in record.getMessage()
    assert record.exc_info is not None
    assert "pool already closed" in str(record.exc_info[1])


# --- concurrency --------------------------------------------------------------------------


async def test_concurrent_observers_freeze_exactly_once(journal_path: Path) -> None:
    calls: list[Freeze] = []
    policy = BreakerPolicy(max_errors=5)
    journal = SQLiteFreezeJournal(journal_path)
    async with Breakers(policy, journal=journal, on_freeze=lambda a, f: calls.append(f)) as b:
        results = await asyncio.gather(
            *(
                b.observe(agent, outcome(request=f"{agent}-{i}"))
                for i in range(40)
                for agent in "abc"
            )
        )
        freezes = [r for r in results if r is not None]
        assert sorted(f.agent_id for f in freezes) == ["a", "b", "c"]
        assert sorted(calls, key=lambda f: f.agent_id) == sorted(freezes, key=lambda f: f.agent_id)
        for freeze in freezes:
            assert freeze.count == 5
            assert len(freeze.evidence) == 5
            assert await b.history(freeze.agent_id) == [freeze]


async def test_reading_from_other_threads_while_observing(breakers: Breakers) -> None:
    stop = threading.Event()
    seen: list[tuple[bool, int]] = []
    failures: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                status = breakers.status("a")
                seen.append((status.frozen, status.counts["errors"]))
                breakers.is_frozen("a")
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for round_ in range(30):
            await trip(breakers, "a")
            await breakers.reinstate("a", by="alice", reason=f"round {round_}")
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert failures == []
    assert seen
    assert all(count < 3 for _, count in seen)
    assert len(await breakers.history("a")) == 60


async def test_a_reinstatement_waits_for_the_freeze_it_lifts(
    journal_path: Path, clock: FakeClock
) -> None:
    journal = GatedJournal(journal_path)
    async with Breakers(POLICY, journal=journal, clock=clock) as b:
        journal.gate = asyncio.Event()
        tripping = asyncio.gather(*(b.observe("a", outcome()) for _ in range(3)))
        await asyncio.wait_for(journal.entered.wait(), 5)
        assert b.is_frozen("a")  # in effect before it is written
        reinstating = asyncio.ensure_future(b.reinstate("a", by="alice", reason="checked"))
        await asyncio.sleep(0)
        assert not reinstating.done()
        journal.gate.set()
        freeze = [r for r in await tripping if r is not None]
        record = await reinstating
        assert await b.history("a") == [*freeze, record]


async def test_a_cancelled_observer_still_records_and_notifies(journal_path: Path) -> None:
    notified = asyncio.Event()
    journal = GatedJournal(journal_path)
    async with Breakers(POLICY, journal=journal, on_freeze=lambda a, f: notified.set()) as b:
        for _ in range(2):
            await b.observe("a", outcome())
        journal.gate = asyncio.Event()
        task = asyncio.ensure_future(b.observe("a", outcome()))
        await asyncio.wait_for(journal.entered.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert b.is_frozen("a")
        journal.gate.set()
        await asyncio.wait_for(notified.wait(), 5)
        [freeze] = await b.history("a")
        assert freeze == b.current_freeze("a")


# --- journal failures ---------------------------------------------------------------------


async def test_an_unrecorded_freeze_stays_in_effect_and_is_written_later(
    journal_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="corral.gateway.breaker")
    journal = GatedJournal(journal_path)
    async with Breakers(POLICY, journal=journal) as b:
        journal.failing = True
        freeze = await trip(b, "a")
        assert b.is_frozen("a")
        assert any("not yet recorded" in r.getMessage() for r in caplog.records)
        with pytest.raises(GatewayError) as info:
            await b.reinstate("a", by="alice", reason="checked")
        assert info.value.code == "database_unavailable"
        assert info.value.retryable
        assert b.is_frozen("a")
        manual_error = None
        try:
            await b.freeze("b", reason="by hand")
        except GatewayError as exc:
            manual_error = exc
        assert manual_error is not None
        assert manual_error.code == "database_unavailable"
        assert b.is_frozen("b")
        journal.failing = False
        record = await b.reinstate("a", by="alice", reason="checked")
        assert await b.history("a") == [freeze, record]
    async with Breakers(POLICY, journal=SQLiteFreezeJournal(journal_path)) as b:
        assert b.is_frozen("b")
        assert not b.is_frozen("a")


async def test_close_writes_what_is_still_unrecorded(journal_path: Path) -> None:
    journal = GatedJournal(journal_path)
    b = Breakers(POLICY, journal=journal)
    await b.open()
    journal.failing = True
    freeze = await trip(b, "a")
    journal.failing = False
    await b.close()
    async with Breakers(POLICY, journal=SQLiteFreezeJournal(journal_path)) as again:
        assert again.current_freeze("a") == freeze


# --- durability ---------------------------------------------------------------------------


async def restart_scenario(make_journal: Callable[[], FreezeJournal], clock: FakeClock) -> None:
    async with Breakers(POLICY, journal=make_journal(), clock=clock) as b:
        frozen_a = await trip(b, "a", "refusals")
        frozen_b = await trip(b, "b")
        lifted_b = await b.reinstate("b", by="alice", reason="stale enum value")
        frozen_c = await b.freeze("c", reason="runaway loop", by="ops")
        for _ in range(2):
            await b.observe("d", outcome())
    clock.advance(1)
    async with Breakers(POLICY, journal=make_journal(), clock=clock) as b:
        assert b.frozen_agents() == {"a": frozen_a, "c": frozen_c}
        assert not b.is_frozen("b")
        assert not b.is_frozen("d")
        with pytest.raises(GatewayError, match=frozen_a.id):
            b.check("a")
        assert await b.history("a") == [frozen_a]
        assert await b.history("b") == [frozen_b, lifted_b]
        assert await b.history("nobody") == []
        # Counts do not survive a restart: d starts from zero.
        assert b.status("d").counts["errors"] == 0
        assert await b.observe("d", outcome()) is None
        lifted_a = await b.reinstate("a", by="bob", reason="reviewed after restart")
    async with Breakers(POLICY, journal=make_journal(), clock=clock) as b:
        assert set(b.frozen_agents()) == {"c"}
        assert await b.history("a") == [frozen_a, lifted_a]
        assert lifted_a.by == "bob"
        assert lifted_a.reason == "reviewed after restart"


async def test_freezes_and_history_survive_a_restart_on_sqlite(
    journal_path: Path, clock: FakeClock
) -> None:
    await restart_scenario(lambda: SQLiteFreezeJournal(journal_path), clock)


@pytest.mark.postgres
async def test_freezes_and_history_survive_a_restart_on_postgres(
    postgres_dsn: str, clock: FakeClock
) -> None:
    await restart_scenario(lambda: PostgresFreezeJournal(postgres_dsn, schema="corral"), clock)


@pytest.mark.postgres
async def test_postgres_journal_on_a_caller_pool(postgres_dsn: str, clock: FakeClock) -> None:
    async with AsyncConnectionPool(postgres_dsn, min_size=1, max_size=2) as pool:
        await restart_scenario(lambda: PostgresFreezeJournal(pool), clock)
        assert not pool.closed  # the caller's pool is the caller's to close


@pytest.mark.postgres
async def test_concurrent_observers_freeze_once_on_postgres(postgres_dsn: str) -> None:
    async with Breakers(POLICY, journal=PostgresFreezeJournal(postgres_dsn)) as b:
        results = await asyncio.gather(
            *(b.observe(agent, outcome("parse_error")) for _ in range(30) for agent in "xyz")
        )
        assert sorted(r.agent_id for r in results if r is not None) == ["x", "y", "z"]
        for agent in "xyz":
            [freeze] = await b.history(agent)
            assert isinstance(freeze, Freeze)
            assert freeze.count == 4
            assert len(freeze.evidence) == 4


async def test_sqlite_journal_on_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database file" * 100)
    with pytest.raises(GatewayError) as info:
        await SQLiteFreezeJournal(path).open()
    assert info.value.code == "database_unavailable"
    assert str(path) in info.value.message


async def test_postgres_journal_when_the_server_does_not_answer() -> None:
    journal = PostgresFreezeJournal("postgresql://postgres@127.0.0.1:1/none")
    with pytest.raises(GatewayError) as info:
        await journal.open()
    assert info.value.code == "database_unavailable"
    assert info.value.retryable
    assert "port=1" in info.value.message


async def test_journals_refuse_use_before_open(journal_path: Path) -> None:
    with pytest.raises(UsageError, match="not open"):
        await SQLiteFreezeJournal(journal_path).history("a")
    with pytest.raises(UsageError, match="not open"):
        await PostgresFreezeJournal("postgresql://127.0.0.1/x").history("a")


# --- bad input and lifecycle --------------------------------------------------------------


@pytest.mark.parametrize("value", [5, "", "   ", None])
def test_sqlite_journal_refuses_a_bad_path(value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        SQLiteFreezeJournal(value)
    assert info.value.argument == "path"


@pytest.mark.parametrize("value", [5, "", "not a dsn", object()])
def test_postgres_journal_refuses_a_bad_target(value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        PostgresFreezeJournal(value)
    assert info.value.argument == "dsn_or_pool"


def test_postgres_journal_refuses_a_bad_schema() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        PostgresFreezeJournal("postgresql://127.0.0.1/x", schema="")
    assert info.value.argument == "schema"


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"policy": {"max_errors": 3}}, "policy"),
        ({"journal": object()}, "journal"),
        ({"clock": "now"}, "clock"),
        ({"on_freeze": 5}, "on_freeze"),
    ],
)
def test_breakers_refuse_bad_arguments(
    journal_path: Path, kwargs: dict[str, Any], argument: str
) -> None:
    args: dict[str, Any] = {"policy": POLICY, "journal": SQLiteFreezeJournal(journal_path)}
    with pytest.raises(InvalidArgumentError) as info:
        Breakers(**(args | kwargs))
    assert info.value.argument == argument


@pytest.mark.parametrize("agent_id", ["", None, 3])
async def test_breakers_refuse_a_bad_agent_id(breakers: Breakers, agent_id: Any) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: breakers.check(agent_id),
        lambda: breakers.is_frozen(agent_id),
        lambda: breakers.status(agent_id),
        lambda: breakers.current_freeze(agent_id),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError) as info:
            call()
        assert info.value.argument == "agent_id"
    awaited: list[Callable[[], Awaitable[Any]]] = [
        lambda: breakers.observe(agent_id, outcome()),
        lambda: breakers.history(agent_id),
        lambda: breakers.freeze(agent_id, reason="r"),
        lambda: breakers.reinstate(agent_id, by="a", reason="r"),
    ]
    for acall in awaited:
        with pytest.raises(InvalidArgumentError) as info:
            await acall()
        assert info.value.argument == "agent_id"


async def test_observe_refuses_what_is_not_an_outcome(breakers: Breakers) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        await breakers.observe("a", {"code": "database_error"})  # type: ignore[arg-type]
    assert info.value.argument == "outcome"


async def test_breakers_refuse_use_before_open_and_after_close(journal_path: Path) -> None:
    b = Breakers(POLICY, journal=SQLiteFreezeJournal(journal_path))
    with pytest.raises(UsageError, match="not open"):
        b.check("a")
    with pytest.raises(UsageError, match="not open"):
        await b.observe("a", outcome())
    await b.open()
    await b.open()  # a no-op
    b.check("a")
    await b.close()
    await b.close()  # idempotent
    with pytest.raises(UsageError, match="not open"):
        b.is_frozen("a")


@pytest.mark.postgres
async def test_a_nul_in_the_evidence_cannot_block_the_postgres_journal(
    postgres_dsn: str, clock: FakeClock
) -> None:
    # PostgreSQL text cannot hold NUL; an agent's request (kept as evidence) and a reason can.
    async with Breakers(POLICY, journal=PostgresFreezeJournal(postgres_dsn), clock=clock) as b:
        for i in range(4):
            await b.observe("x", outcome("parse_error", f"SELECT nope{i} -- \x00"))
        assert b.is_frozen("x")
        manual = await b.freeze("y", reason="loop\x00", by="ops\x00")
        [freeze] = await b.history("x")
        assert isinstance(freeze, Freeze)
        assert [e.request for e in freeze.evidence][-1] == "SELECT nope3 -- \ufffd"
        lifted = await b.reinstate("x", by="alice", reason="checked")
        assert [r.id for r in await b.history("x")] == [freeze.id, lifted.id]
        assert [r.id for r in await b.history("y")] == [manual.id]
    async with Breakers(POLICY, journal=PostgresFreezeJournal(postgres_dsn), clock=clock) as b:
        assert set(b.frozen_agents()) == {"y"}
        assert b.frozen_agents()["y"].reason == "loop\ufffd"
