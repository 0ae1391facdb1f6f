"""Exercise 02 solutions for the grader's hints: each is wrong (or right) in a way whose hint is known."""
from .styles import solution

CORRECT = solution("02", "exchange")

# The all-gather starts one chunk early (both indices off by one, so sizes still match): it passes round
# a chunk that is not finished yet, and some chunks end right, others wrong.
OFF_BY_ONE = CORRECT.replace("""        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        _swap(buf[s0:s1], (rank + 1) % world, buf[r0:r1]""", """        s0, s1 = bounds[(rank - step - 1) % world]
        r0, r1 = bounds[(rank - step - 2) % world]
        _swap(buf[s0:s1], (rank + 1) % world, buf[r0:r1]""")

# The all-gather stops one step short: each rank's own finished chunks are right, the last one to
# arrive is missing.
ONE_STEP_SHORT = CORRECT.replace("""    for step in range(world - 1):
        s0, s1 = bounds[(rank - step) % world]""", """    for step in range(world - 2):
        s0, s1 = bounds[(rank - step) % world]""")

# Right sum in a flat copy, returned, but never copied back into the caller's tensor.
NO_COPY_BACK = CORRECT.replace("    tensor.copy_(buf.view(tensor.shape))\n    return tensor",
                               "    return buf.view(tensor.shape)")

# A correct ring on another schedule: rank r ends the reduce-scatter owning chunk r+1, not chunk r.
SHIFTED = CORRECT.replace("""        s0, s1 = bounds[(rank - step - 1) % world]
        r0, r1 = bounds[(rank - step - 2) % world]""", """        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]""").replace("""        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        _swap(buf[s0:s1], (rank + 1) % world, buf[r0:r1]""", """        s0, s1 = bounds[(rank - step + 1) % world]
        r0, r1 = bounds[(rank - step) % world]
        _swap(buf[s0:s1], (rank + 1) % world, buf[r0:r1]""")

# Hangs on three ranks: every rank waits for a message nobody sends.
HANGS_ON_THREE = CORRECT.replace("    world, rank = dist.get_world_size(), dist.get_rank()\n",
                                 "    world, rank = dist.get_world_size(), dist.get_rank()\n"
                                 "    if world == 3:\n"
                                 "        dist.recv(torch.empty(1), (rank - 1) % world)\n", 1)

for name, text in {"OFF_BY_ONE": OFF_BY_ONE, "ONE_STEP_SHORT": ONE_STEP_SHORT, "NO_COPY_BACK": NO_COPY_BACK, "SHIFTED": SHIFTED,
                   "HANGS_ON_THREE": HANGS_ON_THREE}.items():
    assert text != CORRECT, f"{name} did not change the correct ring: RING_02 was edited?"
