"""A strategy owns its options: declared in its own file, checked before any rank starts, turned into
``dpteach compare`` flags, and read back with its colour, label and overhead spans - no other file edited.

The toy strategy below is written to a temporary module, as a learner or contributor would add one; the only
other change is its line in the registry (``STRATEGIES``)."""
from __future__ import annotations

import argparse
import importlib
import math
import sys
import textwrap

import cloudpickle
import pytest

import dpteach
from dpteach import sync
from dpteach.commands import compare as compare_command
from dpteach.experiments.compare import parse_variant, strategy_config
from dpteach.sync import STRATEGIES, all_knobs
from dpteach.replica.models import build_model
from dpteach.sync.knobs import Knob
from dpteach.training.accounting import step_costs
from dpteach.training.reference import exact_tolerance, train_single_process
from dpteach.training.train import TrainConfig, train_each_on_rank
from dpteach.widgets import sending_less as sending_less_view

TOY = '''
"""``chunked``: after backward, one all-reduce per chunk of N parameters (a toy: N is its one knob)."""
import torch

from dpteach.sync.base import GradientSync
from dpteach.replica.models import build_model
from dpteach.sync.knobs import Knob


class ChunkedSync(GradientSync):
    name = "chunked"
    label = "chunked (N parameters a message)"
    colour = "#123456"
    knobs = (Knob("chunk_params", 2, "parameters per all-reduce", low=1),)
    main_knob = "chunk_params"

    def __init__(self, model, timeline, chunk_params, bucket_mb=None, first_bucket_mb=None, **options):
        super().__init__(model, timeline, **options)
        self.chunk_params = chunk_params
        self.messages = 0

    def finish(self, step):
        for at in range(0, len(self.params), self.chunk_params):
            chunk = self.params[at:at + self.chunk_params]
            with self.overhead(step, "flatten"):
                flat = torch.cat([p.grad.reshape(-1) for p in chunk])
            self.all_reduce_mean(flat)
            self.messages += 1
            with self.overhead(step, "scatter back"):
                offset = 0
                for p in chunk:
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
        self.notes = {"messages": self.messages}
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy strategy's file, imported, and its one line in the registry."""
    (tmp_path / "toy_chunked_strategy.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(tmp_path)
    module = importlib.import_module("toy_chunked_strategy")
    cloudpickle.register_pickle_by_value(module)  # the ranks never saw the file: the class travels by value
    monkeypatch.setitem(STRATEGIES, "chunked", module.ChunkedSync)  # the registry line
    yield module.ChunkedSync
    cloudpickle.unregister_pickle_by_value(module)
    del sys.modules["toy_chunked_strategy"]


def test_a_new_strategy_with_one_knob_gets_its_flag_check_colour_and_overhead_from_its_own_file(toy):
    # the compare command's flag, made from the declaration
    parser = argparse.ArgumentParser()
    compare_command.add_arguments(parser)
    assert "--chunk-params" in parser.format_help() and "parameters per all-reduce" in parser.format_help()
    assert compare_command.given_knobs(parser.parse_args(["--chunk-params", "3"])) == {"chunk_params": 3}
    assert compare_command.given_knobs(parser.parse_args([])) == {}  # left out: the strategies' defaults
    assert all_knobs()["chunk_params"][1] == ["chunked"]
    # a variant sets its main knob; bad values are refused naming the strategy, the knob, the value, what is allowed
    assert parse_variant("chunked@5") == ("chunked", {"chunk_params": 5})
    with pytest.raises(ValueError,
                       match=r"strategy='chunked': chunk_params=0 is not allowed: it must be an integer >= 1"):
        TrainConfig(strategy="chunked", knobs={"chunk_params": 0}).check(2)
    with pytest.raises(ValueError, match=r"knobs=\{'sync_every': 3\} is not allowed with strategy='chunked': it takes "
                                         r"chunk_params"):
        TrainConfig(strategy="chunked", knobs={"sync_every": 3}).check(2)
    # trained on real ranks: the knob reaches the class, the overhead spans are named by the class alone
    base = TrainConfig(model="mlp", steps=3, batch_per_rank=8)
    configs = [strategy_config(base, "local").check(2), strategy_config(base, "chunked@3").check(2)]

    def registered_and_trained(configs):  # on a rank, whose interpreter never imported the toy: its registry line
        sync.STRATEGIES.setdefault(toy.name, toy)  # (the module travels by name, a dict would be copied)
        return train_each_on_rank(configs)
    per_rank = dpteach.launch(registered_and_trained, 2, args=(configs,), timeout=120)
    local, chunked = ([ranks[i] for ranks in per_rank] for i in range(2))
    tensors = len(list(build_model("mlp").parameters()))
    assert chunked[0]["config"]["knobs"] == {"chunk_params": 3}
    assert chunked[0]["notes"]["messages"] == 3 * math.ceil(tensors / 3)  # 3 steps, a message per 3 tensors
    floor = sum(r["median_step_s"] for r in local) / len(local)
    parts = step_costs("chunked", chunked, floor)["overhead_parts"]
    assert set(parts) <= {"flatten", "scatter back", "other"} and "flatten" in chunked[0]["median_overhead_s"]
    # exact, as its class says: within the tolerance of one process trained on the global batch
    reference = train_single_process(configs[1], 2)
    assert (chunked[0]["params"] - reference["params"]).abs().max().item() <= exact_tolerance(configs[1])
    # how lessons draw and name it: from the class
    assert sending_less_view._style("chunked@3")["color"] == "#123456"
    assert sync.strategy_class("chunked").title() == "chunked (N parameters a message)"


def test_every_knob_declared_once_per_name_and_made_into_a_flag():
    """Strategies that share a knob share its declaration (one flag sets both); every flag is distinct."""
    for name, (knob, owners) in all_knobs().items():
        for owner in owners:
            same = next(k for k in STRATEGIES[owner].knobs if k.name == name)
            assert (same.kind, same.default, same.help) == (knob.kind, knob.default, knob.help), (name, owner)
        assert STRATEGIES[owners[0]].settings()[name] == knob.default  # a default is itself allowed
    parser = argparse.ArgumentParser()
    compare_command.add_arguments(parser)  # argparse refuses two flags of one name
    for name, value in (("powersgd_rank", "16"), ("sync_every", "32"), ("outer_lr", "1.0")):
        args = parser.parse_args([all_knobs()[name][0].flag, value])
        assert compare_command.given_knobs(args) == {name: all_knobs()[name][0].kind(value)}
    assert compare_command.given_knobs(parser.parse_args(["--no-powersgd-error-feedback"])) == {
        "powersgd_error_feedback": False}


def test_a_comparison_gives_each_strategy_only_the_knobs_it_declares():
    base = TrainConfig(model="mlp", steps=2)
    knobs = {"sync_every": 4, "powersgd_rank": 2}
    assert strategy_config(base, "ddp", knobs).knobs == {}
    assert strategy_config(base, "local_sgd", knobs).knobs == {"sync_every": 4}
    assert strategy_config(base, "diloco@16", knobs).knob_values() == {"sync_every": 16, "outer_lr": 0.7,
                                                                        "outer_momentum": 0.9}
    assert strategy_config(base, "powersgd", knobs).knob_values()["powersgd_rank"] == 2


def test_a_bad_knob_value_or_type_is_refused_with_the_strategy_and_what_is_allowed():
    knob = Knob("gap", 1.0, "a gap", kind=float, above=0, why="a zero gap divides by zero")
    assert knob.check("toy", 2) == 2.0 and knob.flag == "--gap"
    with pytest.raises(ValueError, match=r"strategy='toy': gap=0 is not allowed: it must be a number > 0 \(a zero gap"):
        knob.check("toy", 0)
    with pytest.raises(ValueError, match="knobs=.*give a dict"):
        TrainConfig(strategy="ddp", knobs=[("sync_every", 3)]).check(2)
    with pytest.raises(ValueError, match="max_staleness=-1 .* >= 0, or None"):
        TrainConfig(strategy="async", knobs={"max_staleness": -1}).check(2)


def test_the_sync_face_names_every_registered_strategy():
    face = sync.__doc__
    missing = [name for name in STRATEGIES if f"``{name}``" not in face.split("Its modules")[0]]
    assert not missing, f"sync/__init__.py's table does not name {missing}"
