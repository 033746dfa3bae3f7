"""Training data preparation (never imported by inference): corpus readers, validation, feature extractors,
safetensors shards and the dataset the training stages read.

``prepare(corpus, layout, out)`` / ``cadenza data prepare`` builds a corpus folder; ``ShardDataset(out, fields)``
reads it.
"""
