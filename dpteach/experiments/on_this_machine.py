"""What each lesson will show on this machine: the table ``dpteach doctor`` prints under the GPUs.

A course that runs on a laptop, on Kaggle's two T4s, on Colab's one T4 and on an eight-GPU node cannot say the
same thing everywhere. The facts come from ``dpteach/ranks/gpus.py`` (capability, native bf16, peer access,
NCCL's settings) and the placement rule of ``dpteach/ranks/backend.py``; this module only turns them into one
line per lesson, so a learner (or an instructor choosing a machine for a class) knows before running anything
which lessons measure the GPUs themselves, which measure messages on gloo, and which 16-bit format lesson 12
will time.
"""
from __future__ import annotations

from ..course import LESSONS
from ..ranks.backend import choose_placement, cores_available
from ..ranks.gpus import GpuMachine, read_machine
from ..ranks.world import default_world_size
from ..units import human_bytes

LINK_LESSONS = ("00", "02", "03", "04", "09", "14")  # lessons whose panels time the link between the ranks


def where_ranks_run(machine: GpuMachine, world_size: int, placement) -> str:
    """``2 ranks: NCCL, one GPU each`` - the placement rule's answer, in words."""
    if placement.backend == "nccl":
        return f"{world_size} ranks: NCCL, one GPU each"
    if placement.device_type == "cuda":
        shared = "the one GPU" if machine.count == 1 else f"{machine.count} GPUs"
        return f"{world_size} ranks: gloo, sharing {shared} (NCCL needs a GPU per rank)"
    return f"{world_size} ranks: gloo on {cores_available()} CPU core(s)"


def _link_note(machine: GpuMachine, placement) -> str:
    if placement.backend == "nccl":
        return f"NCCL between the GPUs over {machine.link_phrase()}"
    if placement.device_type == "cuda":  # gloo ranks sharing the GPU(s)
        return ("real ranks show the messages, not NCCL's speed; '1 rank + emulated peers' times W GPUs' exchange "
                "on an emulated link")
    return "the messages, their order and their bytes are as on GPUs; the times are this CPU's"


def lesson_notes(machine: GpuMachine | None = None, world_size: int | None = None) -> list[dict]:
    """One row per lesson: ``{"lesson", "title", "note"}``, what it shows here (the default world of the notebooks)."""
    machine = read_machine() if machine is None else machine
    world_size = default_world_size() if world_size is None else world_size
    placement = choose_placement(world_size)
    ranks = where_ranks_run(machine, world_size, placement)
    rows = []
    for lesson in LESSONS:
        if lesson.number == "12":
            note = f"{ranks}; {machine.sixteen_bit()['sentence']}"
        elif lesson.number in LINK_LESSONS:
            note = f"{ranks}; {_link_note(machine, placement)}"
        elif lesson.number in ("11", "15") and machine.count:
            note = (f"{ranks}; models sized for {human_bytes(min(g.memory_bytes for g in machine.gpus))} of GPU "
                    f"memory, and the allocator's own figures beside the counted ones")
        elif lesson.number == "10":
            note = "questions only: nothing runs on ranks"
        else:
            note = ranks
        rows.append({"lesson": lesson.number, "title": lesson.title, "note": note})
    return rows


def gpu_rows(machine: GpuMachine) -> list[dict]:
    """The GPU table: one row per GPU, with its peers."""
    rows = []
    for gpu in machine.gpus:
        peers = [str(j) for j in range(machine.count) if machine.peer[gpu.index][j]]
        rows.append({"gpu": gpu.index, "name": gpu.short_name, "capability": f"{gpu.capability[0]}.{gpu.capability[1]}",
                     "memory": human_bytes(gpu.memory_bytes), "bf16": "native" if gpu.native_bf16 else "emulated",
                     "fp16_tensor_cores": gpu.fp16_tensor_cores, "peer_access_to": ", ".join(peers) or "none"})
    return rows


def machine_facts(machine: GpuMachine | None = None) -> dict:
    """Everything above as plain data (``dpteach doctor --json``'s ``"gpus_here"``)."""
    machine = read_machine() if machine is None else machine
    return {"gpus": gpu_rows(machine), "link": machine.link_sentence(), "nccl": machine.nccl_version,
            "nccl_settings": [str(s) for s in machine.nccl_settings()], "sixteen_bit": machine.sixteen_bit(),
            "lessons": lesson_notes(machine)}


def print_facts(facts: dict) -> None:
    """The doctor's table, for a terminal."""
    if facts["gpus"]:
        print(f"{'GPU':>3}  {'name':<24} {'capability':>10} {'memory':>10}  {'bf16':<9} {'fp16 TC':<7}  peer access to")
        for row in facts["gpus"]:
            print(f"{row['gpu']:>3}  {row['name']:<24} {row['capability']:>10} {row['memory']:>10}  {row['bf16']:<9} "
                  f"{'yes' if row['fp16_tensor_cores'] else 'no':<7}  {row['peer_access_to']}")
        print(f"between GPUs: {facts['link']}")
        settings = ", ".join(facts["nccl_settings"]) or "nothing"
        print(f"NCCL {facts['nccl'] or 'not found'}; set by the course: {settings}")
    print("what each lesson shows on this machine:")
    for row in facts["lessons"]:
        print(f"  {row['lesson']} {row['title']:<28} {row['note']}")
