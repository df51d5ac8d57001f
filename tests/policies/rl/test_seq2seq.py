"""The seq2seq RLModule alone (no Ray started): shapes, exact log-probabilities, masking, seeding."""

from __future__ import annotations

import os

os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from ray.rllib.core.columns import Columns  # noqa: E402

from policies.rl.seq2seq.module import MASKED_LOGIT, Seq2SeqPlacer  # noqa: E402

G, D, F = 7, 3, 4


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(one_torch_thread):
    """Every test here runs on one torch thread (see conftest)."""


def _module(hidden_size: int = 16, noise: float = 0.0, seed: int = 0) -> Seq2SeqPlacer:
    torch.manual_seed(seed)
    return Seq2SeqPlacer(observation_space=gym.spaces.Box(-1e6, 1e6, (G, F + D), np.float32),
                         action_space=gym.spaces.MultiDiscrete([D] * G),
                         model_config={"hidden_size": hidden_size, "logit_noise_std": noise})


def _obs(batch: int = 5, allowed: np.ndarray | None = None) -> torch.Tensor:
    rng = np.random.default_rng(1)
    features = rng.normal(size=(G, F)).astype(np.float32)
    allowed = np.ones((G, D), np.float32) if allowed is None else allowed.astype(np.float32)
    return torch.from_numpy(np.repeat(np.concatenate([features, allowed], axis=1)[None], batch, axis=0))


def _train_logp(module: Seq2SeqPlacer, obs: torch.Tensor, actions: torch.Tensor):
    out = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: actions})
    dist = module.get_train_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
    return dist, dist.logp(actions)


def test_seq2seq__exploration_outputs_have_rllib_shapes():
    module = _module()
    out = module.forward_exploration({Columns.OBS: _obs(5)}, generator=torch.Generator().manual_seed(0))
    assert out[Columns.ACTIONS].shape == (5, G) and out[Columns.ACTIONS].dtype == torch.int64
    assert out[Columns.ACTION_LOGP].shape == (5,)
    assert out[Columns.ACTION_DIST_INPUTS].shape == (5, G * D)
    assert ((out[Columns.ACTIONS] >= 0) & (out[Columns.ACTIONS] < D)).all()
    assert module.compute_values({Columns.OBS: _obs(5)}).shape == (5,)


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_seq2seq__train_pass_reproduces_sampling_logp_exactly(noise):
    module = _module(noise=noise)
    obs = _obs(6)
    out = module.forward_exploration({Columns.OBS: obs}, generator=torch.Generator().manual_seed(3))
    _, logp = _train_logp(module, obs, out[Columns.ACTIONS])
    torch.testing.assert_close(logp.detach(), out[Columns.ACTION_LOGP], rtol=0, atol=1e-6)
    assert (out[Columns.ACTION_LOGP] < 0).all()


def test_seq2seq__logp_matches_the_autoregressive_product_of_group_probabilities():
    module = _module()
    obs = _obs(1)
    actions = torch.tensor([[0, 2, 1, 1, 0, 2, 2]])
    out = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: actions})
    logits = out[Columns.ACTION_DIST_INPUTS].view(1, G, D)
    by_hand = sum(torch.log_softmax(logits[0, g], -1)[actions[0, g]] for g in range(G))
    _, logp = _train_logp(module, obs, actions)
    torch.testing.assert_close(logp[0], by_hand, rtol=0, atol=1e-5)
    # changing an early device changes later groups' logits (the decoder is autoregressive)
    changed = actions.clone()
    changed[0, 0] = 1
    logits2 = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: changed})[Columns.ACTION_DIST_INPUTS]
    assert not torch.allclose(logits2.view(1, G, D)[0, 3], logits[0, 3])


def test_seq2seq__forbidden_devices_are_never_sampled_and_masked_in_training():
    allowed = np.ones((G, D))
    allowed[1] = [0, 0, 1]  # group 1: only device 2
    allowed[4] = [1, 0, 0]  # group 4: only device 0
    module = _module(noise=1.0)
    obs = _obs(64, allowed)
    out = module.forward_exploration({Columns.OBS: obs}, generator=torch.Generator().manual_seed(0))
    assert (out[Columns.ACTIONS][:, 1] == 2).all() and (out[Columns.ACTIONS][:, 4] == 0).all()
    assert len(torch.unique(out[Columns.ACTIONS][:, 0])) > 1  # free groups still vary
    greedy = module.forward_inference({Columns.OBS: obs[:1]})[Columns.ACTIONS]
    assert greedy[0, 1] == 2 and greedy[0, 4] == 0
    dist, _ = _train_logp(module, obs, out[Columns.ACTIONS])
    logits = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: out[Columns.ACTIONS]})[
        Columns.ACTION_DIST_INPUTS].view(64, G, D)
    assert (logits[:, 1, :2] == MASKED_LOGIT).all()
    assert torch.isfinite(dist.entropy()).all()


