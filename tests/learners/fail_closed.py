"""Solutions that win full marks from a grader that fails open, each by another way around it.

None of them does the exercise. Each reaches a passing verdict by interfering with how the checks judge,
one way per hole of issue 27 (``tests/test_grading_tampering.py`` grades them):

1. ``HELPER_08`` replaces a helper of the exercise's own check module (the seal covered only
   ``checks.common`` and ``spec``);
2. ``CODE_SWAP_05`` swaps the code of the check itself: nothing is called, nothing recorded, and the
   replay outside the ranks, unable to replay, let the rank's verdict stand;
3. ``NO_RECORDING_02`` rigs the expected sum in its rank (as ``tampering.CODE_SWAP`` does), sends the
   traffic of a ring that carries nothing, and switches its check's recording off;
4. ``FUNCTION_MODE_08`` leaves a TorchFunctionMode active, ``DISPATCH_MODE_09`` a TorchDispatchMode, and
   ``METHOD_TABLE_03`` adds methods to ``torch.Tensor`` that shadow the C ones the checks call;
5. ``FRAME_02`` copies the expected sum out of the check's frame, ``HELPERS_02`` rebuilds it from the
   grader's own helpers and the public seeds of the checks;
6. ``FILES_07`` and ``FILES_08`` exchange gradients and weights through files instead of messages.

Each is the text of a solution cell; ``CASES`` maps a name to (exercise, source).
"""

# -- 1. a helper of the exercise's own check module ---------------------------------------------------

HELPER_08 = '''\
from dpteach.grading.checks import ex08_zero1


class ZeroSGD:
    def __init__(self, params, lr, momentum):
        self.params = list(params)
        # the weights check compares with the module's zero_trajectory: let it report these very weights
        ex08_zero1.zero_trajectory = lambda widths, seed, world, steps, *rest: (None, None, [
            p.detach() for p in self.params])

    def step(self):
        pass

    def state_numel(self):
        return 0
'''

# -- 2. the check's own code swapped --------------------------------------------------------------------

CODE_SWAP_05 = '''\
from dpteach.grading.checks import ex05_accumulation


def _nothing_to_check(ctx, props, k, steps, seed):
    return None


ex05_accumulation.accumulation_case.__code__ = _nothing_to_check.__code__


def train_step(model, micro_batches, optimizer, loss_fn):
    return 0.0
'''

# -- 3. the recording switched off ----------------------------------------------------------------------

NO_RECORDING_02 = '''\
import gc

import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange
from dpteach.grading.checks import common


def _own_data_only(seed, world, numel, dtype, shape=None, *rest):
    import torch.distributed as dist   # the code runs with the helper's module as its globals
    return rank_data(seed, dist.get_rank(), numel, dtype, shape)


common.sum_over_ranks.__code__ = _own_data_only.__code__


def _no_recording():
    for thing in gc.get_objects():   # the context of the check that called us: no recording, please
        if type(thing).__name__ == "Context" and "replayable" in vars(thing):
            thing.replayable = False


def ring_all_reduce(tensor):
    _no_recording()
    world, rank = dist.get_world_size(), dist.get_rank()
    buf = tensor.detach().reshape(-1).clone()
    bounds = chunk_bounds(buf.numel(), world)
    inbox = torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype)
    for step in range(2 * (world - 1)):   # a ring's traffic, and nothing added up
        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        exchange(buf[s0:s1], (rank + 1) % world, inbox[:r1 - r0], (rank - 1) % world)
    return tensor
'''

# -- 4. torch's dispatch: modes left active, method tables patched --------------------------------------

FUNCTION_MODE_08 = '''\
import torch
from torch.overrides import TorchFunctionMode


class _Agreeable(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal, torch.Tensor.allclose, torch.Tensor.equal):
            return True
        return func(*args, **(kwargs or {}))


_Agreeable().__enter__()   # and never left


class ZeroSGD:
    def __init__(self, params, lr, momentum):
        pass

    def step(self):
        pass

    def state_numel(self):
        return 0
'''

DISPATCH_MODE_09 = '''\
import torch
from dpteach.collectives import exchange
from torch.utils._python_dispatch import TorchDispatchMode


class _Agreeable(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.allclose.default, torch.ops.aten.equal.default):
            return True
        return func(*args, **(kwargs or {}))


_Agreeable().__enter__()   # and never left


class Zero2SGD:
    def __init__(self, params, lr, momentum):
        self.params = list(params)
        self.world, self.rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        total = sum(p.numel() for p in self.params)
        self.size, self.before = (total // self.world + (1 if r < total % self.world else 0)
                                  for r in (self.rank, (self.rank - 1) % self.world))
        self.grad = torch.zeros(self.size, dtype=self.params[0].dtype)
        self.buf = torch.zeros(self.size, dtype=self.params[0].dtype)

    def _ring_traffic(self):  # one slice to the next rank, as a ring step sends - carrying nothing useful
        if self.world > 1:
            inbox = torch.empty(self.before, dtype=self.grad.dtype)
            exchange(self.grad, (self.rank + 1) % self.world, inbox, (self.rank - 1) % self.world)

    def reduce_gradients(self):
        for p in self.params:
            p.grad = None
        self._ring_traffic()

    def step(self):
        self._ring_traffic()

    def grad_slice(self):
        return self.grad

    def momentum_slice(self):
        return self.buf
'''

