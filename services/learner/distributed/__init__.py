"""Data-parallel learner ranks: rank 0 owns the run, followers train on the shards it ships them."""
