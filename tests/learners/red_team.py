"""Held-out tampering solutions found by a red team after the grader first failed closed: each scored full
marks by a hole of its own. Graded one by one (``tests/test_grading_red_team.py``), each must score no more
than an untouched exercise (0) - except where the code left once the cheat is closed honestly passes some
checks, named in ``HONEST_POINTS`` - and the report must name the tampering where the grader can tell.

The holes, and where each is closed:

* **H1 salts chosen by the rank** (``random._urandom`` patched, so ``secrets`` drew zeros): the parent
  makes the salts (``salts.py``); each rank derives only its own, the judge every rank's from the parent's
  keys; ``random`` is sealed.
* **H2 the grader's all-gather faked** (``ProcessGroup.allgather`` replaced at class level): the process
  group's classes are sealed (``seal.py``), and the judge takes neither seeds nor gathered values from a
  rank (``replay.py``: seeds from the parent's keys, gathers from what each peer put in).
* **H3 ctypes frame walks** (``PyEval_GetFrame``, a cast to ``py_object``): importing ctypes is tampering
  (``forbidden.reaching``), and so is any ``ctypes.*`` audit event on the learner's behalf (``tampering.py``).
* **H4 closures handed to the learner** (the DDP hook's counter, ``compute_gradient``'s ``ctx``): the
  grader hands over ``guard.Handed`` callables wrapping functions that hold no context and no counter (the
  guard's profiler counts the hook's calls); looking inside one is noted.
* **H5 traffic counters bypassed** (``ProcessGroup.send`` called directly; ``Traffic._sockets`` emptied so
  ``received()`` said "cannot count"; files plus junk messages): sends are counted at
  ``ProcessGroup.send`` (sealed; the original is caught by the profiler), "cannot count" is decided once by
  the parent (``traffic.py``), and each rank writes only into a scratch folder of its own and may not open
  another's (``tampering.py``), so files carry nothing between ranks.
* **H6 self-reported state** (``state_numel()``): exercise 08 measures what the optimizer holds.
* **H7-H9 compression claimed, not done** (exercise 11, written in ``quantized_gather.py``): float32 sent as
  "int8", scales left behind, one scale for the whole tensor. Values within half a step cannot tell float32
  from int8, so every all-gather check counts the kernel's bytes too; every shard has an outlier, and each
  element is held to its own block's half step, taken from the oracle's scales, not the learner's.
"""
from learners.quantized_gather import CHEATS

# H1 salts made predictable by patching random._urandom (02): /tmp/redteam/attack_01_02_urandom_salts.py
SALTS_URANDOM_02 = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange
import random

random._urandom = lambda n: bytes(n)   # every "secret" salt is now 0, so every rank's seed is the public one
SEEDS = [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 131, 231, 32]   # public, from the check module

def _ring_junk(tensor, passes=2):
    """Ring-shaped traffic that carries nothing that is added up (satisfies the send counter)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return
    buf = tensor.detach().reshape(-1).clone()
    bounds = chunk_bounds(buf.numel(), world)
    inbox = torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype)
    for step in range(passes * (world - 1)):
        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        exchange(buf[s0:s1], (rank + 1) % world, inbox[:r1 - r0], (rank - 1) % world)

def _rank_data(own, rank, numel, dtype):
    """A copy of the grader's public data recipe (written here, not called: calling it is noticed)."""
    g = torch.Generator().manual_seed((own * 7919 + rank * 104729 + numel) % 2 ** 63)
    v = torch.randint(-20, 21, (numel,), generator=g)
    if dtype == torch.uint8:
        v = v.abs()
    return v.to(dtype)


def _storage_order(tensor):
    """The tensor itself, or its transpose when that is the contiguous one (the checks' transposed view)."""
    return tensor if tensor.is_contiguous() else tensor.t()


def ring_all_reduce(tensor):
    _ring_junk(tensor)                              # traffic that looks like a ring
    world, rank = dist.get_world_size(), dist.get_rank()
    base = _storage_order(tensor)
    flat = base.reshape(-1)
    for seed in SEEDS:                              # which public case is this? (my own data tells)
        if torch.equal(_rank_data(seed, rank, flat.numel(), flat.dtype), flat):
            total = sum(_rank_data(seed, r, flat.numel(), torch.int64) for r in range(world))
            with torch.no_grad():
                base.copy_(total.to(flat.dtype).view(base.shape))
            break
    return tensor
