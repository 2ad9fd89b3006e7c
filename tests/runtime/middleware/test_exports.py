"""``corral.runtime.middleware`` and ``corral.runtime`` offer the same middleware objects."""

from corral import runtime
from corral.runtime import middleware


def test_every_middleware_name_is_also_a_runtime_name() -> None:
    for name in middleware.__all__:
        assert name in runtime.__all__
        assert getattr(runtime, name) is getattr(middleware, name)


def test_the_subpackage_is_an_attribute_of_runtime_but_not_one_of_its_names() -> None:
    assert runtime.middleware is middleware
    assert middleware.__name__ == "corral.runtime.middleware"
    assert "middleware" not in runtime.__all__
