from datetime import UTC, datetime, timedelta

import pytest

from corral.kernel import (
    CancellationError,
    DeadlineExceededError,
    InvalidArgumentError,
    RunMeta,
    Supervision,
)
from corral.runtime import Cancellation, FakeClock


def test_run_id_comes_from_supervision() -> None:
    sup = Supervision.root("a")
    meta = RunMeta(cancellation=Cancellation(), supervision=sup)
    assert meta.run_id == sup.run_id
    assert meta.id == sup.run_id


def test_run_id_conflicting_with_supervision_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="run_id"):
        RunMeta(cancellation=Cancellation(), supervision=Supervision.root("a"), run_id="other")


def test_ids_are_minted_when_absent() -> None:
    a = RunMeta(cancellation=Cancellation())
    b = RunMeta(cancellation=Cancellation())
    assert a.run_id
    assert b.run_id
    assert a.run_id != b.run_id
    assert a.trace_id != b.trace_id


def test_check_raises_when_cancelled_with_the_first_reason() -> None:
    token = Cancellation()
    meta = RunMeta(cancellation=token)
    meta.check()
    token.cancel("user stopped")
    token.cancel("second reason")
    with pytest.raises(CancellationError, match="user stopped") as info:
        meta.check()
    assert info.value.code == "cancelled"


def test_check_raises_at_the_deadline_on_the_clock() -> None:
    clock = FakeClock()
    meta = RunMeta(
        cancellation=Cancellation(clock=clock),
        deadline=clock.now() + timedelta(seconds=10),
        clock=clock,
    )
    clock.advance(9.999)
    meta.check()
    assert meta.remaining_s() == pytest.approx(0.001)
    clock.advance(0.001)
    with pytest.raises(DeadlineExceededError) as info:
        meta.check()
    assert info.value.code == "deadline_exceeded"
    assert info.value.message.startswith("deadline exceeded")


def test_with_deadline_after_keeps_the_sooner_deadline() -> None:
    clock = FakeClock()
    meta = RunMeta(cancellation=Cancellation(clock=clock), clock=clock)
    assert meta.remaining_s() is None
    later = meta.with_deadline_after(30)
    assert later.remaining_s() == 30
    assert later.run_id == meta.run_id
    assert later.trace_id == meta.trace_id
    assert later.with_deadline_after(60) is later
    assert later.with_deadline_after(5).remaining_s() == 5


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"cancellation": object()}, "cancellation"),
        ({"deadline": datetime(2026, 1, 1)}, "deadline"),  # naive
        ({"tenant_id": ""}, "tenant_id"),
        ({"supervision": "sup"}, "supervision"),
        ({"trace_id": ""}, "trace_id"),
        ({"clock": "wall"}, "clock"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], argument: str) -> None:
    kwargs.setdefault("cancellation", Cancellation())
    with pytest.raises(InvalidArgumentError) as info:
        RunMeta(**kwargs)  # type: ignore[arg-type]
    assert info.value.argument == argument


def test_meta_is_frozen() -> None:
    meta = RunMeta(cancellation=Cancellation(), deadline=datetime.now(UTC))
    with pytest.raises(AttributeError):
        meta.tenant_id = "x"  # type: ignore[misc]
