"""``corral.runtime.middleware`` and ``corral.runtime`` offer the same middleware objects."""

import corral.runtime
import corral.runtime.middleware


def test_every_middleware_name_is_also_a_runtime_name() -> None:
    for name in corral.runtime.middleware.__all__:
        assert name in corral.runtime.__all__
        assert getattr(corral.runtime, name) is getattr(corral.runtime.middleware, name)


def test_the_subpackage_is_reachable_as_an_attribute_of_runtime() -> None:
    assert corral.runtime.middleware.__name__ == "corral.runtime.middleware"
    assert "middleware" not in corral.runtime.__all__
