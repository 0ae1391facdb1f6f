"""One rank's replica: what it trains and what it records on the way.

``models`` and ``data`` (what is trained, and how a batch is split between ranks), ``precision`` (a 16-bit
forward pass and fp16's loss scale), ``buckets`` (gradients packed into a few flat buffers),
``timeline`` (what the rank did, and when), ``model_states`` (what parameters, gradients and optimizer state
cost per rank), ``sizing`` (which model fits where the ranks compute), and ``build`` (what every trainer sets
up on a rank and reports at the end). The strategies (``dpteach.sync``) are built on these.
"""