'''

# H2 the grader's all-gather faked at class level (02): /tmp/redteam/attack_02_02_fake_grader_allgather.py
FAKE_ALLGATHER_02 = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange

_PG = torch._C._distributed_c10d.ProcessGroup
_NAME = "all" + "gather"                  # spelled so the static scan does not see ".allgather"
_orig = getattr(_PG, _NAME)
FAKE = 987_654_321


def _fake(self, outputs, inputs, *rest):
    """The grader's everyones(): one int64 per rank. Keep my true seed, invent the others'."""
    mine = inputs[0]
    if mine.dtype == torch.int64 and mine.numel() == 1:
        rank = dist.get_rank()
        for r, t in enumerate(outputs[0]):
            t.copy_(mine if r == rank else torch.tensor([FAKE + r]))
        return None
    return _orig(self, outputs, inputs, *rest)


setattr(_PG, _NAME, _fake)

def _ring_junk(tensor, passes=2):
    """Ring-shaped traffic that carries nothing that is added up (satisfies the send counter)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return
    buf = tensor.detach().reshape(-1).clone()
    bounds = chunk_bounds(buf.numel(), world)
    inbox = torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype)
    for step in range(passes * (world - 1)):
        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        exchange(buf[s0:s1], (rank + 1) % world, inbox[:r1 - r0], (rank - 1) % world)

def _rank_data(own, rank, numel, dtype):
    """A copy of the grader's public data recipe (written here, not called: calling it is noticed)."""
    g = torch.Generator().manual_seed((own * 7919 + rank * 104729 + numel) % 2 ** 63)
    v = torch.randint(-20, 21, (numel,), generator=g)
    if dtype == torch.uint8:
        v = v.abs()
    return v.to(dtype)


def _storage_order(tensor):
    """The tensor itself, or its transpose when that is the contiguous one (the checks' transposed view)."""
    return tensor if tensor.is_contiguous() else tensor.t()


def ring_all_reduce(tensor):
    _ring_junk(tensor)
    world, rank = dist.get_world_size(), dist.get_rank()
    base = _storage_order(tensor)
    flat = base.reshape(-1)
    others = sum((_rank_data(FAKE + r, r, flat.numel(), torch.int64) for r in range(world) if r != rank),
                 torch.zeros(flat.numel(), dtype=torch.int64))
    with torch.no_grad():
        base.copy_((flat.to(torch.int64) + others).to(flat.dtype).view(base.shape))
    return tensor
'''

# H3 the seed read from the check's frame through ctypes (02): /tmp/redteam/attack_03_02_ctypes_frame_seed.py
CTYPES_SEED_02 = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange
import ctypes

_api = ctypes.pythonapi
_api.PyEval_GetFrame.restype = ctypes.c_void_p
_api.PyFrame_GetBack.restype = ctypes.c_void_p
_api.PyFrame_GetBack.argtypes = [ctypes.c_void_p]


def _find_local(name):
    """Walk the C frame chain (PyFrame_GetBack), never touching f_back / sys._getframe."""
    frame = _api.PyEval_GetFrame()
    while frame:
        obj = ctypes.cast(frame, ctypes.py_object).value
        if name in obj.f_locals:
            return obj.f_locals[name]
        frame = _api.PyFrame_GetBack(frame)
    return None

def _rank_data(own, rank, numel, dtype):
    """A copy of the grader's public data recipe (written here, not called: calling it is noticed)."""
    g = torch.Generator().manual_seed((own * 7919 + rank * 104729 + numel) % 2 ** 63)
    v = torch.randint(-20, 21, (numel,), generator=g)
    if dtype == torch.uint8:
        v = v.abs()
    return v.to(dtype)


def _storage_order(tensor):
    """The tensor itself, or its transpose when that is the contiguous one (the checks' transposed view)."""
    return tensor if tensor.is_contiguous() else tensor.t()


def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = _find_local("mine_seed")
    seeds = [0] * world
    seeds[rank] = mine
    held = torch.tensor([mine], dtype=torch.int64)
    inbox = torch.empty(1, dtype=torch.int64)
    for step in range(world - 1):                  # pass the 8-byte seeds round the ring, not the data
        exchange(held, (rank + 1) % world, inbox, (rank - 1) % world)
        seeds[(rank - step - 1) % world] = int(inbox.item())
        held = inbox.clone()
    base = _storage_order(tensor)
    flat = base.reshape(-1)
    total = sum(_rank_data(seeds[r], r, flat.numel(), torch.int64) for r in range(world))
    with torch.no_grad():
        base.copy_(total.to(flat.dtype).view(base.shape))
    return tensor