def test_seq2seq__sampling_is_repeatable_with_a_seeded_generator():
    module = _module(noise=0.5)
    obs = _obs(16)
    a = module.forward_exploration({Columns.OBS: obs}, generator=torch.Generator().manual_seed(7))[Columns.ACTIONS]
    b = module.forward_exploration({Columns.OBS: obs}, generator=torch.Generator().manual_seed(7))[Columns.ACTIONS]
    c = module.forward_exploration({Columns.OBS: obs}, generator=torch.Generator().manual_seed(8))[Columns.ACTIONS]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_seq2seq__greedy_picks_the_most_likely_device_of_each_group():
    module = _module()
    obs = _obs(1)
    greedy = module.forward_inference({Columns.OBS: obs})[Columns.ACTIONS]
    logits = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: greedy})[Columns.ACTION_DIST_INPUTS]
    assert torch.equal(logits.view(1, G, D).argmax(-1), greedy)


def test_seq2seq__logp_gradient_reaches_encoder_and_decoder():
    module = _module()
    obs = _obs(4)
    actions = module.forward_exploration({Columns.OBS: obs})[Columns.ACTIONS]
    _, logp = _train_logp(module, obs, actions)
    logp.sum().backward()
    names = ("net.embed.weight", "net.encoder.weight_hh_l0", "net.decoder.weight_ih_l0", "net.attn_keys.weight",
             "net.device_logits.weight")
    for name in names:
        grad = dict(module.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_seq2seq__values_from_embeddings_equal_values_from_observations():
    module = _module()
    obs = _obs(3)
    actions = module.forward_exploration({Columns.OBS: obs})[Columns.ACTIONS]
    out = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: actions})
    torch.testing.assert_close(module.compute_values({Columns.OBS: obs}, embeddings=out[Columns.EMBEDDINGS]),
                               module.compute_values({Columns.OBS: obs}))


def test_seq2seq__rejects_an_observation_with_the_wrong_group_count():
    with pytest.raises(ValueError, match="observation"):
        _module().forward_inference({Columns.OBS: torch.zeros(1, G + 1, F + D)})


# ---- the plain torch network (policies/rl/seq2seq/network.py) ---------------------------------------

def _net(hidden_size: int = 16, seed: int = 0):
    from policies.rl.seq2seq.network import Seq2SeqNet
    torch.manual_seed(seed)
    return Seq2SeqNet(F, D, hidden_size)


def test_seq2seq_net__imports_no_rllib():
    import subprocess
    import sys
    code = "import sys, policies.rl.seq2seq.network; print(any(m.startswith('ray') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_seq2seq_net__distinct_rows_sample_and_teacher_agree_row_by_row():
    from policies.rl.seq2seq.network import placement_logp
    net = _net()
    net.logit_noise_std = 0.5
    features = torch.randn(4, G, F, generator=torch.Generator().manual_seed(5))  # every row its own graph
    allowed = torch.ones(4, G, D, dtype=torch.bool)
    allowed[2, 3] = torch.tensor([False, True, False])
    with torch.no_grad():
        actions, logits = net.sample(features, allowed, generator=torch.Generator().manual_seed(1))
        teacher = net.teacher(features, allowed, actions)
        alone = net.teacher(features[1:2], allowed[1:2], actions[1:2])  # a row alone: the same logits
    assert actions.shape == (4, G) and logits.shape == (4, G, D) and actions[2, 3] == 1
    torch.testing.assert_close(placement_logp(teacher, actions), placement_logp(logits, actions), rtol=0, atol=1e-6)
    torch.testing.assert_close(alone[0], teacher[1], rtol=0, atol=1e-6)
    assert not torch.allclose(teacher[0], teacher[1])  # different features, different policies
    assert net.embed_groups(features).shape == (4, 16)


def test_seq2seq_net__placement_logp_and_entropy_match_per_group_categoricals():
    from policies.rl.seq2seq.network import MASKED_LOGIT, placement_entropy, placement_logp
    logits = torch.randn(3, G, D, generator=torch.Generator().manual_seed(2))
    logits[0, 2, 1] = MASKED_LOGIT
    actions = torch.randint(0, D, (3, G), generator=torch.Generator().manual_seed(3))
    actions[0, 2] = 0
    dists = [torch.distributions.Categorical(logits=logits[:, g]) for g in range(G)]
    torch.testing.assert_close(placement_logp(logits, actions),
                               sum(d.log_prob(actions[:, g]) for g, d in enumerate(dists)))
    torch.testing.assert_close(placement_entropy(logits), sum(d.entropy() for d in dists))
    assert torch.isfinite(placement_entropy(logits)).all()


