"""Post (Gao, Chen, Li, NeurIPS 2018): cross-entropy minimization interleaved with PPO on a factorized policy."""