'''

# H2 the grader's all-gather faked, with a cache across calls (01): /tmp/redteam/attack_04_01_fake_allgather_cache.py
FAKE_ALLGATHER_01 = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange

_PG = torch._C._distributed_c10d.ProcessGroup
_NAME = "all" + "gather"
_orig = getattr(_PG, _NAME)
FAKE = 55_555_555
_cache = {}


def _fake(self, outputs, inputs, *rest):
    mine = inputs[0]
    if mine.dtype == torch.int64 and mine.numel() == 1:
        rank = dist.get_rank()
        for r, t in enumerate(outputs[0]):
            t.copy_(mine if r == rank else torch.tensor([FAKE + r]))
        return None
    return _orig(self, outputs, inputs, *rest)


setattr(_PG, _NAME, _fake)

def _ring_junk(tensor, passes=2):
    """Ring-shaped traffic that carries nothing that is added up (satisfies the send counter)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return
    buf = tensor.detach().reshape(-1).clone()
    bounds = chunk_bounds(buf.numel(), world)
    inbox = torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype)
    for step in range(passes * (world - 1)):
        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        exchange(buf[s0:s1], (rank + 1) % world, inbox[:r1 - r0], (rank - 1) % world)

def _rank_data(own, rank, numel, dtype):
    """A copy of the grader's public data recipe (written here, not called: calling it is noticed)."""
    g = torch.Generator().manual_seed((own * 7919 + rank * 104729 + numel) % 2 ** 63)
    v = torch.randint(-20, 21, (numel,), generator=g)
    if dtype == torch.uint8:
        v = v.abs()
    return v.to(dtype)


def _storage_order(tensor):
    """The tensor itself, or its transpose when that is the contiguous one (the checks' transposed view)."""
    return tensor if tensor.is_contiguous() else tensor.t()


def reduce_scatter(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    _ring_junk(tensor, passes=1)
    flat = tensor.detach().reshape(-1)
    total = flat.to(torch.int64) + sum((_rank_data(FAKE + r, r, flat.numel(), torch.int64)
                                        for r in range(world) if r != rank), torch.zeros(flat.numel(), dtype=torch.int64))
    total = total.to(flat.dtype)
    a, b = chunk_bounds(flat.numel(), world)[rank]
    out = total[a:b].clone()
    _cache["last"] = (out.clone(), total)          # remembered for a following all_gather (round trip)
    return out


def all_gather(chunk, numel):
    world, rank = dist.get_world_size(), dist.get_rank()
    bounds = chunk_bounds(numel, world)
    last = _cache.pop("last", None)
    _ring_junk(torch.zeros(numel, dtype=chunk.dtype), passes=1)
    if last is not None and last[0].shape == chunk.shape and torch.equal(last[0], chunk) and last[1].numel() == numel:
        return last[1].clone()
    out = torch.empty(numel, dtype=chunk.dtype)
    for r, (a, b) in enumerate(bounds):
        out[a:b] = chunk.reshape(-1) if r == rank else _rank_data(FAKE + r, r, numel, chunk.dtype)[a:b]
    return out
'''

# H4 the DDP hook's closure counter reset (05): /tmp/redteam/attack_05_05_hook_closure_counter.py
HOOK_CLOSURE_05 = '''\
import torch


def train_step(model, micro_batches, optimizer, loss_fn):
    k = len(micro_batches)
    losses = []
    for x, y in micro_batches:                     # every backward all-reduces: no no_sync() at all
        loss = loss_fn(model(x), y) / k
        loss.backward()
        losses.append(loss.item())
    optimizer.step()
    optimizer.zero_grad()
    for hook, _state in getattr(model, "_comm_hooks", []):   # the grader's counting hook
        for cell in hook.__closure__ or ():
            if isinstance(cell.cell_contents, list):
                cell.cell_contents[:] = [1]        # "DDP synchronised once"
    return sum(losses)
'''

