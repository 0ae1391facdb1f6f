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
