"""Every strategy on the same model and data, measured in one run and held to one reference.

``compare_strategies`` starts one world, trains each strategy in turn inside it (same seed, same
batches), and compares the final weights with single-process training on the global batch. A
strategy's *exposed communication* is the time its ranks waited for communication, measured where
they waited (for torch's DDP: from its last gradient to its last bucket's all-reduce); the rest of
its step above ``local`` - the same per-rank work with no communication at all, measured in the same
run - is overhead, by name (``dpteach/training/accounting.py``).

With ``link`` (a preset name of ``dpteach.network.PRESETS``, a ``Link`` or ``{"alpha_s",
"beta_s_per_byte"}``) every synchronous strategy's collectives run on that emulated network; each
row then says how many of its messages this machine was too slow to emulate (``link_report``).
The parameter server's point-to-point messages are not emulated: its row says so.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from .. import validate
from ..measure import spread
from ..network.link import TwoLevelLink
from ..network.two_level import crossing_share
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..replica.sizing import RunLoad
from ..replica.trace import save_trace
from ..sync import STRATEGIES, all_knobs, strategy_class
from ..training.accounting import comm_time, link_report, step_costs
from ..training.reference import exact_tolerance, reference_device, train_single_process
from ..training.target import TARGET_RULE, WINDOW, default_target, steps_to_target, time_to_target
from ..training.train import ALL_REDUCE_CHOICES, TrainConfig, train_each_on_rank, train_on_rank
from ..training.prologue import set_up

DEFAULT_STRATEGIES = ("local", "naive", "bucketed", "overlap", "ddp", "int8", "int8_ef", "fp16", "async")


def _knob_value(text: str):
    """A knob's value as written in a variant name: True/False, a whole number, or a number."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text  # refused by the knob's own check, with what is allowed


def parse_variant(spec: str) -> tuple[str, dict]:
    """``"powersgd@16"`` -> ("powersgd", {"powersgd_rank": 16}): a strategy with its main knob set
    (``Strategy.main_knob``); ``"zeropp(qwz=False,qgz=False)"`` -> ("zeropp", {"qwz": False, "qgz": False}): any
    of its knobs set; a plain name -> (name, {})."""
    if spec.endswith(")") and "(" in spec:
        name, _, inside = spec[:-1].partition("(")
        validate.choice("strategies", name, STRATEGIES)
        settings = {}
        for part in filter(None, (p.strip() for p in inside.split(","))):
            key, equals, value = part.partition("=")
            if not equals:
                raise validate.refusal("strategies", spec, f"write each setting as knob=value, e.g. {name}(knob=1)")
            settings[key.strip()] = _knob_value(value.strip())
        strategy_class(name).settings(settings)  # a name it does not declare, or a value it refuses: say so now
        return name, settings
    name, _, value = spec.partition("@")
    validate.choice("strategies", name, STRATEGIES)
    if not value:
        return name, {}
    knob = strategy_class(name).main_knob
    if knob is None:
        raise validate.refusal("strategies", spec, f"{name!r} has no knob to set with '@'; only "
                               f"{', '.join(n for n, c in STRATEGIES.items() if c.main_knob)} do")
    try:
        return name, {knob: int(value)}
    except ValueError:
        raise validate.refusal("strategies", spec, f"give {name}@N with N a whole number ({knob})") from None


def strategy_config(base: TrainConfig, spec: str, knobs: dict | None = None, **changes) -> TrainConfig:
    """``base`` for the strategy that ``spec`` names (a variant, ``powersgd@16``, sets its main knob). ``knobs``:
    options given to every strategy of a comparison; each strategy takes the ones it declares."""
    name, variant = parse_variant(spec)
    declared = {knob.name for knob in strategy_class(name).knobs}
    own = {key: value for key, value in (knobs or {}).items() if key in declared}
    return replace(base, strategy=name, knobs={**own, **variant}, **changes)


def check_knob_names(knobs: dict | None) -> dict:
    """``knobs`` if every name in it is some strategy's knob (``sync.all_knobs``), else a refusal naming them."""
    if knobs is None:
        return {}
    known = all_knobs()
    if not isinstance(knobs, dict) or any(name not in known for name in knobs):
        raise validate.refusal("knobs", knobs, f"give a dict of strategies' own options: {', '.join(known)}")
    return knobs


