"""The course in one table: its lessons, what each one runs, and which exercises go with it.

Everything else that lists lessons or experiments reads this table instead of writing the names again:
``dpteach.experiments`` exports the functions named here (and imports each module on first use), the
quiz bank checks that an item names a lesson and an experiment that exist, ``scripts/course_pages.py``
writes the README's course table and module map and lesson 00's map from it, and the tests hold the
notebooks to it. So adding a lesson is a notebook, its experiments module, its widget module and its row
here (then ``python scripts/course_pages.py``); adding an experiment is the function and its name in its
lesson's row.

Quiz topics are not listed here: each is one file, ``quizzes/<topic>.yaml``, which carries its own
title (``dpteach.quiz.catalog``). Exercises are found from their check modules
(``dpteach.grading.spec``); a lesson names the ones it sends the learner to.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lesson:
    number: str          # "04": the notebook's prefix and how the course refers to it
    slug: str            # "overlap": the notebook is f"{number}_{slug}.ipynb"
    title: str           # the short name lesson 00's map links
    question: str        # what the lesson answers by running it (the README's course table)
    experiments: tuple = ()  # "module.function" of dpteach.experiments that its cells and panels run
    exercises: tuple = ()    # ids of the exercises the lesson asks the learner to do

    @property
    def notebook(self) -> str:
        return f"{self.number}_{self.slug}.ipynb"


LESSONS = (
    Lesson("00", "start_here", "Start here",
           "What does this machine offer? Its all-reduce latency and bandwidth, measured and fitted",
           ("machine.machine_profile",)),
    Lesson("01", "data_parallelism", "Data parallelism",
           "Why is averaging the replicas' gradients exact, when is it exact bit for bit, and what must each "
           "replica hold in memory?",
           ("equivalence.gradient_equivalence", "determinism.bitwise_reproducibility",
            "memory.measure_model_memory", "memory.memory_per_replica")),
    Lesson("02", "collectives", "Collectives",
           "How does a ring all-reduce move data, step by step, when does a tree beat it, what do NCCL and gloo "
           "really run, and what happens when ranks disagree?",
           ("collectives.collective_basics", "collectives.collective_trace", "collectives.allreduce_sweep",
            "debugging.collective_mismatch"),
           ("01", "02")),
    Lesson("03", "bucketing", "Bucketing",
           "Why do many small all-reduces cost more than a few large ones, which buckets does DDP really build, "
           "and what do its options cost?",
           ("bucketing.bucket_assignment", "bucketing.bucket_size_sweep", "ddp_buckets.ddp_bucket_assignment",
            "ddp_options.unused_parameters", "ddp_options.bucket_view_memory"),
           ("03",)),
    Lesson("04", "overlap", "Overlap",
           "GPUs idle while gradients are exchanged, and the model must stay exact: what fixes it?",
           ("overlap.overlap_timeline",), ("04",)),
    Lesson("05", "accumulation", "Accumulation",
           "What does gradient accumulation save (fewer exchanges, each as long), and what else does it change?",
           ("accumulation.accumulation_sweep",), ("05",)),
    Lesson("06", "compression", "Compression",
           "What do 8-bit and 16-bit gradients save, and what do they cost in exactness?",
           ("compression.compression_tradeoff", "compression.compression_bytes",
            "compression.compression_on_links"),
           ("06",)),
    Lesson("07", "sync_vs_async", "Synchronous vs asynchronous",
           "What do asynchronous updates buy, and what staleness do they bring?",
           ("asynchronous.async_staleness",), ("07",)),
    Lesson("08", "input_pipeline", "Input pipeline",
           "How does a slow loader starve the ranks, what feeds them, and what breaks when ranks get the wrong "
           "data?",
           ("input_pipeline.input_pipeline", "data_sharding.sampler_sharding", "data_sharding.uneven_inputs")),
    Lesson("09", "scaling", "Scaling",
           "How far does data parallelism scale, here and on thousands of GPUs, and what do the nodes' NICs "
           "change?",
           ("scaling.scaling_sweep", "scaling.scaling_simulation", "batch_size.time_to_target_scaling")),
    Lesson("10", "practice_exam", "Practice exam",
           "The exam-style questions, each linked to the experiment that proves its answer"),
    Lesson("11", "sharding", "Sharded data parallelism",
           "Beyond replication: what do ZeRO's three stages and FSDP2 save per rank, what do they send, and "
           "when does each pay off?",
           ("sharding.sharding_memory", "sharding.sharding_timeline", "sharding.sharding_payoff"),
           ("08", "09")),
    Lesson("12", "mixed_precision", "Mixed precision",
           "What do bf16 and fp16 change in training on W ranks - what stays fp32, why fp16 needs a loss scale "
           "and every rank must skip the same steps, what 16-bit gradients on the wire save and cost?",
           ("mixed_precision.precision_drift", "mixed_precision.loss_scaling", "mixed_precision.comm_precision")),
    Lesson("13", "failures", "When ranks fail",
           "What do the other ranks see when one crashes or hangs, how does a job restart and resume without "
           "losing a step, and how often should it checkpoint?",
           ("failures.fault_detection", "failures.restart_run", "torchft_groups.replica_groups", "checkpoints.resume_equivalence",
            "checkpoints.checkpoint_cost", "checkpoints.checkpoint_interval"),
           ("10",)),
    Lesson("14", "sending_less", "Sending less",
           "When the network is the bottleneck, which sends less and still arrives first - low-rank gradients "
           "(PowerSGD), fewer synchronisations (local SGD, DiLoCo), or sharding only inside a node (HSDP)?",
           ("sending_less.methods_to_target", "sending_less.time_to_target", "sending_less.outer_step",
            "powersgd.powersgd_against_torch", "hybrid.hybrid_sharding")),
    Lesson("15", "batch_size", "How big a batch",
           "What limits the batch a rank can hold (activations, and checkpointing's trade), how must the learning "
           "rate follow the global batch, and past which batch do more ranks stop saving steps?",
           ("activations.activation_memory", "activations.checkpointing", "batch_size.lr_rules",
            "batch_size.critical_batch")),
    Lesson("16", "frontier", "The frontier of sending less",
           "What did large trainings adopt after PowerSGD and DiLoCo - ZeRO++'s quantised and node-local gathers, "
           "DeMo's decoupled momentum, streaming DiLoCo's fragments, Muon's whole matrices - and what does each "
           "send, and where?",
           ("frontier.zeropp_levels", "sending_less.frontier_methods", "sending_less.frontier_time_to_target",
            "frontier.muon_against_torch"),
           ("11",)),
    Lesson("17", "your_own_job", "Diagnosing your own job",
           "Your own training script is slow: which rank, which step, which lesson? Profile every rank of it "
           "unedited, and have the course read the traces",
           ("diagnosis.planted_job",)),
)

# Experiments that no lesson's notebook calls but the command line does (`dpteach compare`).
TOOLS = ("compare.compare_strategies", "compare.run_strategy")


def notebooks() -> tuple:
    """The lessons' notebook file names, in course order."""
    return tuple(lesson.notebook for lesson in LESSONS)


def experiment_homes() -> dict:
    """``{function name: module of dpteach.experiments}`` for every experiment, lessons' first, then tools."""
    homes = {}
    for qualified in [name for lesson in LESSONS for name in lesson.experiments] + list(TOOLS):
        module, function = qualified.split(".")
        homes[function] = module
    return homes


def experiments() -> tuple:
    """Every experiment function's name that a lesson runs, in course order (the quiz may cite these)."""
    return tuple(qualified.split(".")[1] for lesson in LESSONS for qualified in lesson.experiments)


def lesson(key: str) -> Lesson:
    """A lesson by number ("4", "04"), slug or notebook file name."""
    text = str(key).strip().removesuffix(".ipynb")
    for candidate in LESSONS:
        if text in (candidate.number, candidate.slug, f"{candidate.number}_{candidate.slug}") or (
                text.isdigit() and int(text) == int(candidate.number)):
            return candidate
    raise ValueError(f"lesson={key!r} is not a lesson of this course; choose one of: "
                     f"{', '.join(lesson.number + ' (' + lesson.slug + ')' for lesson in LESSONS)}")
