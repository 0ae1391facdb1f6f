"""The argument checks every public entry point uses: what they accept, and how they say no."""
import math

import pytest

from dpteach import validate
from dpteach.ranks.world import resolve_world


@pytest.mark.parametrize("value", [True, 1.0, "3", None, 0, 17])
def test_an_integer_must_be_a_whole_number_inside_its_bounds_and_not_a_bool(value):
    with pytest.raises(ValueError, match=rf"^steps={value!r} is not allowed: it must be an integer in 1\.\.16"):
        validate.integer("steps", value, 1, 16)


def test_accepted_values_come_back_so_a_check_can_sit_where_the_value_is_used():
    assert validate.integer("steps", 16, 1, 16) == 16 and validate.integer("seed", -3) == -3
    assert validate.number("lr", 1, above=0) == 1.0 and validate.optional(validate.number, "lr", None, above=0) is None
    assert validate.choice("model", "mlp", ("mlp", "cnn")) == "mlp"
    assert validate.choices("links", "nvlink", ("nvlink", "ib")) == ["nvlink"]  # one name is a list of one


@pytest.mark.parametrize("value, bound", [(0, "> 0"), (-1.5, "> 0"), (math.inf, "> 0"), (math.nan, "> 0"),
                                          (False, "> 0"), ("2", "> 0")])
def test_a_number_must_be_finite_and_real(value, bound):
    with pytest.raises(ValueError, match=f"timeout={value!r} is not allowed: it must be a number of seconds {bound}"):
        validate.number("timeout", value, above=0, unit="a number of seconds")


def test_bounds_read_as_a_sentence():
    with pytest.raises(ValueError, match=r"overlap=1\.5 is not allowed: it must be a number in 0\.\.1$"):
        validate.number("overlap", 1.5, low=0, high=1)
    with pytest.raises(ValueError, match=r"repeats=1 is not allowed: it must be an integer >= 2 \(two or more\)$"):
        validate.integer("repeats", 1, low=2, why=" (two or more)")


def test_choices_name_what_was_given_and_every_allowed_value():
    with pytest.raises(ValueError, match=r"^debug_levels=\('LOUD',\) is not allowed: choose from OFF, DETAIL$"):
        validate.choices("debug_levels", ("LOUD",), ("OFF", "DETAIL"))
    with pytest.raises(ValueError, match=r"^strategies=\[\] is not allowed: choose from a, b$"):
        validate.choices("strategies", [], ("a", "b"))
    with pytest.raises(ValueError, match=r"^backend='mpi' is not allowed: choose one of auto, gloo, nccl$"):
        validate.choice("backend", "mpi", ("auto", "gloo", "nccl"))


def test_a_world_too_small_says_why_it_needs_more_ranks():
    world = resolve_world(2, device="cpu")
    with pytest.raises(ValueError, match=r"^world_size=2 is not allowed: async needs a server and two workers, "
                                         r"so world_size >= 3$"):
        validate.ranks(world, 3, "async needs a server and two workers")
    validate.ranks(world, 2, "unused")
