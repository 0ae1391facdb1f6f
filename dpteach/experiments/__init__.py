"""One function per lesson: each runs real ranks and returns plain data (dicts and lists).

Notebooks, widgets, the command line and the tests all call these, so a number printed in a
notebook and a number asserted in a test come from the same code.
"""
from .compare import compare_strategies, run_strategy
from .machine import machine_profile
from .equivalence import gradient_equivalence
from .determinism import bitwise_reproducibility
from .memory import measure_model_memory, memory_per_replica
from .collectives import allreduce_sweep, collective_basics, collective_trace
from .debugging import collective_mismatch
from .bucketing import bucket_assignment, bucket_size_sweep
from .ddp_buckets import ddp_bucket_assignment
from .ddp_options import bucket_view_memory, unused_parameters
from .scaling import scaling_simulation, scaling_sweep
from .overlap import overlap_timeline
from .accumulation import accumulation_sweep
from .compression import compression_bytes, compression_on_links, compression_tradeoff
from .asynchronous import async_staleness
from .input_pipeline import input_pipeline
from .data_sharding import sampler_sharding, uneven_inputs
from .sharding import sharding_memory, sharding_payoff, sharding_timeline
from .mixed_precision import comm_precision, loss_scaling, precision_drift

__all__ = ["compare_strategies", "run_strategy",
           "machine_profile", "gradient_equivalence", "bitwise_reproducibility",
           "memory_per_replica", "measure_model_memory",
           "collective_basics", "collective_trace", "allreduce_sweep", "collective_mismatch",
           "bucket_assignment", "bucket_size_sweep", "ddp_bucket_assignment", "unused_parameters", "bucket_view_memory",
           "scaling_sweep", "scaling_simulation",
           "overlap_timeline", "accumulation_sweep", "compression_tradeoff", "compression_bytes", "compression_on_links", "async_staleness",
           "input_pipeline", "sampler_sharding", "uneven_inputs",
           "sharding_memory", "sharding_timeline", "sharding_payoff",
           "precision_drift", "loss_scaling", "comm_precision"]