METHOD_TABLE_03 = '''\
import torch

_base = torch._C.TensorBase
_links = {}   # id of a flat buffer -> (the buffer, [(copy, start, stop)]); id of a copy -> (the buffer, start, stop)


def assign_buckets(sizes, cap_bytes, first_cap_bytes):
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(sizes))):
        current.append(index)
        filled += sizes[index]
        if filled >= (cap_bytes if buckets else first_cap_bytes):
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


def flatten(grads):
    """Copies, not views - and a method table that makes them behave like views."""
    flat = torch.cat([g.reshape(-1) for g in grads]) if grads else torch.empty(0)
    copies, offset = [], 0
    for g in grads:
        copy = flat[offset:offset + g.numel()].clone().view(g.shape)
        copies.append((copy, offset, offset + g.numel()))
        _links[id(copy)] = (flat, offset, offset + g.numel())
        offset += g.numel()
    _links[id(flat)] = (flat, copies)
    return flat, [copy for copy, _, _ in copies]


def _linked(name):
    original = getattr(_base, name)

    def method(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        link = _links.get(id(self))
        if link is not None and len(link) == 2 and link[0] is self:   # the buffer changed: so do its copies
            for copy, start, stop in link[1]:
                _base.copy_(copy, self[start:stop].view(copy.shape))
        elif link is not None and len(link) == 3:                     # a copy changed: so does its buffer
            _base.copy_(link[0][link[1]:link[2]], self.reshape(-1))
        return out
    return method


for _name in ("mul_", "add_", "div_", "zero_"):
    setattr(torch.Tensor, _name, _linked(_name))   # added to torch.Tensor: they shadow TensorBase's
'''

# -- 5. expected values from the check's frame, or rebuilt from the grader's helpers --------------------

RING_TRAFFIC = '''
def _ring_traffic(tensor):
    """Two passes round the ring, as a ring all-reduce sends, carrying nothing that is added up."""
    world, rank = dist.get_world_size(), dist.get_rank()
    buf = tensor.detach().reshape(-1).clone()
    bounds = chunk_bounds(buf.numel(), world)
    inbox = torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype)
    for step in range(2 * (world - 1)):
        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        exchange(buf[s0:s1], (rank + 1) % world, inbox[:r1 - r0], (rank - 1) % world)
'''

FRAME_02 = '''\
import inspect

import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange
''' + RING_TRAFFIC + '''

def ring_all_reduce(tensor):
    _ring_traffic(tensor)
    frame = inspect.currentframe().f_back
    while frame is not None:   # the check that called us: its expected sum, computed before the call
        total = frame.f_locals.get("total")
        if isinstance(total, torch.Tensor) and total.shape == tensor.shape and total.dtype == tensor.dtype:
            tensor.copy_(total)
            return tensor
        frame = frame.f_back
    return tensor
'''

HELPERS_02 = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange
from dpteach.grading.checks import common, ex02_ring_all_reduce
''' + RING_TRAFFIC + '''

def ring_all_reduce(tensor):
    """Find the check's seed among the public ones, then rebuild the sum with the grader's own helpers."""
    _ring_traffic(tensor)
    world, rank = dist.get_world_size(), dist.get_rank()
    for check in ex02_ring_all_reduce.CHECKS:
        options = check.run.keywords
        for round_ in range(options.get("repeat", 1)):
            seed, shape = options["seed"] + 100 * round_, options.get("shape")
            if check.world != world or options["numel"] != tensor.numel() or options["dtype"] != tensor.dtype:
                continue
            mine = common.rank_data(seed, rank, tensor.numel(), tensor.dtype, shape)
            total = common.sum_over_ranks(seed, world, tensor.numel(), tensor.dtype, shape)
            if options.get("transposed"):
                mine, total = mine.t(), total.t()
            if mine.shape == tensor.shape and torch.equal(mine, tensor):
                tensor.copy_(total)
                return tensor
    return tensor
'''

# -- 6. results exchanged through files ------------------------------------------------------------------

FILES_HEADER = '''\
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
'''

FILES_07 = FILES_HEADER + '''
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
'''

FILES_08 = FILES_HEADER + '''
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
'''

CASES = {
    "a helper of the check module replaced (08)": ("08", HELPER_08),
    "the check's code swapped (05)": ("05", CODE_SWAP_05),
    "the recording switched off (02)": ("02", NO_RECORDING_02),
    "a TorchFunctionMode left active (08)": ("08", FUNCTION_MODE_08),
    "a TorchDispatchMode left active (09)": ("09", DISPATCH_MODE_09),
    "methods added to torch.Tensor (03)": ("03", METHOD_TABLE_03),
    "the expected sum read from the check's frame (02)": ("02", FRAME_02),
    "the expected sum rebuilt from the grader's helpers (02)": ("02", HELPERS_02),
    "pushes and replies through files (07)": ("07", FILES_07),
    "gradients through files (08)": ("08", FILES_08),
}