def _target_columns(ranks: list[dict], target: float | None) -> dict:
    losses, times = ranks[0]["losses"], ranks[0]["step_times"]  # losses: the mean over the ranks (lockstep)
    if target is None:
        return {"steps_to_target": None, "time_to_target_s": None, "time_to_target_spread_s": None}
    steps = steps_to_target(losses, target)
    worker = next((r for r in ranks if r.get("step_times")), None)  # a parameter server's rank 0 takes no steps
    return {"steps_to_target": steps, "time_to_target_s": time_to_target(losses, times, target),
            "time_to_target_spread_s": (None if steps is None or worker is None
                                        else _cycle_spread(worker).scaled(steps).as_dict())}


def _cycle_spread(rank: dict):
    """The spread of one step's time, sampled over whole cycles of the strategy's messages: the run's measured
    steps (after its warm-up) cut into cycles (``Strategy.cycle``: local SGD's H steps, else one), each cycle's
    mean step time one sample. Times steps to the target, it is the time to the target with its interval."""
    config = rank["config"]
    times = rank["step_times"][config["timing_warmup"]:] or rank["step_times"]
    cycle = strategy_class(config["strategy"]).cycle(config)
    samples = [statistics.mean(times[i:i + cycle]) for i in range(0, len(times) - cycle + 1, cycle)] or [
        statistics.mean(times)]
    return spread(samples)


def _mean_step(ranks: list[dict]) -> float | None:
    """The mean of a worker's step times after the warm-up (a parameter server's rank takes no steps)."""
    worker = next((r for r in ranks if r.get("step_times")), None)
    if worker is None:
        return None
    times = worker["step_times"]
    return statistics.mean(times[worker["config"]["timing_warmup"]:] or times)


def _mean(values):
    values = list(values)
    return None if not values or any(v is None for v in values) else statistics.mean(values)


LEVEL_KEYS = ("sent_between", "sent_inside", "received_between", "received_inside", "expected_between",
              "expected_inside_gloo")


def _level_bytes(ranks: list[dict], bytes_per_step: float, flat_share: float) -> dict:
    """On a two-level link, bytes per step and rank at each level: a strategy's own notes where it keeps them
    (``hsdp``, ``zeropp``: counted, and measured on its sockets), else the ``Comm``'s count split by its ring's
    share of hops that cross nodes (``link.levels``; ``flat_share``, a ring over every rank's, for a strategy
    that sent past the emulated link: ``fsdp``)."""
    if all((r.get("notes") or {}).get("bytes_per_step") for r in ranks):
        per_rank = [r["notes"]["bytes_per_step"] for r in ranks]
        return {key: _mean(p.get(key) for p in per_rank) for key in LEVEL_KEYS}
    shares = [((r.get("link") or {}).get("levels") or {}).get("crossing_share") for r in ranks]
    share = flat_share if all(s is None for s in shares) else _mean(shares)
    between = None if share is None else bytes_per_step * share
    return {"sent_between": between, "sent_inside": None if share is None else bytes_per_step - between,
            "received_between": None, "received_inside": None, "expected_between": None, "expected_inside_gloo": None}


def _quantisation(ranks: list[dict]) -> dict | None:
    """The largest rounding error a quantising strategy noted (``zeropp``), per part, over its ranks."""
    noted = [(r.get("notes") or {}).get("quantisation") for r in ranks]
    noted = [n for n in noted if n]
    if not noted:
        return None
    return {part: {key: max(n[part][key] for n in noted if part in n) for key in ("max_error", "of_bound")}
            for part in sorted({part for n in noted for part in n})}


