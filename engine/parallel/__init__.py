"""Parallelism: each dimension in its own folder, wrapping or transforming a finished model.

    path     what
    mesh.py  the device mesh: ranks as (dp, pp, cp, tp, ep) coordinates, the process groups of every axis
    data/    data parallelism: DDP and ZeRO 1-3 over the ring, buckets, hybrid sharding;
             by_hand_ddp.py and by_hand_zero1.py are the readable start
    tensor/  tensor and sequence parallelism: a plan that swaps a finished GPT's (or MLP's) layers for
             column/row-parallel and vocab-parallel ones; by_hand_tp.py is the readable start

The model never knows it is distributed (engine/nn.py imports nothing from here or from engine/comm):
a parallelism takes the model and a communicator, both passed in, never global.
"""
