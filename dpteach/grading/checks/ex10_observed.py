"""Exercise 10's story, told once per check: three worlds of ranks, and what they saw, as data.

A check of exercise 10 (``ex10_checkpoint.py``) drives one story on real ranks (``grading/forked_worlds.py``) and
judges what it observed: the uninterrupted run; the same run with the learner's save every few steps,
until its victim is killed; a fresh run, perhaps on another W, that calls the learner's load and trains on
(the runs themselves are ``ex10_runs.py``). :func:`observed` returns what the check compares, as tensors and
numbers: that is what the rank records, and what the judge, outside the ranks, judges again.

Every call of the learner's code, in whichever rank, is watched as anywhere in the grader
(``ctx.running_learner_code``: the guard, the seal, the audit hook) and, after it, the course's modules
the runs train with are compared with their picture (``ex10_runs.training_changed``). Around each save the
kernel counts what the rank wrote to files and what reached it through its sockets (:func:`bytes_out`):

**Bytes written.** ``/proc/self/io``'s ``wchar`` counts every byte a process hands to ``write()`` - to
files, pipes and sockets alike, gloo's included (gloo writes its sockets with ``writev``; a ``send`` is not
counted there). So what a rank wrote to disk during a save is the growth
of ``wchar`` less what it put on its sockets meanwhile: the kernel's count, ``TCP_INFO``'s bytes acked
plus what still waits in the send queue. The same count of what reached its sockets (``network/traffic.py`` reads
it for the other exercises) says whether a rank gathered its peers' shards during its save. Where there is
no ``/proc``, None.

The try cell tells the same story on ranks that ``dpteach.launch`` starts (:func:`try_resume`).
"""
from __future__ import annotations

import array
import os
import shutil
import signal
import socket
import stat
import struct
import tempfile
from contextlib import contextmanager

try:
    import fcntl
except ImportError:  # not on Windows; the course's ranks need fork anyway
    fcntl = None

import torch
import torch.distributed as dist

from ..guard import ForbiddenCall
from ..learner import Tampered
from ..spec import observes
from .ex10_runs import Scenario, killed, plain, resumed, training_changed
from .ex10_trainer import Sampler
from ..forked_worlds import check_world_set_aside, run_world

ACKED_AT, RECEIVED_AT = 120, 128  # offsets of tcpi_bytes_acked and tcpi_bytes_received in Linux's struct tcp_info
SIOCOUTQ = 0x5411  # bytes in a socket's send queue, not yet acknowledged (TIOCOUTQ)


@observes
def observed(ctx, spec: Scenario, resume: bool = True) -> dict:
    """The three runs of ``spec`` on real ranks (only the killed one when not ``resume``), as data."""
    save, load = ctx.learner("save_checkpoint"), ctx.learner("load_checkpoint")
    ctx.hand(Sampler.state_dict)  # the learner's code calls these, and DCP does on its behalf
    ctx.hand(Sampler.load_state_dict)

    def unchanged():
        changed = training_changed()
        if changed:
            raise Tampered(f"your code replaced {', '.join(changed[:3])}, which the grader trains with")

    def saving(run, directory, step, strike_at=None, strike=None):
        """The learner's save, measured; with ``strike_at``, ``strike()`` kills this rank at that file write."""
        writes = [0]

        def counted(event, builtin):
            if event == "c_call" and file_write(builtin):
                writes[0] += 1
                if writes[0] == strike_at:
                    strike()

        if strike_at == 0:
            strike()
        before = bytes_out()
        ctx.guard.watch_c_calls(counted)
        try:
            with ctx.running_learner_code():
                save(run, directory, step)
        finally:
            ctx.guard.unwatch_c_calls(counted)
        unchanged()
        return (*since(before), writes[0])

    def loading(run, directory):
        with ctx.running_learner_code():
            step = load(run, directory)
        unchanged()
        return step

    directory = tempfile.mkdtemp(prefix="checkpoints-")  # in this rank's scratch folder: tampering.py
    try:
        # The uninterrupted run comes last: the ranks that run the learner's code are forked from this one, and
        # what they could find in its memory (frames reached through the standard library, say) must not hold
        # the run they are compared with. Earlier checks' runs are gone with their checks (in_rank.py).
        with check_world_set_aside() as address, _forbidden_calls_noted(ctx):
            died = run_world(address, spec.before, killed, spec, directory, saving, loading, victim=spec.victim,
                             name="the run that is killed")
            back = (run_world(address, spec.after, resumed, spec, directory, loading, name="the resumed run")
                    if resume else None)
            first = run_world(address, spec.before, plain, spec, name="the uninterrupted run") if resume else None
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return _summary(first, died, back)