def _row(name: str, ranks: list[dict], reference: dict, local_step: float | None, target=None) -> dict:
    """One strategy's row; ``name`` may be a variant (``powersgd@16``), its runs say which strategy ran."""
    strategy = ranks[0]["config"]["strategy"]
    sent = [r["wire_bytes_per_step"] for r in ranks if r["wire_bytes_per_step"]]  # async: the server sends none
    steady = strategy_class(strategy).steady_from(ranks[0]["config"])  # PowerSGD: after its plain steps
    steady_sent = [statistics.mean(r["wire_bytes"][steady:] or r["wire_bytes"]) for r in ranks
                   if r.get("wire_bytes") and r["wire_bytes_per_step"]]
    diff = None if reference is None else (ranks[0]["params"] - reference["params"]).abs().max().item()
    return {
        "strategy": name, **step_costs(strategy, ranks, local_step), **_target_columns(ranks, target),
        "bytes_per_step": statistics.mean(steady_sent) if steady_sent else 0.0,
        "bytes_per_step_whole_run": statistics.mean(sent) if sent else 0.0, "bytes_counted_from_step": steady,
        # the most a rank sent in one step: DiLoCo's whole model every H steps, streaming DiLoCo's one fragment
        "largest_step_bytes": max((max(r["wire_bytes"]) for r in ranks if r.get("wire_bytes")), default=0),
        # every step counted, also the rare ones that synchronise (local_sgd's median step never does)
        "mean_step_time_s": _mean_step(ranks),
        "final_loss": ranks[0]["losses"][-1], "max_abs_diff_vs_single": diff,
        "replicas_identical": all(r["replica_spread"] == 0.0 for r in ranks),
        "allocator_peak_bytes_per_rank": max((r.get("allocator_peak_bytes") or 0 for r in ranks), default=0) or None,
        "exact": strategy_class(strategy).exact, "link_report": link_report(ranks),
        "quantisation": _quantisation(ranks),
        "comm_s_per_rank": [comm_time(r["spans"]) for r in ranks],  # the whole run's, as its trace shows it
        # what the worst rank holds when its optimizer steps, and at most at once (sync/sharding.py)
        "state_bytes_per_rank": max(r.get("state_bytes", 0) for r in ranks),
        "peak_bytes_per_rank": max(r.get("peak_bytes", 0) for r in ranks),
    }


