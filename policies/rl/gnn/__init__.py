"""Graph-neural placers that generalize across graphs and machines: GDP (one shot) and Placeto (iterative).

- ``inputs.py``: what the networks see of a problem, nothing tied to op names or to the number of groups
  or devices: group (node), edge, device and (group, device) pair features.
- ``network.py``: the shared encoder (PyTorch Geometric message passing over the group graph, a device
  MLP, a pair scorer) and the two heads.
- ``module.py`` / ``learner.py``: the RLlib module and REINFORCE learner around them.
- ``trainer.py``: sampling, measuring and updating on one problem or a family of problems.
- ``checkpoint.py``: the checkpoint format ``placer train`` writes and ``--init`` reads, checked on load.
- ``policy.py``: the registry policies ``gdp`` and ``placeto``.
"""
