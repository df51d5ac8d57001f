"""Post (Gao, Chen, Li, NeurIPS 2018) as a registry policy: ``post`` (policies/registry.py).

Post learns independent per-group device distributions (``policies.rl.post.module.FactorizedPlacer``)
with PPO (RLlib's PPO learner), and every ``ce_every`` iterations fits them to the elite placements of
the last ``ce_window`` batches plus the best so far: cross-entropy minimization, done by the same
imitation routine that fits a warm start (``_Trainer.imitate``). Options are ``RLConfig`` fields, as for
``reinforce``/``ppo``; ``hidden_size`` is accepted and unused by the factorized module. ``context`` and
``warm_start`` work as for the seq2seq policies.
"""

from __future__ import annotations

from policies.rl.seq2seq.policy import ReinforcePolicy

POST_DEFAULTS = {
    "module": "factorized",
    "ce_every": 1,  # tuned on nmt-4 / paper-4gpu (report of issue 13)
    "ce_steps": 5,
    "elite_fraction": 0.1,
    "ce_window": 4,
    "entropy_coeff": 0.0,
    "logit_noise_std": 0.0,
    "lr_decay": 1.0,
    "imitation_target_prob": 0.4,  # a softer prior: at 0.9 the factorized policy searched only near the start
}


class PostPolicy(ReinforcePolicy):
    name = "post"
    trainer = "ppo"
    defaults = POST_DEFAULTS
