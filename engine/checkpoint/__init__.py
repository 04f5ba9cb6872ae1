"""Checkpoints: sharded save and restore at any world size, ZeRO stage and tensor-parallel degree, and what
is built on them.

    file            what
    sharded.py      save every rank's shard; restore at any world size, ZeRO stage, TP degree or precision
    reshard.py      tensor-parallel shards joined into the dense model's arrays, and cut for any degree
    files.py        the files on disk: durable atomic writes, shard files, manifests, finding, pruning
    schema.py       what a manifest and a shard must hold, checked before anything uses them
    resume.py       what a resumed run is: the recorded config (plus overrides) and a verified checkpoint
    export.py       one consolidated fp32 model file (.npz) from a checkpoint
    sample.py       text from a trained GPT: encode a prompt, sample, decode
"""
