"""Lesson 14: methods that send less, judged by the time they take to reach a target loss on a given link.

``methods_to_target`` starts one world and does everything in it. Every method trains side by side, step by
step (the order rotated every step), with no emulated link: its loss after each step, the bytes it sent and
the messages (``step_parts.Listener``). Then, in the same world, the parts of a step are measured in
interleaved rounds (``step_parts.py``): each method's compute per step, each message it sent on each link,
and a local step on each link. Last, rank 0 trains the single-process reference that the target is read from.
``time_to_target`` adds the parts up, and only that is arithmetic::

    seconds to the target on a link = steps to target x compute per step
                                      + for each kind of message: how many it sent until then x one on that link

The sum leaves out no overlap, because there is none to leave out here: the gradients travel as one bucket
after backward (``BUCKET_MB``), PowerSGD's three messages go one after another between its products, and local
SGD and DiLoCo average after the optimizer's step.

Why a sum of parts is allowed: a link only delays messages and changes no number in them, so the loss after
step s is the same on every link (``tests/test_sending_less.py`` checks it bit for bit), and a step's compute
does not depend on the link (the lesson checks it: a step that sends nothing times the same with every link in
place). Why not time each method's whole steps on each link instead: that takes a run per link, each lands on
whatever else the machine did then, and noise picked the winner (the same local step took 23 ms on one link and
19 ms on another). Measured once, in rounds, every method and link sees the same moods of the machine.

The interval of a total: each round measured every part once, so each round gives one whole total (its compute
and its messages as that round timed them); a method's time to target is the median of its rounds' totals, with
the order-statistic interval of ``measure.spread``. A method is named fastest on a link only when its interval
lies below every other's (``measure.ranking``). ``dpteach compare --link`` does it the long way, every step on
the link, and reports the same measure (``time_to_target_s``).
"""
from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import asdict, replace
from itertools import accumulate

import torch
import torch.distributed as dist

from .. import validate
from ..measure import FEWEST_ROUNDS, ranking, spread, turned
from ..network.link import resolve_link
from ..ranks import context
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..replica.build import flat_weights
from ..replica.models import build_model
from ..replica.timeline import start_together
from ..sync import strategy_class
from ..sync.demo import pairs_bytes
from ..training.reference import train_single_process
from ..training.target import TARGET_RULE, WINDOW, default_target, smoothed, steps_to_target
from ..training.train import SyncTrainer, TrainConfig
from .compare import check_knob_names, strategy_config
from .powersgd_pairs import on_rank as powersgd_rows
from .step_parts import Listener, measure_parts

METHODS = ("ddp", "bf16", "int8_ef", "powersgd@1", "powersgd@4", "powersgd@16",
           "local_sgd@1", "local_sgd@8", "local_sgd@32", "diloco@1", "diloco@8", "diloco@32")
LINKS = ("1gbe", "10gbe", "wan")
STEPS = 36  # the smallest run in which every averaging method (H up to 32) averages and reaches the target
BUCKET_MB = 25.0  # DDP's default bucket_cap_mb: the MLP's gradients travel as one bucket, as with torch's hooks
POWERSGD_START = 2  # compress from the third step on (torch's powerSGD_hook needs at least 2 plain steps first)


def _links(links, allow_none: bool = False) -> list:
    if allow_none and (links is None or links == () or links == []):
        return []
    if isinstance(links, str) or not links or None in links:
        raise validate.refusal("links", links, "give a list of one or more emulated links (preset names such as "
                               "'1gbe', '10gbe', 'wan', or {'alpha_s', 'beta_s_per_byte'})")
    return [resolve_link(link, "links") for link in links]


def _configs(world, methods, base: TrainConfig, knobs: dict) -> list:
    if isinstance(methods, str) or not methods:
        raise validate.refusal("methods", methods, "give a list of one or more names such as 'ddp', 'powersgd@4'")
    knobs = {"powersgd_start": POWERSGD_START, **check_knob_names(knobs)}
    return [strategy_config(base, spec, knobs).check(world) for spec in methods]


