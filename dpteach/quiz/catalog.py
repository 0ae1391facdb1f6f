"""The fixed vocabulary a quiz item may refer to: course topics, notebooks and experiments.

These names are the contract between the quiz bank and the rest of the course. An item says
either which notebook and which experiment function in :mod:`dpteach.experiments` show its
answer live (``demonstrated_by``), or, where no run on this machine can show it (NCCL's
internals, a cluster's network), which notebook section explains it (``explained_in``); validating against these lists catches a typo in a bank file long before a learner
clicks a link to a notebook that does not exist. ``schema.json`` repeats the lists as enums so
that an editor can check a bank file on its own; a test keeps both copies equal.
"""
from __future__ import annotations

# topic id -> title shown to learners; one bank file ``quizzes/<topic>.yaml`` per topic.
TOPICS = {
    "data_parallelism": "Data parallelism basics",
    "collectives": "Collectives and ring all-reduce",
    "nccl_algorithms": "How NCCL chooses an algorithm",
    "nccl_debugging": "Debugging collectives: NCCL and torch settings",
    "bucketing": "Gradient bucketing",
    "ddp_options": "DDP's options: unused parameters, static graphs, bucket views, hooks, Join",
    "overlap": "Overlapping communication with backward",
    "accumulation": "Gradient accumulation",
    "compression": "Gradient compression",
    "sync_async": "Synchronous vs asynchronous updates",
    "input_pipeline": "Input pipelines",
    "memory": "Memory limits of replication",
    "scaling": "Scaling efficiency",
    "multinode": "Across nodes: NICs and hierarchical collectives",
    "sharding": "Sharded data parallelism: ZeRO stages and FSDP2",
    "mixed_precision": "Mixed precision with data parallelism",
}

NOTEBOOKS = (
    "00_start_here.ipynb",
    "01_data_parallelism.ipynb",
    "02_collectives.ipynb",
    "03_bucketing.ipynb",
    "04_overlap.ipynb",
    "05_accumulation.ipynb",
    "06_compression.ipynb",
    "07_sync_vs_async.ipynb",
    "08_input_pipeline.ipynb",
    "09_scaling.ipynb",
    "10_practice_exam.ipynb",
    "11_sharding.ipynb",
    "12_mixed_precision.ipynb",
)

# Functions of dpteach.experiments; each returns plain data a notebook plots.
EXPERIMENTS = (
    "machine_profile",
    "gradient_equivalence",
    "bitwise_reproducibility",
    "memory_per_replica",
    "measure_model_memory",
    "collective_basics",
    "collective_trace",
    "allreduce_sweep",
    "collective_mismatch",
    "bucket_assignment",
    "bucket_size_sweep",
    "ddp_bucket_assignment",
    "unused_parameters",
    "bucket_view_memory",
    "overlap_timeline",
    "accumulation_sweep",
    "compression_tradeoff",
    "compression_bytes",
    "async_staleness",
    "input_pipeline",
    "sampler_sharding",
    "uneven_inputs",
    "scaling_sweep",
    "scaling_simulation",
    "sharding_memory",
    "sharding_timeline",
    "sharding_payoff",
    "precision_drift",
    "loss_scaling",
    "comm_precision",
)
