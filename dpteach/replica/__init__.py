"""One rank's replica: what it trains and what it records on the way.

``models`` and ``data`` (what is trained, and how a batch is split between ranks), ``precision`` (a 16-bit
forward pass and fp16's loss scale), ``buckets`` (gradients packed into a few flat buffers),
``timeline`` (what the rank did, and when), ``model_states`` (what parameters, gradients and optimizer state
cost per rank), ``sizing`` (which model fits where the ranks compute), and ``build`` (what every trainer sets
up on a rank and reports at the end). The strategies (``dpteach.sync``) are built on these.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``activations``: Activation memory, measured: what one forward pass keeps for backward, and what checkpointing
  keeps instead.
* ``buckets``: Gradient buckets: many small all-reduces become a few large ones.
* ``build``: What every trainer sets up on a rank, and what it reports when it is done.
* ``data``: Synthetic data for the course's models, and the rules that split it between ranks.
* ``model_states``: What model states cost per rank: the ZeRO paper's arithmetic, for any model size and world.
* ``models``: The models the lessons train: three sized for a laptop's CPU, and a transformer family sized for GPUs.
* ``precision``: Mixed precision on one rank: a 16-bit forward pass, a dynamic loss scale for fp16, clipping.
* ``sizing``: Which model a run trains when the learner leaves ``model="auto"``: one sized for where its ranks
  compute.
* ``timeline``: What each rank did, and when: spans for forward, backward, each bucket's communication, optimizer.
* ``trace``: A run's timelines as a trace file that Perfetto, ``chrome://tracing`` and Holistic Trace Analysis open.
"""
