"""What this machine's GPUs can do, read once: the facts every GPU-dependent choice of the course starts from.

The GPUs learners get differ in exactly the ways a data-parallel course cares about:

* **16-bit arithmetic.** Tensor cores multiply fp16 matrices from compute capability 7.0 (Volta: V100, T4 is
  7.5); bf16 is native from 8.0 (Ampere: A100, L4, 3090, H100). Below 8.0 torch still *runs* bf16 -
  ``torch.cuda.is_bf16_supported()`` answers True after creating a bf16 tensor - but by emulation, and
  slower than fp16; only ``is_bf16_supported(including_emulation=False)`` says False
  (``torch/cuda/__init__.py``: it returns True for ``major >= 8`` and otherwise, by default, tries a bf16
  tensor). A T4 timing bf16 would teach that bf16 is slow. So the course reads the capability itself (:attr:`Gpu.native_bf16`).
* **The link between two GPUs.** With peer access (``cudaDeviceCanAccessPeer``; torch's
  ``can_device_access_peer``) NCCL copies GPU to GPU over NVLink or PCIe (its P2P transport); without it -
  Kaggle's two T4s, many cloud VMs and consumer boards - NCCL stages every transfer through host shared
  memory (its SHM transport, "used between devices when peer-to-peer cannot happen": NCCL's environment
  documentation, ``NCCL_SHM_DISABLE``), with two copies across PCIe instead of one. Whether a peer link is
  NVLink is the topology matrix of ``nvidia-smi topo -m`` (``NV#`` entries), read here where the tool is
  installed. This is the course's reading, not NCCL's decision: NCCL may still send a PCIe pair that is far
  apart through host memory (``NCCL_P2P_LEVEL``), and ``NCCL_DEBUG=INFO`` names the transport of each pair.
* **A setting a card needs.** Multi-GPU GeForce RTX 40- and 50-series machines have hung in NCCL's P2P
  transport where the driver offered peer access, and run once ``NCCL_P2P_DISABLE=1`` sends NCCL through host
  memory (NVIDIA/nccl-tests#117 for 4090s, NVIDIA/nccl#1637 for 5090s). The course sets that variable for such
  cards' NCCL ranks and says so wherever it shows a run (:meth:`GpuMachine.nccl_settings`); a value the learner
  set wins.

Everything here is plain reading: no kernel runs; only ``nvidia-smi`` is asked, once per process. ``dpteach
doctor`` prints it (``dpteach/experiments/on_this_machine.py`` turns it into what each lesson shows), lesson 12 takes its 16-bit format from it, and the
panels name the link their NCCL ranks used.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, field

import torch

from .backend import visible_gpus

NATIVE_BF16 = (8, 0)        # Ampere: bf16 tensor cores
FP16_TENSOR_CORES = (7, 0)  # Volta: the first tensor cores, fp16 only
P2P_HANGS = ("GeForce RTX 40", "GeForce RTX 50")  # names whose NCCL P2P has hung (see the module docstring)


@dataclass(frozen=True)
class Gpu:
    """One visible GPU, as the course needs to know it."""

    index: int
    name: str
    capability: tuple[int, int]
    memory_bytes: int

    @property
    def native_bf16(self) -> bool:
        return tuple(self.capability) >= NATIVE_BF16

    @property
    def fp16_tensor_cores(self) -> bool:
        return tuple(self.capability) >= FP16_TENSOR_CORES

    @property
    def short_name(self) -> str:
        """``NVIDIA GeForce RTX 4090`` -> ``GeForce RTX 4090``; ``Tesla T4`` stays."""
        return self.name.removeprefix("NVIDIA ").strip()


@dataclass(frozen=True)
class Setting:
    """An environment variable the course sets for NCCL ranks on this machine, and why."""

    name: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.name}={self.value} ({self.why})"


@dataclass(frozen=True)
class GpuMachine:
    """The visible GPUs, the peer access between each pair, and what NCCL will find."""

    gpus: tuple[Gpu, ...]
    peer: tuple[tuple[bool, ...], ...]              # peer[i][j]: GPU i may read and write GPU j's memory
    topology: tuple[tuple[str, ...], ...] | None   # nvidia-smi's matrix (``NV4``, ``PIX``, ``SYS``, ...), or None
    nccl_version: str | None
    environment: dict = field(default_factory=dict)  # the NCCL_* variables already set in this process

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def names(self) -> str:
        """``2 x Tesla T4`` or ``A100 + H100`` for a mixed machine."""
        names = [g.short_name for g in self.gpus]
        if len(names) == 1:
            return names[0]
        return f"{len(names)} x {names[0]}" if len(set(names)) == 1 else " + ".join(names)

    def link_between(self, i: int, j: int) -> str:
        """How NCCL moves data from GPU i to GPU j: ``NVLink``, ``PCIe peer-to-peer`` or ``host memory``
        (``NCCL_P2P_DISABLE=1`` turns off NVLink and PCIe peer transfers alike)."""
        if not self.peer[i][j] or self.p2p_disabled:
            return "host memory"
        if self.topology and self.topology[i][j].startswith("NV"):
            return "NVLink"
        return "PCIe peer-to-peer" if self.topology else "peer-to-peer (NVLink or PCIe)"

    @property
    def p2p_disabled(self) -> bool:
        return (self.environment.get("NCCL_P2P_DISABLE") == "1"
                or any(s.name == "NCCL_P2P_DISABLE" and s.value == "1" for s in self.nccl_settings()))

    def links(self) -> set[str]:
        return {self.link_between(i, j) for i in range(self.count) for j in range(self.count) if i != j}

    def link_phrase(self) -> str:
        """The link in a few words, as the lesson table shows it: ``NVLink``, ``host memory (no peer access)``."""
        links = sorted(self.links())
        if links == ["host memory"]:
            return "host memory (" + ("NCCL_P2P_DISABLE=1)" if self.p2p_disabled else "no peer access)")
        return " and ".join(links)

    def link_sentence(self) -> str:
        """What a learner reads about the link between this machine's GPUs (None of it applies to one GPU)."""
        if self.count < 2:
            return f"one GPU ({self.names}): no link between GPUs" if self.gpus else "no GPU"
        links = self.links()
        if links == {"host memory"}:
            why = ("NCCL_P2P_DISABLE=1 is set" if self.p2p_disabled and any(self.peer[0][1:])
                   else "the GPUs have no peer access to each other")
            return (f"{self.names} linked through host memory: {why}, so NCCL copies every transfer into shared host "
                    f"memory and out again (its SHM transport) - two trips over PCIe instead of one, and far slower "
                    f"than NVLink")
        if len(links) == 1:
            return f"{self.names} linked by {links.pop()}: NCCL copies GPU to GPU (its P2P transport)"
        return (f"{self.names} with mixed links ({', '.join(sorted(links))}): NCCL's rings and trees run at the pace "
                f"of their slowest hop")

    def nccl_settings(self) -> list[Setting]:
        """The variables the course sets for NCCL ranks here; a variable already set is the learner's and is kept."""
        wanted = []
        hangs = [g.short_name for g in self.gpus if g.short_name.startswith(P2P_HANGS)]
        if self.count >= 2 and hangs and any(self.peer[i][j] for i in range(self.count) for j in range(self.count)
                                             if i != j):
            wanted.append(Setting("NCCL_P2P_DISABLE", "1", f"NCCL's peer-to-peer transport has hung on {hangs[0]} "
                                                             f"cards; this sends it through host memory"))
        return [s for s in wanted if s.name not in self.environment]

    def sixteen_bit(self) -> dict:
        """The 16-bit format lesson 12 trains in as its GPU choice, and what it says about it.

        ``{"format": "bf16" | "fp16" | None, "bf16": "native" | "emulated" | None, "sentence"}``; on CPU
        (no GPU) both are None: the CPU times neither format as a GPU would."""
        if not self.gpus:
            return {"format": None, "bf16": None,
                    "sentence": "on CPU ranks neither 16-bit format is timed as a GPU would run it"}
        if all(g.native_bf16 for g in self.gpus):
            return {"format": "bf16", "bf16": "native",
                    "sentence": f"bf16 is native on {self.names} (compute capability "
                                f"{_capability(self.gpus)}): bf16 autocast, no loss scale needed"}
        cores = ("its tensor cores multiply fp16" if all(g.fp16_tensor_cores for g in self.gpus)
                 else "it has no tensor cores, so fp16 saves memory rather than time")
        return {"format": "fp16", "bf16": "emulated",
                "sentence": f"fp16 with a loss scale: bf16 is emulated on {self.names} (compute capability "
                            f"{_capability(self.gpus)}, native bf16 needs 8.0), shown but not timed as a speed-up; "
                            f"{cores}"}


