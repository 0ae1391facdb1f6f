"""Exercise 10 as learners write it other than the reference does: the grader must score each for what it does.

* ``PER_RANK_FILES`` - right, without DCP: ``torch.save`` of one file per rank, a marker that rank 0 writes
  once every rank's file is whole, and at another W every old rank's file read and each group's momentum cut
  anew. Full marks: the exercise does not ask for one library.
* ``KEEPS_NEWEST_TWO`` - the same, and rank 0 deletes all but the two newest checkpoints with
  ``shutil.rmtree`` once the new one is whole, as the course's own save does. Full marks: Python's rmtree removes
  files by name relative to an open directory, and that is still inside the rank's scratch folder.
* ``OWN_FILE_ONLY`` - the same, but each rank reads back only the file of the rank it was: right at the same
  W, wrong at another, where the shards are cut differently.
* ``DCP_GATHERED`` - DCP, with every momentum shard first gathered to rank 0. DCP then spreads the model's
  tensors over the other ranks, so each rank writes about as many bytes as an honest one: only what reached
  rank 0 through the process group during the save gives it away.
* ``COURSE_SAVE_BY_NAME`` - the course's own save (``dpteach/training/checkpoint.py``), reached by a name
  built at run time so that no reading of the code finds it: the guard, in the rank that calls it, does.
* ``WRITES_ELSEWHERE`` and ``PATCHES_TRAINING`` - tampering from inside a forked rank: checkpoints written
  outside the rank's scratch folder, and the course's ZeRO-1 replaced in the resumed run.
* ``MARKED_BEFORE_ALL_WROTE`` - per-rank files, but rank 0 marks the checkpoint complete right after its own
  file, without waiting for the others: right until a rank dies while the others save (the hidden checks).
* ``ZERO_FILLED`` - files of the right size that hold zeros where the momentum should be.
* ``READS_THE_GRADER`` - zero-filled files, and on load the uninterrupted run looked for in the grader's memory:
  a frame reached through the standard library (``traceback.walk_tb``), then ``f_back`` and ``f_locals``, which
  raise no audit event.
"""

PER_RANK_FILES = '''\
import os
import torch
import torch.distributed as dist


def save_checkpoint(run, directory, step):
    folder = os.path.join(directory, f"step-{step:06d}")
    os.makedirs(folder, exist_ok=True)
    mine = {"step": step, "world": run.world, "rng": torch.get_rng_state(), "sampler": run.sampler.state_dict(),
            "momentum": [run.optimizer.state[group.shard]["momentum_buffer"] for group in run.groups]}
    if run.rank == 0:
        mine["model"] = run.model.state_dict()
    torch.save(mine, os.path.join(folder, f"rank{run.rank}.pt"))
    dist.barrier()                                   # every rank's file is whole before it counts
    if run.rank == 0:
        open(os.path.join(folder, "complete"), "w").close()


def _pieces(folder, run):
    first = torch.load(os.path.join(folder, "rank0.pt"), weights_only=False)
    return [first] + [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False)
                      for r in range(1, first["world"])]


def load_checkpoint(run, directory):
    done = sorted(name for name in os.listdir(directory) if os.path.exists(os.path.join(directory, name, "complete")))
    if not done:
        return 0
    old = _pieces(os.path.join(directory, done[-1]), run)
    run.model.load_state_dict(old[0]["model"])
    for i, group in enumerate(run.groups):
        numel, n = sum(p.numel() for p in group.params), group.shard_numel
        padded = torch.zeros(n * run.world)
        padded[:numel] = torch.cat([piece["momentum"][i] for piece in old])[:numel]
        run.optimizer.state[group.shard]["momentum_buffer"] = padded[run.rank * n:(run.rank + 1) * n].clone()
    if run.rank < len(old):
        torch.set_rng_state(old[run.rank]["rng"])
    run.sampler.load_state_dict(old[0]["sampler"])
    return old[0]["step"]
'''

KEEPS_NEWEST_TWO = PER_RANK_FILES.replace('''import os
''', '''import os
import shutil
''').replace('''        open(os.path.join(folder, "complete"), "w").close()
''', '''        open(os.path.join(folder, "complete"), "w").close()
        done = sorted(name for name in os.listdir(directory) if name.startswith("step-"))
        for old in done[:-2]:                        # keep the newest two, as the course's own save does
            shutil.rmtree(os.path.join(directory, old))
''')

