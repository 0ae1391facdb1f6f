"""The course's prediction questions, by lesson: what the learner predicts before a panel runs, what the run
measures, and where the gap between the two comes from (``prediction.py`` shows and scores them).

Each ``measure`` reads the number from the panel's result, so the question always matches the run the
learner set up; each ``explain`` reads the run again to say what the model left out.
"""
from __future__ import annotations

from ..network.link import resolve_link
from .prediction import Prediction
from .rendering import human_bytes


# -- lesson 02: one all-reduce, from alpha and beta ------------------------------------------------------

def _largest_ring_ms(result: dict) -> float | None:
    measured = result.get("measured", {}).get("ring")
    return measured[-1] * 1e3 if measured else None


def _explain_ring(result: dict, predicted: float) -> str:
    fit = resolve_link(result["fit"], "fit")
    model_ms = result["predicted"]["ring"][-1] * 1e3
    return (f"This run's own fit (alpha {fit.alpha_s * 1e6:.0f} us, {fit.bandwidth_GBps:.2g} GB/s) predicts "
            f"<b>{model_ms:.3g} ms</b> for this message: the nearer your number is to it, the nearer your alpha and "
            f"beta were to this run's (lesson 00 fitted them on another day's load). Between the fit and the "
            f"measurement is what one alpha and one beta cannot hold: the ranks share this machine's cores and "
            f"memory, so a large message's copies slow each other down, and the fit is a compromise over every size.")


ALLREDUCE_TIME = Prediction(
    key="02-ring-largest-message", lesson="02", unit="ms",
    question=("How long will <b>one ring all-reduce of the sweep's largest message</b> (32 MiB) take on the panel's "
              "W ranks? Use the alpha and beta lesson 00 fitted for this machine: the ring costs "
              "2(W-1)&middot;alpha + 2(W-1)/W&middot;n&middot;beta."),
    measure=_largest_ring_ms, explain=_explain_ring)


# -- lesson 11: what ZeRO-2 leaves on a rank --------------------------------------------------------------

def _zero2_factor(result: dict) -> float | None:
    row = next((r for r in result.get("rows", []) if r["strategy"] == "zero2"), None)
    return row["state_bytes"] / result["param_bytes"] if row else None


def _explain_zero2(result: dict, predicted: float) -> str:
    row = next(r for r in result["rows"] if r["strategy"] == "zero2")
    rule = row["predicted_state_bytes"] / result["param_bytes"]
    return (f"The ZeRO paper's rule gives <b>{rule:.3g} P</b> for {result['optimizer']} at W={result['world_size']}: the "
            f"parameters whole on every rank (P), the gradients and the optimizer's state cut in W shards. The "
            f"measured {human_bytes(row['state_bytes'])} differs from the rule only by padding: each flat buffer is "
            f"rounded up so that every rank's shard has the same length.")


ZERO2_STATE = Prediction(
    key="11-zero2-state-per-rank", lesson="11", unit="x P",
    question=("How many bytes does <b>one rank hold under ZeRO-2</b> when its optimizer steps (parameters, gradients "
              "and optimizer state), as a multiple of the model's parameter bytes P, with the panel's W and optimizer? "
              "(Adam keeps two moments per parameter; plain SGD none.)"),
    measure=_zero2_factor, explain=_explain_zero2)


# -- lesson 12: what bf16 saves on the wire ----------------------------------------------------------------

def _bf16_saving_percent(result: dict) -> float | None:
    row = next((r for r in result.get("rows", []) if r["grad_comm"] == "bf16"), None)
    return 100 * (1 - row["bytes_vs_fp32"]) if row else None


def _explain_bf16(result: dict, predicted: float) -> str:
    rows = {r["grad_comm"]: r for r in result["rows"]}
    fp32, bf16 = rows["fp32"]["bytes_per_step"], rows["bf16"]["bytes_per_step"]
    return (f"Each gradient element travels in 2 bytes instead of 4, and the ring sends the same 2(W-1)/W of the "
            f"buffer whatever its dtype: {human_bytes(fp32)} per step per rank in fp32, {human_bytes(bf16)} in bf16. "
            f"What it does not save: the optimizer still steps on fp32 gradients, so memory and compute stay, and "
            f"the time saved is the bandwidth part of each message only (the latency part is per message).")


BF16_SAVING = Prediction(
    key="12-bf16-bytes-saved", lesson="12", unit="%",
    question=("What share of the bytes that fp32 gradients put on the wire each step does <b>sending them in "
              "bf16</b> save, in percent?"),
    measure=_bf16_saving_percent, explain=_explain_bf16)


# -- lesson 03: how many buckets -----------------------------------------------------------------------

def _bucket_count(result: dict) -> float | None:
    return len(result.get("buckets", [])) or None


def _explain_buckets(result: dict, predicted: float) -> str:
    largest = max(result["buckets"], key=lambda b: b["bytes"])
    return (f"The {result['model']}'s {result['num_tensors']} gradient tensors hold {human_bytes(result['grad_bytes'])}. "
            f"The rule walks them last layer first and closes a bucket when the next tensor would take it past the "
            f"cap ({human_bytes(result['bucket_mb'] * 2**20)}; the first bucket's own cap "
            f"{human_bytes(result['first_bucket_mb'] * 2**20)}), so a tensor larger than the cap makes a bucket of its "
            f"own - the largest here holds {human_bytes(largest['bytes'])}. Dividing the total by the cap counts too "
            f"few whenever tensors do not fill their buckets exactly.")


BUCKET_COUNT = Prediction(
    key="03-bucket-count", lesson="03", unit="buckets",
    question=("How many <b>buckets</b> will the rule make of the chosen model's gradients with the slider's cap? "
              "(Lesson 01 lists each layer's size.)"),
    measure=_bucket_count, explain=_explain_buckets, obtained="computed")


