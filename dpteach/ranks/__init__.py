"""Running ranks: where a world's processes come from and what each one knows.

``world`` resolves how many ranks and where they compute; ``backend`` chooses gloo or NCCL and the device;
``launcher`` starts the ranks (``worker`` is each one's entry point, ``zygote`` forks CPU ranks from a process
that has imported torch already, ``zygote_server`` being that process's loop) and collects their results;
``torchrun`` joins a world that torchrun started instead; ``context`` is what code inside a rank asks;
``rank_output`` shows the ranks' output as they run; ``memory`` asks whether W more ranks fit.
Nothing here knows about networks, models or strategies.
"""
