"""The torch importer refuses a step whose dtypes a real run refuses, and traces the ones it runs.

Every case is also run for real on its tiny CPU tensors, so a case that is not what it claims fails here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graphs.errors import PlacerError
from graphs.torch.dtype_rules import CLASS_TARGETS, NORM_PARAMS, SAME_DTYPE
from graphs.torch.importer import trace_training_step


class _Net(nn.Module):
    """A Linear(4, 4) ``fc`` (and whatever a case adds) around the case's forward."""

    def __init__(self, forward) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.body = forward

    def forward(self, *inputs):
        return self.body(self, *inputs)


def _x() -> torch.Tensor:
    return torch.randn(3, 4)


def _half_linear():
    net = _Net(lambda m, x: m.fc(x).float().sum())
    net.fc.half()
    return net, (_x(),)


def _matmul_with_int64():
    return _Net(lambda m, x, ids: (m.fc(x) @ ids.T).sum()), (_x(), torch.ones(2, 4, dtype=torch.int64))


def _half_conv_without_bias():
    net = _Net(lambda m, images: m.conv(images).float().sum())
    net.conv = nn.Conv2d(3, 2, 3, bias=False).half()
    return net, (torch.randn(1, 3, 5, 5),)


def _bfloat16_layer_norm_fed_float32():
    net = _Net(lambda m, x: m.norm(m.fc(x)).sum())
    net.norm = nn.LayerNorm(4).bfloat16()
    return net, (_x(),)


def _float_index_select():
    return _Net(lambda m, x, rows: m.fc(x).index_select(0, rows).sum()), (_x(), torch.zeros(2))


def _index_add_of_float16_rows():
    def forward(m, x, rows):
        return m.fc(x).index_add(0, torch.tensor([0, 2]), rows).sum()
    return _Net(forward), (_x(), torch.randn(2, 4).half())


def _int32_class_targets():
    return _Net(lambda m, x, labels: F.cross_entropy(m.fc(x), labels)), (_x(), torch.tensor([0, 3, 1]).int())


def _int64_counts_scaled_in_place():
    def forward(m, x, counts):
        counts = counts.clone()
        counts.mul_(0.5)
        return (m.fc(x) * counts).sum()
    return _Net(forward), (_x(), torch.ones(3, 4, dtype=torch.int64))


def _binary_cross_entropy_of_float16_targets():
    return _Net(lambda m, x, y: F.binary_cross_entropy(m.fc(x).sigmoid(), y)), (_x(), torch.rand(3, 4).half())


REFUSED = [  # (step, the op and the words the error must name)
    (_half_linear, ["aten.addmm", "'fc'", "float16", "float32"]),
    (_matmul_with_int64, ["aten.mm", "float32", "int64"]),
    (_half_conv_without_bias, ["aten.convolution", "'conv'", "float16", "float32"]),
    (_bfloat16_layer_norm_fed_float32, ["aten.native_layer_norm", "'norm'", "bfloat16", "float32"]),
    (_float_index_select, ["aten.index_select", "index", "float32"]),
    (_index_add_of_float16_rows, ["aten.index_add", "float16", "float32"]),
    (_int32_class_targets, ["aten.nll_loss_forward", "int32"]),
    (_int64_counts_scaled_in_place, ["aten.mul_", "int64", "float"]),
    (_binary_cross_entropy_of_float16_targets, ["aten.binary_cross_entropy", "float16", "float32"]),
]


def _autocast_bfloat16():
    def forward(m, x, labels):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m.norm(m.fc(x))
        return F.cross_entropy(logits.float(), labels)
    net = _Net(forward)
    net.norm = nn.LayerNorm(4)
    return net, (_x(), torch.tensor([0, 3, 1]))


def _float16_activations_float32_norm():
    net = _Net(lambda m, x: m.norm(m.fc(x)).float().sum())
    net.fc.half()
    net.norm = nn.LayerNorm(4)  # float32 parameters under a float16 input: mixed precision the kernels take
    return net, (_x().half(),)


def _integer_indices():
    def forward(m, x, ids64, ids32, rows32):
        h = m.fc(x + m.table(ids64) + m.table(ids32))
        return h.index_select(0, rows32).sum() + h.gather(1, ids64[:, None]).sum() + h[rows32].sum()
    net = _Net(forward)
    net.table = nn.Embedding(10, 4)
    return net, (_x(), torch.tensor([1, 2, 3]), torch.tensor([5, 6, 7]).int(), torch.tensor([0, 2]).int())


def _promotions():
    def forward(m, x, half, counts):
        h = m.fc(x) + half  # add, cat and in-place writes of a lower kind promote or cast
        h = torch.cat([h, half]) * 2
        counts = counts.clone()
        counts.mul_(3)
        return h.sum() + counts.sum()
    return _Net(forward), (_x(), torch.randn(3, 4).half(), torch.ones(3, dtype=torch.int64))


ACCEPTED = [_autocast_bfloat16, _float16_activations_float32_norm, _integer_indices, _promotions]


def _run_for_real(model: nn.Module, inputs: tuple) -> None:
    loss = model(*inputs)
    (loss if loss.dim() == 0 else loss.sum()).backward()


@pytest.mark.parametrize("step, named", REFUSED, ids=[step.__name__ for step, _ in REFUSED])
def test_trace_training_step__a_step_whose_dtypes_cannot_run_is_one_placer_error(step, named):
    model, inputs = step()
    with pytest.raises((RuntimeError, IndexError)):
        _run_for_real(model, inputs)
    with pytest.raises(PlacerError) as caught:
        trace_training_step(model, inputs)
    message = str(caught.value)
    assert "cannot run" in message and all(word in message for word in named), message


def test_trace_training_step__a_loss_fn_with_int32_targets_is_named_as_the_loss():
    labels = torch.tensor([0, 1, 1]).int()
    with pytest.raises(PlacerError, match=r"aten.nll_loss_forward in the loss cannot run: .*int32"):
        trace_training_step(nn.Linear(4, 2), _x(), loss_fn=lambda logits: F.cross_entropy(logits, labels))


@pytest.mark.parametrize("step", ACCEPTED, ids=[step.__name__ for step in ACCEPTED])
def test_trace_training_step__steps_that_run_for_real_trace(step):
    model, inputs = step()
    _run_for_real(model, inputs)
    graph = trace_training_step(model, inputs)
    assert graph.num_ops > 0


def test_trace_training_step__autocast_ops_run_in_bfloat16():
    model, inputs = _autocast_bfloat16()
    graph = trace_training_step(model, inputs)
    (addmm,) = [i for i, kind in enumerate(graph.op_kinds) if kind == "aten.addmm"]
    assert graph.out_bytes[addmm] == 3 * 4 * 2  # the matmul ran in 2-byte bfloat16


def test_dtype_rules__every_named_argument_is_in_its_ops_schema():
    """A torch that renames an argument would silently switch a rule off."""
    for packet, names in [*SAME_DTYPE.items(), *NORM_PARAMS.items(), *((p, ("target",)) for p in CLASS_TARGETS)]:
        schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]
        for name in names:
            assert any(name in [a.name for a in schema.arguments] for schema in schemas), (packet, name)
