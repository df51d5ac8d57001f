"""HSDAG (Duan et al., NeurIPS 2024, "A structure-aware framework for learning device placements on
computation graphs"): a placer that chooses its own groups, then a device per group.

    units (colocation groups: the registry gives it ``at_op_level``) ─GraphEncoder─▶ embeddings (G, H)
    edge MLP over (both ends' embeddings, edge features) ─▶ merge probability per unit edge (M,)
    graph parsing: one Bernoulli merge decision per edge; connected components of the merged edges are
        the groups (K of them: an outcome of the sample, not a setting)
    group embedding = mean of its members'; PairScorer over the members' mean pair features ─▶ (K, D)
    one device per group (allowed devices only); REINFORCE on the measured step time

- ``config.py``: ``HsdagConfig``, the settings.
- ``parser.py``: ``HsdagNet`` (the gnn package's encoder, device MLP and pair scorer plus the edge
  scorer), sampling a parse and its devices, the log-probability of a sample.
- ``trainer.py``: ``HsdagTrainer``, batches, advantages, updates, imitation of a warm start.
- ``policy.py``: ``HsdagPolicy``, the registry policy ``hsdag``.
"""