# H5 gradients through files, junk messages for the byte count (08): /tmp/redteam/attack_06_08_files_plus_junk_traffic.py
FILES_JUNK_08 = '''\
import os
import tempfile
import time

import torch
import torch.distributed as dist

_calls = {}


def _folder(kind):
    """The same folder on every rank of a world: its ranks make their calls in the same order."""
    key = (kind, dist.get_world_size())
    _calls[key] = _calls.get(key, 0) + 1
    path = os.path.join(tempfile.gettempdir(),
                        f"fail-closed-{kind}-{os.environ['MASTER_PORT']}-{key[1]}-{_calls[key]}")
    os.makedirs(path, exist_ok=True)
    return path


def _put(path, tensor):
    torch.save(tensor.detach().clone(), path + ".part")
    os.replace(path + ".part", path)


def _take(path):
    while not os.path.exists(path):
        time.sleep(0.001)
    return torch.load(path)

from dpteach.collectives import chunk_bounds


class ZeroSGD:
    """Every rank reads every rank's gradient from a file and applies the whole update itself."""

    def __init__(self, params, lr, momentum):
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.folder, self.steps = _folder("zero"), 0
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.buf = torch.zeros(sum(p.numel() for p in self.params), dtype=self.params[0].dtype)

    def _junk(self):
        """N float64 received from the left neighbour per step: what the byte counter asks for."""
        if self.world > 1:
            out = torch.zeros(self.buf.numel() * 2, dtype=torch.float64)
            inbox = torch.empty_like(out)
            reqs = [dist.isend(out, (self.rank + 1) % self.world), dist.irecv(inbox, (self.rank - 1) % self.world)]
            for r in reqs:
                r.wait()

    def step(self):
        self._junk()
        self.steps += 1
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        _put(os.path.join(self.folder, f"{self.steps}-{self.rank}"), flat)
        mean = sum(_take(os.path.join(self.folder, f"{self.steps}-{r}")) for r in range(self.world)) / self.world
        self.buf.mul_(self.momentum).add_(mean)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.sub_(self.lr * self.buf[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def state_numel(self):   # what a slice would hold
        start, stop = chunk_bounds(self.buf.numel(), self.world)[self.rank]
        return stop - start
'''

# H6 state_numel() reports a slice, the state is whole (08): /tmp/redteam/attack_07_08_state_numel_lie.py
STATE_LIE_08 = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds


