"""The plumbing every hand-written collective shares: one exchange, chunking, checks, staging.

Nothing here is an algorithm; the algorithms (``ring.py``, ``tree.py``, ``naive.py``) are built on
these few helpers so that each of them reads like its textbook description.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..ranks.backend import backend_for

OPS = ("sum", "avg")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def exchange(send: torch.Tensor | None, dst: int | None, recv: torch.Tensor | None, src: int | None,
             group=None) -> None:
    """Send ``send`` to ``dst`` while receiving ``recv`` from ``src``; return when both are done.

    Posting both halves before waiting on either is what makes a ring safe: if every rank did a
    blocking ``send`` first, every rank would wait for a receiver that is itself still sending.
    The receive is posted first so that arriving bytes land straight in ``recv`` (gloo otherwise
    parks them in a temporary buffer and copies them again). NCCL additionally needs the two
    posted as one group, which ``batch_isend_irecv`` does.
    """
    for request in post(send, dst, recv, src, group):
        if request is not None:
            request.wait()


def post(send: torch.Tensor | None, dst: int | None, recv: torch.Tensor | None, src: int | None,
         group=None) -> tuple:
    """Start a receive and/or a send without waiting; return ``(recv_request, send_request)``.

    Either request is ``None`` when its tensor is missing or empty (a rank with an empty chunk
    has nothing to send, and its neighbour knows, from the same chunk sizes, to expect nothing).
    """
    ops, has_recv, has_send = [], recv is not None and recv.numel() > 0, send is not None and send.numel() > 0
    if has_recv and has_send and recv.device.type != send.device.type:
        raise ValueError(f"send is on {send.device} and recv on {recv.device}: one exchange moves tensors of one "
                         f"device type (the world may move each type with a different backend)")
    if has_recv:
        ops.append(dist.P2POp(dist.irecv, on_the_wire(recv, group), src, group))
    if has_send:
        ops.append(dist.P2POp(dist.isend, on_the_wire(send, group), dst, group))
    requests = dist.batch_isend_irecv(ops) if ops else []
    return (requests[0] if has_recv else None), (requests[-1] if has_send else None)


# What ProcessGroupNCCL can name as an NCCL data type (its ``ncclDataType`` table): no 16-bit integer.
NCCL_DTYPES = (torch.int8, torch.uint8, torch.bool, torch.int32, torch.int64,
               torch.float16, torch.bfloat16, torch.float32, torch.float64)


def on_the_wire(tensor: torch.Tensor, group=None, backend: str | None = None) -> torch.Tensor:
    """The tensor a send or receive hands to the backend: ``tensor`` itself, or its bytes.

    NCCL has no 16-bit integer type, and asking it to move an int16 tensor fails *inside*
    ``batch_isend_irecv``'s NCCL group, which is then never closed, so the next NCCL call can hang.
    A send or receive is a plain copy, though - no arithmetic on the values - so the same bytes can
    travel as ``uint8``: a view of the same memory (nothing copied, exact), into which a receive
    writes directly. ``backend`` overrides the world's backend for this tensor's device (for tests).
    """
    backend = backend or backend_for(tensor.device.type, group)
    if backend != "nccl" or tensor.dtype in NCCL_DTYPES:
        return tensor
    if not tensor.is_contiguous():
        raise ValueError(f"a {str(tensor.dtype).replace('torch.', '')} tensor sent over NCCL must be contiguous "
                         f"(it travels as a byte view of its memory); pass tensor.contiguous()")
    return tensor.view(torch.uint8)


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``parts`` contiguous chunks whose sizes differ by at most one.

    The first ``numel % parts`` chunks get one element more: 10 elements in 4 chunks are
    [0:3], [3:6], [6:8], [8:10]. With fewer elements than parts, the last chunks are empty.
    """
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def check_arguments(name: str, tensor, op: str = "sum") -> None:
    """Reject bad input before a single message is sent (a bad message can hang every rank)."""
    if not dist.is_initialized():
        raise RuntimeError(f"{name}: no process group; run it inside dpteach.launch(...) or torchrun")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name}: tensor={type(tensor).__name__} is not allowed: pass a torch.Tensor")
    if tensor.dtype not in DTYPES:
        allowed = ", ".join(str(d).replace("torch.", "") for d in DTYPES)
        raise ValueError(f"{name}: tensor dtype {str(tensor.dtype).replace('torch.', '')} is not allowed: "
                         f"use one of {allowed}")
    if op not in OPS:
        raise ValueError(f"{name}: op={op!r} is not allowed: use 'sum' or 'avg'")


def gather_shapes(name: str, tensor: torch.Tensor, group=None, must_match: bool = True) -> list[int]:
    """Tell every rank how many elements (and which dtype) every other rank holds.

    A collective whose ranks disagree on the length would post sends and receives that never
    match, and hang. Exchanging two integers first (a tiny ring all-gather) turns that into the
    same clear error on every rank. Returns each rank's element count.
    """
    world, me = dist.get_world_size(group), dist.get_rank(group)
    table = torch.zeros(world, 2, dtype=torch.int64)
    table[me, 0] = tensor.numel()
    table[me, 1] = DTYPES.index(tensor.dtype)
    for step in range(world - 1):  # each rank forwards the row it received in the previous step
        send_row = (me - step) % world
        exchange(table[send_row], (me + 1) % world, table[(send_row - 1) % world], (me - 1) % world, group)
    sizes = table[:, 0].tolist()
    dtypes = [str(DTYPES[i]).replace("torch.", "") for i in table[:, 1].tolist()]
    if len(set(dtypes)) > 1 or (must_match and len(set(sizes)) > 1):
        listing = ", ".join(f"rank {r}: {n} x {d}" for r, (n, d) in enumerate(zip(sizes, dtypes)))
        raise ValueError(f"{name}: the ranks passed different tensors ({listing}); every rank must pass "
                         f"the same number of elements of the same dtype")
    return sizes


def stages_through_host(tensor: torch.Tensor, group=None) -> bool:
    """gloo moves host memory only: a CUDA tensor must be copied to the CPU and back."""
    return tensor.is_cuda and backend_for("cuda", group) == "gloo"


@contextmanager
def flat_work_buffer(tensor: torch.Tensor, group=None):
    """Yield a flat, contiguous buffer the algorithm may overwrite; write it back into ``tensor``.

    Usually this is ``tensor`` itself viewed as 1-D (no copy). A non-contiguous tensor, or a CUDA
    tensor under gloo, is copied out and the result copied back at the end.
    """
    if stages_through_host(tensor, group):
        work = tensor.detach().to("cpu").reshape(-1)
    elif tensor.is_contiguous():
        work = tensor.detach().view(-1)
    else:
        work = tensor.detach().contiguous().view(-1)
    yield work
    if work.data_ptr() != tensor.data_ptr():
        tensor.detach().copy_(work.view(tensor.shape))


def finish_average(buffer: torch.Tensor, world: int) -> None:
    """Turn a sum into a mean. Integer tensors use floor division (as Python's ``//``)."""
    if buffer.is_floating_point():
        buffer.div_(world)
    else:
        buffer.floor_divide_(world)


def record(trace: list | None, **transfer) -> None:
    """Append one transfer (algorithm, phase, step, src, dst, chunk, start, stop, elements) to a trace."""
    if trace is not None:
        transfer["elements"] = transfer["stop"] - transfer["start"]
        trace.append(transfer)