def _on_rank(configs: list, names: list, steps: int, links: list, rounds: int, reference: bool,
             check: tuple | None = None) -> dict:
    """Train every config ``steps`` steps side by side (the order rotated each step), noting each step's
    messages; then measure the parts (``links``: none, no parts); then, on rank 0, the reference; ``check``:
    PowerSGD against torch's hook as well (``powersgd_pairs.on_rank``'s arguments), in this world."""
    trainers = [SyncTrainer(config) for config in configs]
    listeners = [Listener(trainer.strategy.comm) for trainer in trainers]
    start_together(*(trainer.timeline for trainer in trainers))
    messages = [[] for _ in trainers]
    for step in range(steps):
        for i in turned(range(len(trainers)), step):
            mark = len(listeners[i].log)
            trainers[i].step(step)
            messages[i].append(listeners[i].log[mark:])
    losses = torch.tensor([trainer.losses for trainer in trainers], dtype=torch.float64)
    dist.all_reduce(losses)  # each step's loss, the mean over the ranks
    losses /= dist.get_world_size()
    me = context.rank()
    params = [flat_weights(trainer.model) for trainer in trainers] if reference and me == 0 else None
    out = {"losses": losses.tolist(), "wire_bytes": [list(trainer.wire_bytes) for trainer in trainers],
           "messages": messages, "parts": None}
    if links:
        keys = sorted({key for run in messages for step in run for key in step})
        out["parts"] = measure_parts(dict(zip(names, trainers)), keys, links, rounds,
                                     replace(configs[0], strategy="local_sgd", knobs={}), first_step=steps)
    for trainer in trainers:
        trainer.strategy.close()
    if check is not None:
        out["powersgd_check"] = powersgd_rows(*check)
    if params is not None:  # single-process training, on this rank's one core, after every timing is done
        single = train_single_process(replace(configs[0], strategy="ddp", knobs={}, steps=steps), dist.get_world_size())
        out["reference_losses"] = single["losses"]
        out["max_abs_diff"] = [(p - single["params"]).abs().max().item() for p in params]
    return out


def _slowest(per_rank: list, pick) -> list:
    """Round by round, the slowest rank's sample of one part (a step ends when every rank has)."""
    return [max(values) for values in zip(*(pick(ranks["parts"]) for ranks in per_rank))]


def _gather_parts(per_rank: list, links: list, rounds: int) -> dict | None:
    first = per_rank[0]["parts"]
    if first is None:
        return None
    return {"rounds": rounds, "links": [link.as_dict() for link in links],
            "compute": {m: _slowest(per_rank, lambda p, m=m: p["compute"][m]) for m in first["compute"]},
            "exchange": {link: {key: _slowest(per_rank, lambda p, link=link, key=key: p["exchange"][link][key])
                                for key in keys} for link, keys in first["exchange"].items()},
            "local_step": {name: _slowest(per_rank, lambda p, name=name: p["local_step"][name])
                           for name in first["local_step"]},
            "local_link_messages": {name: max(r["parts"]["local_link_messages"][name] for r in per_rank)
                                    for name in first["local_link_messages"]},
            "link_reports": first["link_reports"]}