def test_seq2seq_net__rejects_a_mask_that_does_not_match_the_features():
    with pytest.raises(ValueError, match="allowed"):
        _net().sample(torch.zeros(2, G, F), torch.ones(2, G, D + 1, dtype=torch.bool))


def _reference_teacher_logits(net, features, allowed, actions):
    """The network written plainly (nn.LSTM calls, explicit attention context), per row."""
    enc, (h_n, c_n) = net.encoder(torch.tanh(net.embed(features)))
    state = (torch.cat([h_n[0], h_n[1]], -1)[None], torch.cat([c_n[0], c_n[1]], -1)[None])
    previous = torch.cat([torch.full_like(actions[:, :1], D), actions[:, :-1]], dim=1)
    hidden, _ = net.decoder(torch.cat([net.device_embedding(previous), enc], dim=-1), state)
    keys = net.attn_keys(enc)
    scores = torch.bmm(net.attn_query(hidden), keys.transpose(1, 2)) * keys.shape[-1] ** -0.5
    context = torch.bmm(torch.softmax(scores, dim=-1), enc)
    raw = net.device_logits(torch.cat([hidden, context], dim=-1))
    return (net.tanh_constant * torch.tanh(raw / net.temperature)).masked_fill(~allowed, -1e9)


@pytest.mark.parametrize("shared_rows", [True, False])
def test_seq2seq_net__fast_paths_match_the_plain_network_in_value_and_gradient(shared_rows):
    """Precomputed projections, the hand-written LSTM backward and the shared-row encoding change no math."""
    net = _net(hidden_size=8).double()
    gen = torch.Generator().manual_seed(4)
    features = torch.randn(1 if shared_rows else 3, G, F, generator=gen, dtype=torch.float64).expand(3, G, F)
    features = features.contiguous()  # equal rows are found by comparing, not by stride
    allowed = torch.rand(3, G, D, generator=gen) > 0.3
    allowed[..., 0] = True
    actions = torch.where(allowed[..., 1], 1, 0)
    weights = torch.randn(3, G, D, generator=gen, dtype=torch.float64).masked_fill(~allowed, 0.0)
    fast = net.teacher(features, allowed, actions)
    grads_fast = torch.autograd.grad((fast * weights).sum(), list(net.parameters()))
    plain = _reference_teacher_logits(net, features, allowed, actions)
    grads_plain = torch.autograd.grad((plain * weights).sum(), list(net.parameters()))
    torch.testing.assert_close(fast, plain, rtol=1e-10, atol=1e-10)
    for (name, _), a, b in zip(net.named_parameters(), grads_fast, grads_plain):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=name)


def test_seq2seq_net__lstm_recurrence_passes_gradcheck():
    from policies.rl.seq2seq.network import LSTMRecurrence
    gen = torch.Generator().manual_seed(6)
    args = [torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
            for shape in [(5, 2, 12), (2, 3), (2, 3), (12, 3)]]  # (T, B, 4H), (B, H), (B, H), (4H, H)
    assert torch.autograd.gradcheck(LSTMRecurrence.apply, args)


def test_seq2seq__placement_distribution_matches_rllib_multi_categorical():
    from ray.rllib.core.distribution.torch.torch_distribution import TorchMultiCategorical
    module = _module()
    gen = torch.Generator().manual_seed(9)
    flat, other = (torch.randn(4, G * D, generator=gen) for _ in range(2))
    flat[0, :2] = MASKED_LOGIT  # group 0 of row 0: only device 2
    actions = torch.randint(0, D, (4, G), generator=gen)
    actions[0, 0] = 2
    ours = module.get_train_action_dist_cls()
    rllib = TorchMultiCategorical.get_partial_dist_cls(input_lens=[D] * G)
    torch.testing.assert_close(ours.from_logits(flat).logp(actions), rllib.from_logits(flat).logp(actions))
    torch.testing.assert_close(ours.from_logits(flat).entropy(), rllib.from_logits(flat).entropy())
    torch.testing.assert_close(ours.from_logits(flat).kl(ours.from_logits(other)),
                               rllib.from_logits(flat).kl(rllib.from_logits(other)))
    assert ours.from_logits(flat).sample().shape == (4, G)
    assert torch.equal(ours.from_logits(flat).to_deterministic().sample(), flat.view(4, G, D).argmax(-1))