OWN_FILE_ONLY = PER_RANK_FILES.replace('''    for i, group in enumerate(run.groups):
        numel, n = sum(p.numel() for p in group.params), group.shard_numel
        padded = torch.zeros(n * run.world)
        padded[:numel] = torch.cat([piece["momentum"][i] for piece in old])[:numel]
        run.optimizer.state[group.shard]["momentum_buffer"] = padded[run.rank * n:(run.rank + 1) * n].clone()
''', '''    for i, group in enumerate(run.groups):            # the rank it was, whatever W is now
        run.optimizer.state[group.shard]["momentum_buffer"] = old[min(run.rank, len(old) - 1)]["momentum"][i]
''')

DCP_GATHERED = '''\
import os
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def save_checkpoint(run, directory, step):
    state = {"step": step, "model": run.model.state_dict(), "sampler": run.sampler,
             f"rng/{run.rank}": torch.get_rng_state()}
    for i, group in enumerate(run.groups):              # every shard collected on rank 0
        pieces = [torch.empty_like(group.shard) for _ in range(run.world)] if run.rank == 0 else None
        dist.gather(run.optimizer.state[group.shard]["momentum_buffer"], pieces, dst=0)
        if run.rank == 0:
            state[f"momentum/{i}"] = torch.cat(pieces)[:sum(p.numel() for p in group.params)]
    dcp.save(state, checkpoint_id=os.path.join(directory, f"step-{step:06d}"))


def load_checkpoint(run, directory):
    whole = [name for name in os.listdir(directory)
             if name.startswith("step-") and os.path.exists(os.path.join(directory, name, ".metadata"))]
    if not whole:
        return 0
    path = os.path.join(directory, max(whole))
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = {"step": 0, "model": run.model.state_dict(), "sampler": run.sampler}
    if f"rng/{run.rank}" in saved:
        state[f"rng/{run.rank}"] = torch.get_rng_state()
    for i, group in enumerate(run.groups):
        state[f"momentum/{i}"] = torch.zeros(sum(p.numel() for p in group.params))
    dcp.load(state, checkpoint_id=path)
    for i, group in enumerate(run.groups):
        n, momentum = group.shard_numel, state[f"momentum/{i}"]
        padded = torch.zeros(n * run.world)
        padded[:momentum.numel()] = momentum
        run.optimizer.state[group.shard]["momentum_buffer"] = padded[run.rank * n:(run.rank + 1) * n].clone()
    if f"rng/{run.rank}" in state:
        torch.set_rng_state(state[f"rng/{run.rank}"])
    return state["step"]
'''

COURSE_SAVE_BY_NAME = PER_RANK_FILES.replace('''def save_checkpoint(run, directory, step):
''', '''def save_checkpoint(run, directory, step):
    import importlib
    course = importlib.import_module("dpteach.training." + "check" + "point")   # read, then called: forbidden
    getattr(course, "save_" + "checkpoint")(run, directory, step)
''')

# Tampering, from inside the ranks the grader forks: each scores 0, and the report says what it did.
WRITES_ELSEWHERE = PER_RANK_FILES.replace(
    '''    folder = os.path.join(directory, f"step-{step:06d}")''',
    '''    folder = os.path.join("/tmp", f"dpteach-ex10-elsewhere-{step:06d}")   # past the scratch folder''')

PATCHES_TRAINING = PER_RANK_FILES.replace('''def load_checkpoint(run, directory):
''', '''def load_checkpoint(run, directory):
    import dpteach.sync.zero1
    dpteach.sync.zero1.Zero1.step_optimizer = lambda self, optimizer: None   # no step after the resume
''')


MARKED_BEFORE_ALL_WROTE = PER_RANK_FILES.replace('''    dist.barrier()                                   # every rank's file is whole before it counts
''', '''''')

ZERO_FILLED = PER_RANK_FILES.replace(
    '''"momentum": [run.optimizer.state[group.shard]["momentum_buffer"] for group in run.groups]}''',
    '''"momentum": [torch.zeros_like(run.optimizer.state[group.shard]["momentum_buffer"]) for group in run.groups]}''')

READS_THE_GRADER = ZERO_FILLED.replace('''def load_checkpoint(run, directory):
''', '''def _uninterrupted_run():
    import traceback
    try:
        raise LookupError
    except LookupError as error:
        frame = next(traceback.walk_tb(error.__traceback__))[0]   # the standard library hands the frame over
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, list) and value and isinstance(value[0], dict) and "at" in str(value[0].get("result")):
                return value                                     # the ranks' messages of the uninterrupted run
        frame = frame.f_back
    return None


def load_checkpoint(run, directory):
    found = _uninterrupted_run()
    if found is not None:
        at = found[run.rank % len(found)]["result"]["at"]
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(at["weights"], run.model.parameters())
''')