def methods_to_target(world_size: int | World | None = 2, methods=METHODS, steps: int = STEPS, links=LINKS,
                      rounds: int = FEWEST_ROUNDS, optimizer: str = "sgd", target_loss: float | None = None,
                      seed: int = 0, backend: str = "auto", timeout: float = 600.0, check_powersgd: bool = True,
                      **knobs) -> dict:
    """Every method of ``methods`` (names, or ``name@knob`` variants) trained ``steps`` steps on the MLP, and the
    parts of its step measured in ``rounds`` interleaved rounds on each of ``links`` (``()``: none), in one world.

    Two ranks by default: twelve methods side by side on a laptop's two cores, each rank on a core of its own.

    Returns ``{"world_size", "steps", "optimizer", "target_loss", "target_rule", "window", "reference": smoothed
    single-process curve, "rows": [{"method", "strategy", "knobs", "bytes_per_step", "bytes_vs_ddp",
    "steps_to_target", "final_loss", "diverged_at", "curve", "losses", "messages", "exact",
    "max_abs_diff_vs_single"}], "parts"}``; ``curve`` is the loss averaged over the last ``window`` steps,
    ``messages`` each step's messages (``step_parts.message_key``), ``parts`` the slowest rank's samples, round by
    round (``time_to_target`` adds them up). ``knobs``: the strategies' own options for every method
    (``outer_lr=1.0``, ``outer_momentum=0.0``: each method takes those its strategy declares, ``sync/knobs.py``).
    ``check_powersgd``: in the same world,
    also feed the course's PowerSGD and torch's hook the same gradients (``powersgd_against_torch(known=...)``
    reads it: one start of the ranks fewer).
    """
    validate.integer("steps", steps, low=WINDOW)
    validate.integer("rounds", rounds, low=1)
    validate.optional(validate.number, "target_loss", target_loss, above=0)
    emulated = _links(links, allow_none=True)
    world = resolve_world(world_size, backend, "auto")
    base = TrainConfig(model="mlp", steps=steps, optimizer=optimizer, seed=seed, bucket_mb=BUCKET_MB)
    configs = _configs(world, methods, base, knobs)
    check = (4, 2, 4, seed) if check_powersgd else None  # powersgd_against_torch's defaults: rank, start, steps, seed
    per_rank = launch(_on_rank, world, args=(configs, list(methods), steps, emulated, rounds, True, check),
                      timeout=timeout)
    first = per_rank[0]
    target = target_loss if target_loss is not None else default_target(first["reference_losses"])
    rows = []
    for i, (method, config) in enumerate(zip(methods, configs)):
        steady = strategy_class(config.strategy).steady_from(asdict(config))  # PowerSGD: after its plain steps
        sent = statistics.mean(statistics.mean(r["wire_bytes"][i][steady:] or r["wire_bytes"][i]) for r in per_rank)
        losses = first["losses"][i]
        bad = [s for s, loss in enumerate(losses) if not math.isfinite(loss)]
        rows.append({"method": method, "strategy": config.strategy, "knobs": config.knob_values(),
                     "bytes_per_step": sent,
                     # the most one step sent (the rank mean): a whole model for DiLoCo, a fragment for streaming
                     "largest_step_bytes": statistics.mean(max(r["wire_bytes"][i]) for r in per_rank),
                     "steps_to_target": steps_to_target(losses, target), "losses": losses, "curve": smoothed(losses),
                     "final_loss": smoothed(losses)[-1], "diverged_at": bad[0] + 1 if bad else None,
                     "messages": first["messages"][i], "exact": strategy_class(config.strategy).exact,
                     "max_abs_diff_vs_single": first["max_abs_diff"][i]})
    ddp = next((row["bytes_per_step"] for row in rows if row["strategy"] == "ddp"), None)
    for row in rows:
        row["bytes_vs_ddp"] = None if not ddp else row["bytes_per_step"] / ddp
    return {"world_size": world.size, "steps": steps, "optimizer": optimizer, "seed": seed, "knobs": knobs,
            "bucket_mb": BUCKET_MB, "powersgd_start": POWERSGD_START, "batch_per_rank": base.batch_per_rank,
            "target_loss": target, "target_rule": "given" if target_loss is not None else TARGET_RULE,
            "window": WINDOW, "reference": smoothed(first["reference_losses"]), "rows": rows,
            "parts": _gather_parts(per_rank, emulated, rounds),
            "powersgd_check": None if check is None else {"args": list(check), "world_size": world.size,
                                                          "per_rank": [r["powersgd_check"] for r in per_rank]}}