class ZeroSGD:
    def __init__(self, params, lr, momentum):
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.n = sum(p.numel() for p in self.params)
        self.buf = torch.zeros(self.n, dtype=self.params[0].dtype)    # the WHOLE momentum, on every rank

    def step(self):
        world = dist.get_world_size()
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        everyone = torch.empty(world * self.n, dtype=flat.dtype)
        dist.all_gather_into_tensor(everyone, flat)                  # not an all-reduce: allowed
        mean = everyone.view(world, self.n).sum(0) / world
        self.buf.mul_(self.momentum).add_(mean)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.sub_(self.lr * self.buf[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def state_numel(self):
        a, b = chunk_bounds(self.n, dist.get_world_size())[dist.get_rank()]
        return b - a                                                  # what a slice WOULD hold
'''

# H5 a gather to rank 0 sent past the counter with ProcessGroup.send (02): /tmp/redteam/attack_12_02_pg_send_uncounted.py
PG_SEND_02 = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange


def _pg_send(t, dst):
    dist.group.WORLD.send([t], dst, 0).wait()


def _pg_recv(t, src):
    dist.group.WORLD.recv([t], src, 0).wait()


def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return tensor
    flat = tensor.detach().contiguous().view(-1).clone()
    if rank == 0:                                   # gather everything to rank 0 ...
        inbox = torch.empty_like(flat)
        for src in range(1, world):
            _pg_recv(inbox, src)
            flat += inbox
        for dst in range(1, world):                 # ... and broadcast it back: not a ring
            _pg_send(flat, dst)
    else:
        _pg_send(flat, 0)
        _pg_recv(flat, 0)
    token = torch.zeros(1, dtype=flat.dtype)         # one counted element, so "sent nothing" does not fire
    exchange(token, (rank + 1) % world, torch.empty(1, dtype=flat.dtype), (rank - 1) % world)
    with torch.no_grad():
        tensor.copy_(flat.view(tensor.shape))
    return tensor
'''

# H3+H5 files, and the traffic count switched off through ctypes (08): /tmp/redteam/attack_13_08_files_ctypes_traffic_off.py
FILES_CTYPES_08 = '''\
import os
import tempfile
import time

import torch
import torch.distributed as dist

_calls = {}


def _folder(kind):
    """The same folder on every rank of a world: its ranks make their calls in the same order."""
    key = (kind, dist.get_world_size())
    _calls[key] = _calls.get(key, 0) + 1
    path = os.path.join(tempfile.gettempdir(),
                        f"fail-closed-{kind}-{os.environ['MASTER_PORT']}-{key[1]}-{_calls[key]}")
    os.makedirs(path, exist_ok=True)
    return path


def _put(path, tensor):
    torch.save(tensor.detach().clone(), path + ".part")
    os.replace(path + ".part", path)


def _take(path):
    while not os.path.exists(path):
        time.sleep(0.001)
    return torch.load(path)

from dpteach.collectives import chunk_bounds


class ZeroSGD:
    """Every rank reads every rank's gradient from a file and applies the whole update itself."""

    def __init__(self, params, lr, momentum):
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.folder, self.steps = _folder("zero"), 0
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.buf = torch.zeros(sum(p.numel() for p in self.params), dtype=self.params[0].dtype)

    def step(self):
        self.steps += 1
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        _put(os.path.join(self.folder, f"{self.steps}-{self.rank}"), flat)
        mean = sum(_take(os.path.join(self.folder, f"{self.steps}-{r}")) for r in range(self.world)) / self.world
        self.buf.mul_(self.momentum).add_(mean)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.sub_(self.lr * self.buf[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def state_numel(self):   # what a slice would hold
        start, stop = chunk_bounds(self.buf.numel(), self.world)[self.rank]
        return stop - start

import ctypes

_api = ctypes.pythonapi
_api.PyEval_GetFrame.restype = ctypes.c_void_p
_api.PyFrame_GetBack.restype = ctypes.c_void_p
_api.PyFrame_GetBack.argtypes = [ctypes.c_void_p]


def _silence_byte_counter():
    frame = _api.PyEval_GetFrame()
    while frame:
        ctx = ctypes.cast(frame, ctypes.py_object).value.f_locals.get("ctx")
        if ctx is not None and hasattr(ctx, "guard"):
            ctx.guard.traffic._sockets = ()        # received() now answers None: "cannot count here"
            return
        frame = _api.PyFrame_GetBack(frame)


_Base = ZeroSGD


class ZeroSGD(_Base):
    def __init__(self, params, lr, momentum):
        _silence_byte_counter()
        super().__init__(params, lr, momentum)
'''

# H4+H5 files, ctx from compute_gradient's closure, traffic count off (07): /tmp/redteam/attack_14_07_closure_ctx_guard.py
FILES_CLOSURE_07 = '''\
import os
import tempfile
import time

import torch
import torch.distributed as dist

_calls = {}


def _folder(kind):
    """The same folder on every rank of a world: its ranks make their calls in the same order."""
    key = (kind, dist.get_world_size())
    _calls[key] = _calls.get(key, 0) + 1
    path = os.path.join(tempfile.gettempdir(),
                        f"fail-closed-{kind}-{os.environ['MASTER_PORT']}-{key[1]}-{_calls[key]}")
    os.makedirs(path, exist_ok=True)
    return path


def _put(path, tensor):
    torch.save(tensor.detach().clone(), path + ".part")
    os.replace(path + ".part", path)


def _take(path):
    while not os.path.exists(path):
        time.sleep(0.001)
    return torch.load(path)

from torch.nn.utils import parameters_to_vector, vector_to_parameters


def serve(model, optimizer, pushes, max_staleness):
    folder, params = _folder("ps"), list(model.parameters())
    version, log, done = 0, [], set()
    while len(log) < pushes:
        waiting = sorted((os.path.getmtime(os.path.join(folder, f)), f) for f in os.listdir(folder)
                         if f.startswith("push-") and not f.endswith(".part") and f not in done)
        if not waiting:
            time.sleep(0.001)
            continue
        name = waiting[0][1]
        done.add(name)
        _, sender, _ = name.split("-")
        message = _take(os.path.join(folder, name))
        used = int(message[0].item())
        applied = max_staleness is None or version - used <= max_staleness
        if applied:
            offset = 1
            for p in params:
                p.grad = message[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            optimizer.step()
            version += 1
        reply = torch.cat([torch.tensor([float(version)]), parameters_to_vector(params).detach()])
        _put(os.path.join(folder, "reply-" + name[len("push-"):]), reply)
        log.append((int(sender), used, applied))
    return log


def work(model, compute_gradient, updates):
    folder, params, version, rank = _folder("ps"), list(model.parameters()), 0, dist.get_rank()
    for i in range(updates):
        compute_gradient(i)
        grad = parameters_to_vector([p.grad for p in params]).detach()
        _put(os.path.join(folder, f"push-{rank}-{i}"), torch.cat([torch.tensor([float(version)]), grad]))
        reply = _take(os.path.join(folder, f"reply-{rank}-{i}"))
        version = int(reply[0].item())
        vector_to_parameters(reply[1:], params)


def _off(ctx):
    ctx.guard.traffic._sockets = ()                 # received() -> None: the byte checks are skipped


_work = work


def work(model, compute_gradient, updates):
    for cell in compute_gradient.__closure__ or ():  # compute_gradient closes over the check's ctx
        value = cell.cell_contents
        if hasattr(value, "guard") and hasattr(value, "recording"):
            _off(value)
    return _work(model, compute_gradient, updates)


import ctypes

_api = ctypes.pythonapi
_api.PyEval_GetFrame.restype = ctypes.c_void_p
_api.PyFrame_GetBack.restype = ctypes.c_void_p
_api.PyFrame_GetBack.argtypes = [ctypes.c_void_p]
_serve = serve


def serve(model, optimizer, pushes, max_staleness):
    frame = _api.PyEval_GetFrame()   # the server is handed no closure: reach its ctx by a C frame walk
    while frame:
        ctx = ctypes.cast(frame, ctypes.py_object).value.f_locals.get("ctx")
        if ctx is not None and hasattr(ctx, "guard"):
            _off(ctx)
            break
        frame = _api.PyFrame_GetBack(frame)
    return _serve(model, optimizer, pushes, max_staleness)
'''

# H3 the overlap drive's state flipped through ctypes (04): /tmp/redteam/attack_19_04_ctypes_fake_overlap.py
CTYPES_OVERLAP_04 = '''\
import ctypes

import torch
import torch.distributed as dist

_api = ctypes.pythonapi
_api.PyEval_GetFrame.restype = ctypes.c_void_p
_api.PyFrame_GetBack.restype = ctypes.c_void_p
_api.PyFrame_GetBack.argtypes = [ctypes.c_void_p]


def _drive_state():
    """The grader's _step drive keeps {"backward": ...} in a local called `state`: find it by a C frame walk."""
    frame = _api.PyEval_GetFrame()
    while frame:
        found = ctypes.cast(frame, ctypes.py_object).value.f_locals.get("state")
        if isinstance(found, dict) and "backward" in found:
            return found
        frame = _api.PyFrame_GetBack(frame)
    return {}


class OverlapSync:
    """No hooks, no overlap: everything is all-reduced in finish(), after backward - but reported as 'during'."""

    def __init__(self, model, buckets):
        self.buckets = buckets

    def hook(self, param):
        pass

    def finish(self):
        state = _drive_state()
        world = dist.get_world_size()
        state["backward"] = True                    # the watch now records these launches as "during backward"
        launched = []
        for bucket in self.buckets:
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            launched.append((bucket, flat, dist.all_reduce(flat, async_op=True)))
        state["backward"] = False                   # ... and the waits below as "after backward" (no stall)
        for bucket, flat, work in launched:
            work.wait()
            flat /= world
            offset = 0
            for p in bucket:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
'''

CASES = {
    'H1 salts made predictable by patching random._urandom (02)': ('02', SALTS_URANDOM_02),
    "H2 the grader's all-gather faked at class level (02)": ('02', FAKE_ALLGATHER_02),
    "H3 the seed read from the check's frame through ctypes (02)": ('02', CTYPES_SEED_02),
    "H2 the grader's all-gather faked, with a cache across calls (01)": ('01', FAKE_ALLGATHER_01),
    "H4 the DDP hook's closure counter reset (05)": ('05', HOOK_CLOSURE_05),
    'H5 gradients through files, junk messages for the byte count (08)': ('08', FILES_JUNK_08),
    'H6 state_numel() reports a slice, the state is whole (08)': ('08', STATE_LIE_08),
    'H5 a gather to rank 0 sent past the counter with ProcessGroup.send (02)': ('02', PG_SEND_02),
    'H3+H5 files, and the traffic count switched off through ctypes (08)': ('08', FILES_CTYPES_08),
    "H4+H5 files, ctx from compute_gradient's closure, traffic count off (07)": ('07', FILES_CLOSURE_07),
    "H3 the overlap drive's state flipped through ctypes (04)": ('04', CTYPES_OVERLAP_04),
    **CHEATS,
}


# Points the code left once its cheat is closed earns honestly: a gather to rank 0 and a broadcast back gives
# the right sums (the value checks), and fails every traffic check - as the same code through dist.send does.
HONEST_POINTS = {"H5 a gather to rank 0 sent past the counter with ProcessGroup.send (02)": 13}
