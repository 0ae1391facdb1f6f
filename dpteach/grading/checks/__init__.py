"""The exercises' checks, one module per exercise (``exNN_*.py``), each defining ``EXERCISE``.

``common.py`` holds what several exercises share: per-rank test data whose sums are exact in every
dtype, and helpers that turn a wrong return value into a message for people.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``common``: What several exercises' checks share: test data, and turning a wrong answer into a message.
* ``ex01_ring_pieces``: Exercise 01: ring reduce-scatter and ring all-gather, from send and receive only.
* ``ex02_ring_all_reduce``: Exercise 02: a complete ring all-reduce, in place, for any shape and dtype.
* ``ex03_buckets``: Exercise 03: bucket assignment by the course's simple rule (after DDP's), and flat buffers with
  a view per gradient.
* ``ex04_overlap``: Exercise 04: the overlap hook - launch each bucket's all-reduce from backward, wait before the
  step.
* ``ex04_steps``: Exercise 04's backward passes: the models, the learner's OverlapSync driven through real steps,
  and what each step is judged on (``ex04_overlap.py`` holds the exercise's text and its list of checks).
* ``ex05_accumulation``: Exercise 05: gradient accumulation - no_sync() decided before forward, the loss divided by
  K.
* ``ex06_int8``: Exercise 06: 8-bit quantisation with one scale per chunk, and error feedback.
* ``ex07_parameter_server``: Exercise 07 (stretch): an asynchronous parameter server that drops stale pushes.
* ``ex07_server_log``: Exercise 07's judging of the server's log (``ex07_parameter_server.py`` holds the exercise
  and its checks): the log must be consistent - every push answered once, each worker computing on the version the
  server last sent it, a push dropped exactly when it is too stale - and replaying it, every applied gradient
  recomputed on the weights of the version its worker used, must end on the server's own final weights.
* ``ex08_zero1``: Exercise 08 (stretch): ZeRO stage 1 - each rank keeps the optimizer state of its own slice only.
* ``ex09_steps``: Exercise 09's steps: the learner's Zero2SGD driven through real steps, and what each step is
  judged on (``ex09_zero2.py`` holds the exercise's text and its list of checks).
* ``ex09_zero2``: Exercise 09 (stretch): ZeRO stage 2 - the gradients are sharded as well as the optimizer state.
* ``ex10_checkpoint``: Exercise 10: checkpoint and resume - a ZeRO-1 run killed for real goes on as if nothing had
  happened.
* ``ex10_observed``: Exercise 10's story, told once per check: three worlds of ranks, and what they saw, as data.
* ``ex10_runs``: Exercise 10's three runs, each the body of one world's ranks: uninterrupted, killed, resumed - and
  the fault plan a check gives them (``Scenario``: where and when the victim dies).
* ``ex10_trainer``: Exercise 10's training, as one rank runs it: what a rank holds at step s, and the same run in
  one process.
* ``ex11_quantized_all_gather``: Exercise 11: a block-quantised all-gather - ZeRO++'s qwZ, every rank's shard sent
  as int8 with a scale per block.
"""
