"""``cancellation.params``: values are coerced strictly, and ``register`` leaves the class it is given unchanged."""

from __future__ import annotations

import pytest

from cancellation.objectives import OBJECTIVES, PARAMS, params_class, register
from cancellation.params import GrpoParams, ObjectiveParams, strict_bool


@pytest.mark.parametrize("value", ["false", "False", "true", 0, 1, None, 0.0])
def test_a_bool_parameter_takes_only_a_real_bool(value):
    """``bool("false")`` is True: a string, a number or None for stop_grad / length_norm is refused, naming the
    objective, the field and the value."""
    for name, field in (("dfpo", "stop_grad"), ("gspo", "length_norm")):
        with pytest.raises(ValueError) as err:
            params_class(name)(**{field: value})
        assert str(err.value) == f"objective {name!r} parameter `{field}`={value!r}: expected true or false"
    for value_ok in (True, False):
        assert params_class("dfpo")(stop_grad=value_ok).stop_grad is value_ok


def test_strict_bool_is_the_one_bool_coercer():
    assert strict_bool(True) is True and strict_bool(False) is False
    for value in ("true", 1, None):
        with pytest.raises(TypeError, match="expected true or false"):
            strict_bool(value)


@pytest.mark.parametrize("value", [None, 3])
def test_a_name_parameter_is_not_turned_into_a_string(value):
    """``transform=None`` used to become the string 'None' before the check; the message shows the value given."""
    with pytest.raises(ValueError) as err:
        params_class("dfpo")(transform=value)
    message = str(err.value)
    assert message.startswith(f"objective 'dfpo' parameter `transform`={value!r}: expected a string; valid: ")
    assert "min_replace" in message and "'None'" not in message


@pytest.fixture
def scratch_objectives():
    """Objective names registered inside the test, removed from the registry afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        OBJECTIVES.pop(name, None)
        PARAMS.pop(name, None)


def _plain_loss(logp, old_logp, advantages, mask, group, *, aggregation="token-mean", **params):
    raise AssertionError("not called")  # pragma: no cover


def test_register_leaves_the_class_it_is_given_unchanged(scratch_objectives):
    """Registering GrpoParams for a second objective used to rename the first's messages (``register`` set
    ``objective`` on the shared class); each registration now names its own objective."""
    before = GrpoParams.objective
    scratch_objectives += ["scratch_a", "scratch_b"]
    register("scratch_a", params=GrpoParams)(_plain_loss)
    register("scratch_b", params=GrpoParams)(_plain_loss)
    assert GrpoParams.objective == before == ObjectiveParams.objective
    for name in ("grpo", "scratch_a", "scratch_b"):
        cls = params_class(name)
        assert issubclass(cls, GrpoParams) and cls.objective == name
        with pytest.raises(ValueError) as err:
            cls(epsilon_low=1.5)
        assert str(err.value) == f"objective {name!r} parameter `epsilon_low`=1.5: must be in [0, 1)"
    # the same defaults and values: the registered class is GrpoParams with a name
    assert params_class("scratch_a")(epsilon_high=0.3).epsilon_high == 0.3