def compare_strategies(world_size: int | World | None = None, model: str = "auto", steps: int = 20, accum_steps: int = 1,
                       bucket_mb: float | None = None, strategies=DEFAULT_STRATEGIES, optimizer: str = "sgd",
                       backend: str = "auto", device: str = "auto", timeout: float = 600.0, interleave: bool = False,
                       link=None, all_reduce: str = "builtin", peers: str | None = None, trace=None,
                       target_loss: float | None = None, knobs: dict | None = None, **options) -> dict:
    """Train every strategy for ``steps`` steps on ``world_size`` ranks; return a table and the raw runs.

    ``interleave=True`` runs the synchronous strategies step by step side by side (fair timing
    ratios on a busy machine; the command line does this); the default runs them one after another,
    which keeps each strategy's timeline free of gaps for the Gantt plots.

    ``all_reduce="ring"`` (or ``"tree"``) runs the course's own collectives from ``dpteach/collectives``
    in every strategy that takes them (naive and bucketed: ring or tree; zero1-3: the ring's
    reduce-scatter and all-gather); the others keep torch's, and each row says which ran (``"all_reduce"``).

    ``model="auto"``: the MLP on CPU ranks, a GPU-sized transformer on GPU ranks (``dpteach.replica.sizing``).
    ``peers="emulated"``: one real rank, its exchange timed on ``link`` as among ``world_size`` ranks
    (``dpteach.ranks.world``); the rows then show no exactness (``max_abs_diff_vs_single`` is None), and the
    strategies that cannot stand for W ranks (async, fsdp) are left out.
    ``trace``: a file to write every rank's timeline of every strategy to, in the Trace Event Format that
    Perfetto and ``chrome://tracing`` open (``dpteach/replica/trace.py``).

    A strategy may be named with its main knob set: ``"powersgd@16"`` (rank 16), ``"local_sgd@32"``
    (average every 32 steps); ``knobs`` sets strategies' own options for every strategy that declares them
    (``{"powersgd_start": 3, "outer_lr": 1.0}``: ``sync/knobs.py``). Every row says how many steps, and how many
    seconds of its measured steps, it took to reach ``target_loss`` (default: read from the single-process
    reference, ``training/target.py``).
    """
    validate.integer("steps", steps, low=1)
    validate.integer("accum_steps", accum_steps, low=1)
    if isinstance(strategies, str) or not strategies:
        raise validate.refusal("strategies", strategies, f"give a non-empty list of names from {', '.join(STRATEGIES)}")
    variants = {spec: parse_variant(spec) for spec in strategies}
    knobs = check_knob_names(knobs)
    validate.optional(validate.number, "target_loss", target_loss, above=0)
    cls_of = {spec: strategy_class(name) for spec, (name, _) in variants.items()}
    batch = options.pop("batch_per_rank", None)
    validate.optional(validate.integer, "batch_per_rank", batch, low=1)
    validate.choice("all_reduce", all_reduce, ALL_REDUCE_CHOICES)

    def left_out(world) -> dict:
        # A strategy that needs more ranks than this world has (the parameter server needs a worker
        # besides itself) is left out rather than refused, so that `compare -w 1` still compares.
        real = world.emulated_size is None
        return {s: ("needs a worker besides its server" if cls_of[s].workers(world.size) < 1 else
                    "one rank cannot stand for its world (real ranks only)") for s in variants
                if cls_of[s].workers(world.size) < 1 or not (real or cls_of[s].emulates_peers)}

    def load(world) -> RunLoad:
        runs = len(variants) - len(left_out(world))
        return RunLoad(steps=steps * accum_steps * (runs + (world.size if world.emulated_size is None else 0)),
                       models_at_once=runs if interleave else 1, optimizer=optimizer, cpu_model="mlp")

    setup = set_up(world_size, backend, device, peers, model=model, link=link, load=load, emulated_peers_ok=True)
    world, real, skipped = setup.world, setup.real, left_out(setup.world)
    strategies = [s for s in variants if s not in skipped]
    base = TrainConfig(**setup.fields(batch), steps=steps, accum_steps=accum_steps, bucket_mb=bucket_mb,
                       optimizer=optimizer, **options)
    configs = [strategy_config(base, s, knobs, link=setup.link if cls_of[s].emulates_link else None,
                               all_reduce=all_reduce if all_reduce in cls_of[s].takes_all_reduce else "builtin")
               .check(world)
               for s in strategies]
    per_rank = setup.on_ranks(train_each_on_rank, configs, interleave, timeout=timeout)
    runs = {s: [per_rank[r][i] for r in range(world.size)] for i, s in enumerate(strategies)}
    workers = {s: cls_of[s].workers(world.size) for s in strategies}  # who shares each global batch
    on = setup.reference_device
    references = ({w: train_single_process(base, w, device=on) for w in sorted({world.size, *workers.values()})}
                  if real else {})
    local_step = statistics.mean(r["median_step_s"] for r in runs["local"]) if "local" in runs else None
    target_from = references[world.size]["losses"] if real else next(
        (runs[s][0]["losses"] for s in strategies if cls_of[s].exact and cls_of[s].communicates), None)
    target = target_loss if target_loss is not None else (None if target_from is None else default_target(target_from))
    rows = [{**_row(s, runs[s], references.get(workers[s]), local_step, target), "all_reduce": c.all_reduce,
             "knobs": c.knob_values()} for s, c in zip(strategies, configs)]
    link = setup.link
    if isinstance(link, TwoLevelLink):  # bytes per step and rank on each level: counted, and measured where known
        flat = crossing_share(range(world.size), link.ranks_per_node)
        for row in rows:
            levels = _level_bytes(runs[row["strategy"]], row["bytes_per_step"], flat)
            row.update({"bytes_between_per_step": levels["sent_between"], "bytes_inside_per_step": levels["sent_inside"],
                        "received_between_per_step": levels["received_between"],
                        "received_inside_per_step": levels["received_inside"], "levels": levels})
    written = save_trace(trace, runs, world.device_type, about={**setup.facts, "steps": steps,
                                                                "link": None if link is None else link.as_dict()})
    return {**setup.facts, "steps": steps, "accum_steps": accum_steps, "bucket_mb": base.bucket_mb,
            "batch_per_rank": base.batch_per_rank, "optimizer": optimizer,
            "link": None if link is None else link.as_dict(), "all_reduce": all_reduce,
            "tolerance": exact_tolerance(base), "rows": rows, "runs": runs, "left_out": skipped,
            "reference_losses": references[world.size]["losses"] if real else None, "trace": written,
            "target_loss": target, "target_rule": ("given" if target_loss is not None else TARGET_RULE if real else
                                                   TARGET_RULE.replace("reference", "first exact strategy")),
            "target_window": WINDOW}


def run_strategy(world_size: int | World | None, config: TrainConfig, backend: str = "auto", device: str = "auto",
                 timeout: float = 300.0, peers: str | None = None) -> dict:
    """Train one strategy; return its per-rank results and the single-process reference (None with
    emulated peers: one real rank shows no exactness). With emulated peers the config is timed for their
    world (``timed_world_size`` is filled in)."""
    world = resolve_world(world_size, backend, device, peers, emulated_peers_ok=True)
    config = replace(config, timed_world_size=world.emulated_size).check(world)
    ranks = launch(train_on_rank, world, args=(config,), timeout=timeout)
    if world.emulated_size is not None:
        return {"ranks": ranks, "reference": None}
    workers = strategy_class(config.strategy).workers(world.size)
    return {"ranks": ranks, "reference": train_single_process(config, workers, device=reference_device(world.placement))}