@contextmanager
def _forbidden_calls_noted(ctx):
    """A forbidden call in a child was noted by the child's copy of the guard; the report reads this rank's."""
    try:
        yield
    except ForbiddenCall as call:
        ctx.guard.calls.append(str(call).split(" is not allowed")[0])
        raise


def _joined(snapshots) -> torch.Tensor | None:
    """Every group's momentum, unpadded, from every rank's piece; None if a rank holds none for some group."""
    pieces = [s["momentum"] for s in snapshots]
    if any(piece is None for rank in pieces for piece in rank):
        return None
    return torch.cat([torch.cat([rank[g] for rank in pieces]) for g in range(len(pieces[0]))] + [torch.zeros(0)])


def _summary(plain, killed, back) -> dict:
    saves, holds = {}, {}
    for rank, seen in enumerate(killed):
        for save in seen["saved"]:
            saves.setdefault(save["step"], [None] * len(killed))[rank] = save["bytes"]
            holds.setdefault(save["step"], [None] * len(killed))[rank] = save["holds"]
    shards = [seen["saved"][0]["shard"] if seen["saved"] else 0 for seen in killed]
    summary = {"saves": [[step, saves[step]] for step in sorted(saves)], "shard_bytes": shards,
               "holds": [[step, holds[step]] for step in sorted(holds)],
               "model_bytes": killed[0]["saved"][0]["model"] if killed[0]["saved"] else 0}
    if plain is None:
        return summary
    at = [seen["result"]["at"] for seen in plain]
    loaded = [seen["result"]["loaded"] for seen in back]
    summary["plain"] = {"weights": at[0]["weights"], "momentum": _joined(at), "rng": [s["rng"] for s in at],
                        "sampler": [s["sampler"] for s in at], "final": plain[0]["result"]["final"]}
    summary["resumed"] = {
        "from": [seen["result"]["from"] for seen in back], "weights": loaded[0]["weights"],
        "agree": all(torch.equal(s["weights"], loaded[0]["weights"]) for s in loaded),
        "in_place": all(s["in_place"] for s in loaded), "momentum": _joined(loaded),
        "problems": [f"on rank {rank}, {problem}" for rank, s in enumerate(loaded) for problem in s["problems"]],
        "rng": [s["rng"] for s in loaded], "sampler": [s["sampler"] for s in loaded],
        "final": back[0]["result"]["final"]}
    return summary


# --- what a rank writes, and receives ----------------------------------------------------------------

WRITERS = ("write", "writelines", "write_record", "dump")  # file.write(...), torch.save's zip records, pickle.dump


def file_write(builtin) -> bool:
    """Whether the learner's code is calling a C function that writes to a file: a file object's ``write``
    (``open(...)``, DCP's streams), a record of ``torch.save``'s zip writer, ``pickle.dump``. What such calls
    make the kernel do is counted by :func:`bytes_out`; this counts the calls, so that a kill can land in the
    middle of a save (``ex10_runs.Scenario``'s ``"in save"``)."""
    if getattr(builtin, "__name__", None) not in WRITERS:
        return False
    owner = getattr(builtin, "__self__", None)
    if builtin.__name__ in ("write_record", "dump"):
        return True
    try:
        return stat.S_ISREG(os.fstat(owner.fileno()).st_mode)
    except (AttributeError, OSError, ValueError, TypeError):
        return False