# -- lesson 04: what overlap hides ---------------------------------------------------------------------

def _rows(result: dict) -> dict:
    return {row["strategy"]: row for row in result.get("strategies", [])}


def _overlap_vs_naive(result: dict) -> float | None:
    rows = _rows(result)
    if not {"naive", "overlap"} <= set(rows) or not rows["naive"]["exposed_comm_s"]:
        return None
    return rows["overlap"]["exposed_comm_s"] / rows["naive"]["exposed_comm_s"]


def _explain_overlap(result: dict, predicted: float) -> str:
    rows = _rows(result)
    naive, overlap = rows["naive"], rows["overlap"]
    return (f"naive sent {naive['messages']:.0f} messages per step, all after backward, and its ranks waited "
            f"{naive['exposed_comm_s'] * 1e3:.3g} ms for them; overlap sent {overlap['messages']:.0f} buckets, the "
            f"first while backward was still computing, and waited {overlap['exposed_comm_s'] * 1e3:.3g} ms - only "
            f"for what was still on the wire when backward ended. Fewer messages save latency (alpha per message); "
            f"starting early hides bandwidth time behind backward, up to as long as backward lasts.")


OVERLAP_EXPOSED = Prediction(
    key="04-overlap-exposed-vs-naive", lesson="04", unit="x naive's",
    question=("What will <b>overlap's exposed communication</b> per step be, as a fraction of <b>naive's</b> (1 = no "
              "better, 0 = all hidden)? Think of the number of messages each sends and of how long backward lasts."),
    measure=_overlap_vs_naive, explain=_explain_overlap)


# -- lesson 05: communication per sample ----------------------------------------------------------------

def _per_sample_at_largest_k(result: dict) -> float | None:
    rows = sorted(result.get("rows", []), key=lambda row: row["accum_steps"])
    if len(rows) < 2 or rows[0]["accum_steps"] != 1 or not rows[0]["exposed_comm_per_sample_s"]:
        return None
    return rows[-1]["exposed_comm_per_sample_s"] / rows[0]["exposed_comm_per_sample_s"]


def _explain_accumulation(result: dict, predicted: float) -> str:
    rows = sorted(result["rows"], key=lambda row: row["accum_steps"])
    one, most = rows[0], rows[-1]
    return (f"With K={most['accum_steps']} a step sends the same bytes as with K=1 but trains on K times the samples: "
            f"bytes per sample fell to {most['bytes_per_sample'] / one['bytes_per_sample']:.3g} of K=1's, exactly "
            f"1/K. The waiting per sample follows only as far as each step's exchange costs the same: it was "
            f"{one['exposed_comm_s'] * 1e3:.3g} ms per step at K=1 and {most['exposed_comm_s'] * 1e3:.3g} ms at "
            f"K={most['accum_steps']} (noise on a shared machine, and a longer backward to hide behind).")


ACCUMULATION_PER_SAMPLE = Prediction(
    key="05-exposed-per-sample-largest-k", lesson="05", unit="x K=1's",
    question=("At the <b>largest K</b> of the sweep, what will the communication the ranks wait for <b>per sample</b> "
              "be, as a fraction of K=1's?"),
    measure=_per_sample_at_largest_k, explain=_explain_accumulation)


# -- lesson 09: efficiency at scale ---------------------------------------------------------------------

def _efficiency_at_largest_w(result: dict) -> float | None:
    curves = dict(zip(result.get("names", []), result.get("curves", {}).values()))
    rows = curves.get("ib_8nics")
    return 100 * rows[-1]["efficiency"] if rows else None


def _explain_efficiency(result: dict, predicted: float) -> str:
    curves = dict(zip(result["names"], result["curves"].values()))
    last = curves["ib_8nics"][-1]
    return (f"At W={last['world_size']} one step computes for {last['compute_s'] * 1e3:.3g} ms and communicates for "
            f"{last['comm_s'] * 1e3:.3g} ms in {last['messages']} messages; {result['overlap']:.0%} of the compute can "
            f"hide it, so {last['exposed_s'] * 1e3:.3g} ms stays exposed. The ring's bandwidth term hardly grows with "
            f"W, but its 2(W-1) latencies per message do: at large W they, not the bytes, set the step.")


SCALING_EFFICIENCY = Prediction(
    key="09-efficiency-largest-w", lesson="09", unit="%",
    question=("With the panel's workload, what <b>efficiency</b> will the model give at the largest W over "
              "<b>InfiniBand with 8 NICs per node</b> (100% = perfect scaling)?"),
    measure=_efficiency_at_largest_w, explain=_explain_efficiency)


# -- lesson 13: how often to checkpoint -------------------------------------------------------------------

def _young_minutes(result: dict) -> float | None:
    return result["young_s"] / 60 if "young_s" in result else None


def _explain_interval(result: dict, predicted: float) -> str:
    return (f"The job fails every {result['job_mtbf_s'] / 60:.0f} minutes on average (one GPU's MTBF divided by "
            f"{result['gpus']:,} GPUs), and sqrt(2 x {result['checkpoint_s']:g} s x {result['job_mtbf_s']:.0f} s) = "
            f"{result['young_s'] / 60:.1f} minutes. The curve is flat near its bottom: an interval off by a factor of "
            f"two costs a few points of time, while one off by ten costs many more; and the interval grows only as the "
            f"square root of the checkpoint's cost.")


CHECKPOINT_INTERVAL = Prediction(
    key="13-young-interval", lesson="13", unit="min",
    question=("With the panel's GPUs, failure rate and checkpoint cost, how many <b>minutes of work between "
              "checkpoints</b> lose the least time, by Young's rule?"),
    measure=_young_minutes, explain=_explain_interval, obtained="computed")