def sixteen_bit_on(device_type: str) -> dict:
    """:meth:`GpuMachine.sixteen_bit` for ranks on ``device_type``: the CPU's answer for CPU ranks, even on a
    machine that has GPUs (``device="cpu"``, ``DPTEACH_GPUS=0``)."""
    machine = read_machine() if device_type == "cuda" else GpuMachine((), (), None, None)
    return machine.sixteen_bit()


def _capability(gpus) -> str:
    return ", ".join(sorted({f"{g.capability[0]}.{g.capability[1]}" for g in gpus}))


@functools.lru_cache(maxsize=None)
def read_topology(count: int) -> tuple[tuple[str, ...], ...] | None:
    """The GPU-to-GPU part of ``nvidia-smi topo -m`` (``NV4`` for NVLink, ``PIX``/``PXB``/``PHB``/``NODE``/``SYS``
    for PCIe paths, ``X`` on the diagonal), or None where the tool is missing, slow or says something else. Asked
    once per process: every NCCL launch and every panel that names a link reads the machine again."""
    tool = shutil.which("nvidia-smi")
    if count < 2 or tool is None:
        return None
    try:
        text = subprocess.run([tool, "topo", "-m"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [line.split() for line in text.splitlines() if line.startswith("GPU")]
    matrix = tuple(tuple(row[1:count + 1]) for row in rows[:count])
    return matrix if len(matrix) == count and all(len(r) == count for r in matrix) else None


def read_machine() -> GpuMachine:
    """This machine's visible GPUs (``DPTEACH_GPUS`` caps them, as everywhere), read without running a kernel."""
    count = visible_gpus()
    gpus = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        gpus.append(Gpu(i, props.name, (props.major, props.minor), int(props.total_memory)))
    peer = tuple(tuple(i != j and bool(torch.cuda.can_device_access_peer(i, j)) for j in range(count))
                 for i in range(count))
    nccl = None
    if count:
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (AttributeError, RuntimeError):
            pass
    environment = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    return GpuMachine(tuple(gpus), peer, read_topology(count), nccl, environment)


_announced: set = set()


def settings_for_ranks(placement) -> dict:
    """The variables the course adds to NCCL ranks' environment on this machine (empty for gloo, and for the
    shared-GPU correctness worlds, which never use P2P). Each is printed once per process, never set silently."""
    if placement.backend != "nccl" or placement.shared_gpu:
        return {}
    machine = read_machine()
    settings = machine.nccl_settings()
    for setting in settings:
        if setting.name not in _announced:
            _announced.add(setting.name)
            print(f"NCCL on {machine.names}: the course sets {setting}")
    return {s.name: s.value for s in settings}