def _measure(convergence: dict, links: list, rounds: int, backend: str, timeout: float) -> tuple[dict, dict]:
    """The parts for a convergence run that did not measure them (or not on these links): one world that runs
    each method until it has sent a whole period of its messages, then the rounds. Returns the parts and each
    method's messages step by step, the recorded ones continued in their period up to the run's steps."""
    world = resolve_world(convergence["world_size"], backend, "auto")
    base = TrainConfig(model="mlp", optimizer=convergence["optimizer"], seed=convergence["seed"],
                       bucket_mb=convergence["bucket_mb"], batch_per_rank=convergence["batch_per_rank"])
    methods = [row["method"] for row in convergence["rows"]]
    configs = _configs(world, methods, base, {"powersgd_start": convergence["powersgd_start"], **convergence["knobs"]})
    periods = [(c.knob_values().get("sync_every", 1), strategy_class(c.strategy).steady_from(asdict(c)))
               for c in configs]
    record = max(period + steady for period, steady in periods)
    per_rank = launch(_on_rank, world, args=([replace(c, steps=record) for c in configs], methods, record, links,
                                             rounds, False), timeout=timeout)
    messages = {}
    for method, run, (period, steady) in zip(methods, per_rank[0]["messages"], periods):
        messages[method] = [run[s] if s < record else run[steady + (s - steady) % period]
                            for s in range(convergence["steps"])]
    return _gather_parts(per_rank, links, rounds), messages


def _total(messages: list, steps: int, compute: list, exchange: dict) -> list:
    """Round by round: ``steps`` x that round's compute + each message sent in those steps x that round's time."""
    counts = Counter(key for step in messages[:steps] for key in step)
    return [steps * compute[r] + sum(n * exchange[key][r] for key, n in counts.items()) for r in range(len(compute))]


def time_to_target(convergence: dict, links=None, rounds: int = FEWEST_ROUNDS, backend: str = "auto",
                   timeout: float = 600.0) -> dict:
    """Each method of ``convergence`` (what ``methods_to_target`` returned) on each link of ``links`` (default:
    the links it measured): its parts, and their sum up to the step it reached the target. Links it did not
    measure are measured now, in a world of their own.

    Returns ``{"links", "target_loss", "steps", "rounds", "rows": [{"method", "link", "steps_to_target",
    "compute": samples of compute per step, "exchanges": [{"messages", "count", "each_s"}] (one exchange: the messages
    one step sends, the sum of their medians),
    "compute_s", "exchange_s" (medians x counts), "totals": each round's total (None: target not reached),
    "time_to_target_s" (median), "low", "high" (its interval), "seconds": cumulative seconds after each step from
    the parts' medians, "mean_step_s"}], "ranking": {link: {"order", "leaders", "winner", "sentence"}},
    "winner": {link: method, or None when the leaders are within noise}}``.
    """
    parts = convergence.get("parts")
    emulated = _links([link["name"] for link in parts["links"]] if links is None and parts else links or LINKS)
    messages = {row["method"]: row.get("messages") for row in convergence["rows"]}
    if parts is None or any(link.name not in parts["exchange"] for link in emulated) or None in messages.values():
        parts, messages = _measure(convergence, emulated, rounds, backend, timeout)
    rows, result = [], {}
    for link in emulated:
        exchange = parts["exchange"][link.name]
        for row in convergence["rows"]:
            method, reached = row["method"], row["steps_to_target"]
            compute, sent = parts["compute"][method], messages[method]
            until = sent[:reached or convergence["steps"]]
            counts = Counter(key for step in until for key in step)
            each = {key: statistics.median(exchange[key]) for key in exchange}
            per_step = [statistics.median(compute) + sum(each[key] for key in step) for step in sent]
            patterns = Counter(tuple(step) for step in until if step)  # one exchange: what one step sends
            seconds = list(accumulate(per_step))
            totals = None if reached is None else _total(sent, reached, compute, exchange)
            whole = None if totals is None else spread(totals)
            rows.append({"method": method, "link": link.name, "steps_to_target": reached, "compute": compute,
                         "exchanges": [{"messages": list(keys), "count": n, "each_s": sum(each[key] for key in keys)}
                                       for keys, n in patterns.items()],
                         "compute_s": (reached or convergence["steps"]) * statistics.median(compute),
                         "exchange_s": sum(n * each[key] for key, n in counts.items()), "totals": totals,
                         "time_to_target_s": None if whole is None else whole.median,
                         "low": None if whole is None else whole.low, "high": None if whole is None else whole.high,
                         "seconds": seconds, "mean_step_s": seconds[-1] / len(seconds)})
        timed = {r["method"]: spread(r["totals"]) for r in rows if r["link"] == link.name and r["totals"]}
        if timed:
            order = ranking(timed)
            result[link.name] = order.as_dict("s", digits=2, lower="sooner")
        else:
            result[link.name] = {"order": [], "leaders": [], "winner": None,
                                 "sentence": "No method reached the target."}
    return {"links": [link.as_dict() for link in emulated], "target_loss": convergence["target_loss"],
            "steps": convergence["steps"], "rounds": parts["rounds"], "rows": rows, "ranking": result,
            "winner": {name: r["winner"] for name, r in result.items()},
            "exchange": {link.name: parts["exchange"][link.name] for link in emulated},
            "link_reports": {link.name: parts["link_reports"][link.name] for link in emulated},
            "local_step": parts["local_step"], "local_link_messages": parts["local_link_messages"]}