def bytes_out():
    """(bytes handed to write() so far, {socket: (bytes put on it, bytes received on it)}) for this process;
    None without /proc."""
    try:
        with open("/proc/self/io", encoding="ascii") as handle:
            wchar = next(int(line.split()[1]) for line in handle if line.startswith("wchar:"))
        names = os.listdir("/proc/self/fd")
    except (OSError, StopIteration):
        return None
    sockets = {}
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            sockets[target] = _counts(int(name))
    return wchar, sockets


def since(before) -> tuple:
    """(bytes written to files, bytes received on sockets) by this process since ``before`` (:func:`bytes_out`):
    the files' share is what it wrote, less what went on its sockets. (None, None) where it cannot be measured."""
    after = bytes_out()
    if before is None or after is None:
        return None, None
    sent = received = 0
    for target, (put, got) in after[1].items():
        was = before[1].get(target, (0, 0))
        sent, received = sent + put - was[0], received + got - was[1]
    return max(0, after[0] - before[0] - sent), received


def _counts(fd: int) -> tuple:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return 0, 0
    with sock:
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except (OSError, AttributeError):  # not a TCP socket
            return 0, 0
        if len(info) < RECEIVED_AT + 8:
            return 0, 0
        acked, received = struct.unpack_from("QQ", info, ACKED_AT)
        queued = array.array("i", [0])
        try:
            fcntl.ioctl(sock.fileno(), SIOCOUTQ, queued)
        except (OSError, AttributeError):
            pass
        return acked + queued[0], received


# --- the try cell: the same story on ranks that dpteach.launch starts -----------------------------------

def _first_life(spec, directory, save, load):
    final = plain(None, spec)["final"]
    if dist.get_rank() == 0:
        torch.save(final, os.path.join(directory, "uninterrupted.pt"))
    dist.barrier()

    def saving(run, folder, step, strike_at=None, strike=None):  # as the grader's, but nothing is measured
        save(run, folder, step)
        return None, None, 0

    killed(lambda *_: None, spec, os.path.join(directory, "checkpoints"), saving, load)


def try_resume(save_checkpoint, load_checkpoint, before: int = 2, after: int = 2, every: int = 2, kill: int = 5,
               steps: int = 8) -> float:
    """Run your functions as ``check("10")`` does, on ranks ``dpteach.launch`` starts, and print what happened:
    a run on ``before`` ranks killed for real before step ``kill``, resumed on ``after`` ranks. Returns the
    largest difference from the uninterrupted run's weights (0.0 at the same W; within 1e-5 at another)."""
    from ...ranks.launcher import RankError, launch
    spec = Scenario(before, after, every, kill, steps, noise=0.5 if before == after else 0.0, seed=7).check()
    directory = tempfile.mkdtemp(prefix="dpteach-ex10-")
    os.makedirs(os.path.join(directory, "checkpoints"))
    try:
        launch(_first_life, before, args=(spec, directory, save_checkpoint, load_checkpoint), backend="gloo",
               device="cpu", timeout=120, show_output=False)
    except RankError as err:
        if err.rank != spec.victim or err.exit_code != -signal.SIGKILL:
            raise
    left = sorted(os.listdir(os.path.join(directory, "checkpoints")))
    print(f"{before} ranks trained, saving every {every} steps; rank {spec.victim} was killed (SIGKILL) just before "
          f"step {kill}, leaving: {', '.join(left) or 'nothing'}")
    result = launch(resumed, after, args=(None, spec, os.path.join(directory, "checkpoints"), load_checkpoint),
                    backend="gloo", device="cpu", timeout=120, show_output=False)[0]
    print(f"resumed on {after} rank{'s' if after > 1 else ''}: load_checkpoint returned step {result['from']} "
          f"(the newest checkpoint before the kill is step {spec.resume_at})")
    if result["final"] is None:
        print("the resumed run did not go on: some rank returned another step, or its optimizer state is not usable")
        return float("inf")
    gap = (result["final"] - torch.load(os.path.join(directory, "uninterrupted.pt"))).abs().max().item()
    print(f"largest difference from the uninterrupted run's weights after step {steps}: {gap:g}")
    return gap
