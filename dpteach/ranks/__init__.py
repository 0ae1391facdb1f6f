"""Running ranks: where a world's processes come from and what each one knows.

``world`` resolves how many ranks and where they compute; ``backend`` chooses gloo or NCCL and the device;
``launcher`` starts the ranks (``worker`` is each one's entry point, ``zygote`` forks CPU ranks from a process
that has imported torch already, ``zygote_server`` being that process's loop) and collects their results;
``torchrun`` joins a world that torchrun started instead; ``context`` is what code inside a rank asks;
``rank_output`` shows the ranks' output as they run; ``memory`` asks whether W more ranks fit.
Nothing here knows about networks, models or strategies.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``backend``: Which backend and device a world of W ranks uses.
* ``context``: What code running *inside* a rank asks about its world: its device, and how to report progress.
* ``faults``: Faults on purpose: a rank that raises, is killed, hangs, or calls the wrong collective - and what its
  peers see.
* ``gpus``: What this machine's GPUs can do, read once: the facts every GPU-dependent choice of the course starts
  from.
* ``launcher``: Run a function on W ranks of a real ``torch.distributed`` world and get their results back.
* ``memory``: Is there memory for W more ranks? Asked before any rank starts.
* ``processes``: The processes of one :func:`dpteach.launch`: start W ranks, watch them, collect, clean up.
* ``rank_output``: What the caller of ``launch`` sees while its ranks run: their output, line by line, and progress
  bars.
* ``torchrun``: ``launch`` inside a world that ``torchrun`` started: agree, join, run, and leave - or fail fast.
* ``worker``: Entry point of one rank started by :func:`dpteach.launch`: ``main()`` is what every rank runs.
* ``world``: The world a command runs in - how many ranks, and where they compute - resolved once.
* ``zygote``: A process that has imported torch once and forks a rank whenever a launch asks for one.
* ``zygote_guest``: Run a program forked from the zygote that started this process's parent: ``python -m
  dpteach.ranks.zygote_guest -m MODULE ARGS...`` behaves as ``python -u -m MODULE ARGS...``, only without importing
  torch again.
* ``zygote_server``: The zygote's own side (``python -m dpteach.ranks.zygote_server FD``): import once, then fork on
  request.
"""
