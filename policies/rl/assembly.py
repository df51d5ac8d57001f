"""The RLlib side of a learner: a Learner built alone in this process (no EnvRunners) for the seq2seq or
the factorized module with the REINFORCE or PPO loss, its learning-rate schedule, and plain floats out of its metrics."""

from __future__ import annotations

import math

import numpy as np

from policies.rl.config import RLConfig
from policies.rl.env import PlacementEnv


def module_class(name: str):
    """The RLModule class of ``RLConfig.module``: 'seq2seq' or 'factorized' (Post's per-group table)."""
    if name == "factorized":
        from policies.rl.post.module import FactorizedPlacer
        return FactorizedPlacer
    from policies.rl.seq2seq.module import Seq2SeqPlacer
    return Seq2SeqPlacer


def build_learner(env: PlacementEnv, config: RLConfig):
    """An RLlib Learner (in this process) for ``config.module``'s module with the chosen loss."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    if config.trainer == "ppo":
        from ray.rllib.algorithms.ppo import PPOConfig
        # The critic's squared error is not clipped: a failure scores up to 3x the slowest step measured
        # (policies/rl/env.py), so no fixed clip bounds it, and a clipped error teaches the critic nothing.
        algo_config = PPOConfig().training(clip_param=config.ppo_clip, vf_loss_coeff=config.vf_loss_coeff,
                                           entropy_coeff=config.entropy_coeff, use_kl_loss=False,
                                           vf_clip_param=math.inf)
    else:
        from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

        from policies.rl.reinforce import ReinforceLearner
        algo_config = AlgorithmConfig().learners(
            learner_class=ReinforceLearner,
            learner_config_dict={"baseline_decay": config.baseline_decay, "entropy_coeff": config.entropy_coeff,
                                 "batch_baseline": config.batch_baseline,
                                 "normalize_advantages": config.normalize_advantages,
                                 "rank_advantages": config.rank_advantages})
    model_config = {"hidden_size": config.hidden_size, "tanh_constant": config.tanh_constant,
                    "temperature": config.temperature, "logit_noise_std": config.logit_noise_std, "uniform_mix": config.uniform_mix}
    algo_config = (algo_config.framework("torch")
                   .training(lr=lr_schedule(config), grad_clip=config.grad_clip, grad_clip_by="global_norm")
                   .learners(num_learners=0)
                   .debugging(seed=config.seed))
    # What AlgorithmConfig.build_learner does, with the module spec given whole (the base config, used for
    # REINFORCE, has no default module spec to merge it into).
    module_spec = MultiRLModuleSpec(rl_module_specs={DEFAULT_MODULE_ID: RLModuleSpec(
        module_class=module_class(config.module), observation_space=env.observation_space, action_space=env.action_space,
        model_config=model_config)})
    learner = algo_config.learner_class(config=algo_config, module_spec=module_spec)
    learner.build()
    return learner


def lr_schedule(config: RLConfig) -> list[list[float]] | float:
    """The paper's staircase decay as RLlib [[iteration, lr], ...] points (linear between them)."""
    lr = config.learning_rate
    if config.lr_decay >= 1.0:
        return lr
    points = [[0, lr], [config.lr_decay_start, lr]]
    for k in range(1, 60):
        points.append([config.lr_decay_start + k * config.lr_decay_every, lr * config.lr_decay ** k])
    return points


def summarize_update(results: dict, module_id: str, trainer: str, batch: dict) -> dict[str, float]:
    """Plain floats out of the Learner's reduced metrics."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY
    stats = results.get(module_id, {})

    def value(key: str) -> float:
        return metric_value(stats, key)

    baseline = (value("reward_baseline") if trainer == "reinforce"
                else float(np.mean(batch[Columns.VF_PREDS])))
    return {"loss": value("total_loss"), "policy_loss": value(POLICY_LOSS_KEY), "entropy": value(ENTROPY_KEY),
            "baseline": baseline}


def standalone_learner(learner_class, module_class, model_config: dict, spaces: dict, *, lr: float,
                       grad_clip: float, seed: int, learner_config: dict):
    """An RLlib TorchLearner alone in this process (no EnvRunners) around one custom module whose train
    pass reads its own batch keys (``spaces`` are nominal): the hierarchical and graph-neural placers'."""
    import torch
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    algo_config = (AlgorithmConfig()
                   .learners(learner_class=learner_class, num_learners=0, learner_config_dict=learner_config)
                   .framework("torch")
                   .training(lr=lr, grad_clip=grad_clip, grad_clip_by="global_norm")
                   .debugging(seed=seed))
    module_spec = MultiRLModuleSpec(rl_module_specs={DEFAULT_MODULE_ID: RLModuleSpec(
        module_class=module_class, model_config=model_config, **spaces)})
    torch.manual_seed(seed)
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    learner = algo_config.learner_class(config=algo_config, module_spec=module_spec)
    learner.build()  # RLlib's seeding turns torch's deterministic algorithms on for the whole process:
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)  # the caller decides (loop.deterministic_torch)
    return learner


def update_on_batch(learner, batch: dict[str, np.ndarray], iteration: int, keys: dict[str, str]) -> dict[str, float]:
    """One ``learner.update`` on a ready batch of row-aligned arrays; the reduced metrics named by ``keys``
    (output name -> the learner's metric key) as plain floats (nan when the learner logged none)."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    size = len(next(iter(batch.values())))
    results = learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=size),
                             timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: iteration + 1})
    stats = results.get(DEFAULT_MODULE_ID, {})
    return {name: metric_value(stats, key) for name, key in keys.items()}


def metric_value(stats: dict, key: str, default: float = math.nan) -> float:
    """A reduced RLlib metric (a Stats object or a value) as a float, averaged; ``default`` when absent."""
    item = stats.get(key)
    if item is None:
        return default
    item = item.peek() if hasattr(item, "peek") else item
    return float(np.asarray(item, dtype=np.float64).mean())