def _reusable(known: dict, names: tuple, steps: int, world_size, optimizer: str, outer_lr: float,
              outer_momentum: float) -> bool:
    """Whether run ``known`` already trained these two methods with these settings (the lesson's main run holds
    local_sgd@8 and diloco@8 at the paper's outer step: the panel's first run need not train them again)."""
    rows = {row["method"]: row for row in known.get("rows", ())}
    size = world_size.size if isinstance(world_size, World) else world_size
    return (all(name in rows for name in names) and known.get("steps") == steps and known.get("seed") == 0
            and known.get("optimizer") == optimizer and known.get("world_size") == size
            and set(known.get("knobs", {})) <= {"outer_lr", "outer_momentum"}
            and rows[names[1]]["knobs"].get("outer_lr") == outer_lr
            and rows[names[1]]["knobs"].get("outer_momentum") == outer_momentum)


def outer_step(sync_every: int = 8, outer_lr: float = 0.7, outer_momentum: float = 0.9, steps: int = STEPS,
               world_size: int | World | None = 2, optimizer: str = "sgd", backend: str = "auto",
               timeout: float = 300.0, known: dict | None = None) -> dict:
    """Local SGD against DiLoCo at the same H, with DiLoCo's outer step as given (outer_lr 1 and momentum 0 is
    local SGD again): what ``methods_to_target`` returns for those two, with no link timed. ``known``: a run
    that may already hold both (``methods_to_target``'s): then nothing trains again."""
    validate.integer("sync_every", sync_every, low=1)
    names = (f"local_sgd@{sync_every}", f"diloco@{sync_every}")
    if known is not None and _reusable(known, names, steps, world_size, optimizer, outer_lr, outer_momentum):
        return {**known, "rows": [row for row in known["rows"] if row["method"] in names], "parts": None,
                "powersgd_check": None, "reused": True}
    return methods_to_target(world_size, methods=names, steps=steps, links=(), optimizer=optimizer, backend=backend,
                             timeout=timeout, check_powersgd=False, outer_lr=outer_lr, outer_momentum=outer_momentum)


# -- lesson 16: DeMo and streaming DiLoCo on the same machinery ----------------------------------------------
FRONTIER_METHODS = ("ddp", "demo", "diloco@8", "streaming_diloco@8")


def frontier_methods(world_size: int | World | None = 2, methods=FRONTIER_METHODS, links=("1gbe", "10gbe", "wan"),
                     **options) -> dict:
    """``methods_to_target`` for the lesson's methods (every row has its ``largest_step_bytes``), with
    DeMo's rows the bytes the paper's accounting predicts for one rank's pairs (``expected_pairs_bytes``)."""
    result = methods_to_target(world_size, methods=methods, links=links, check_powersgd=False, **options)
    for row in result["rows"]:
        if row["strategy"] == "demo":
            shapes = [p.shape for p in build_model("mlp", seed=0, device="cpu").parameters()]
            row["expected_pairs_bytes"] = pairs_bytes(shapes, row["knobs"]["demo_chunk"], row["knobs"]["demo_topk"])
    return result


def frontier_time_to_target(methods: dict, **options) -> dict:
    """Time to the target of each method on each link, from the parts measured in rounds (lesson 14's rule).
    Streaming DiLoCo overlaps each exchange with an inner step; the sum of parts counts it whole, so its time
    here is an upper bound."""
    return time_to_target(methods, **options)
