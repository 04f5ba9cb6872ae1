"""Whole models against PyTorch: same weights in, same loss and same gradients out."""

import numpy as np
import pytest
from extras import needs

from engine import nn, ops

torch = needs("torch", "torch", "PyTorch is the reference for the parity tests")
F = torch.nn.functional
from engine.bench.torch_peer import to_numpy, torch_model_from, torch_params_by_name  # noqa: E402

# relative L2 error of each gradient (and of the loss) that each precision must meet
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}


def _rel(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))


def _assert_same_grads(model, twin, tol):
    for name, tp in torch_params_by_name(model, twin).items():
        ours = dict(model.named_parameters())[name].grad
        assert _rel(ours, to_numpy(tp.grad)) <= tol, name


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tie_weights,bias", [(True, True), (False, False)])
def test_gpt_loss_and_grads_match_torch(dtype, tie_weights, bias):
    model = nn.GPT(vocab_size=65, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0,
                   tie_weights=tie_weights, bias=bias, dtype=dtype)
    nn.init_params(model, seed=3)
    twin = torch_model_from(model)
    idx = np.random.default_rng(0).integers(0, 65, size=(4, 17))
    x, y = idx[:, :-1], idx[:, 1:]

    loss = ops.cross_entropy(model(x), y)
    loss.backward()
    logits = twin(torch.from_numpy(x))
    t_loss = F.cross_entropy(logits.reshape(-1, 65), torch.from_numpy(y).reshape(-1))
    t_loss.backward()

    assert abs(loss.item() - t_loss.item()) <= TOLERANCE[dtype] * abs(t_loss.item())
    _assert_same_grads(model, twin, TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mlp_loss_and_grads_match_torch(dtype):
    model = nn.MLP([20, 48, 48, 5], dropout=0.0, bias=True, dtype=dtype)
    nn.init_params(model, seed=1)
    twin = torch_model_from(model)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 20)).astype(dtype), rng.integers(0, 5, 16)

    loss = ops.cross_entropy(model(x), y)
    loss.backward()
    t_loss = F.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y))
    t_loss.backward()

    assert abs(loss.item() - t_loss.item()) <= TOLERANCE[dtype] * abs(t_loss.item())
    _assert_same_grads(model, twin, TOLERANCE[dtype])


def test_fused_torch_attention_twin_agrees_with_hand_written():
    """The benchmark may use torch's fused attention; it must compute the same function."""
    model = nn.GPT(65, 16, 2, 4, 32, 0.0, True, True, np.float64)
    idx = torch.from_numpy(np.random.default_rng(2).integers(0, 65, size=(2, 16)))
    plain, fused = torch_model_from(model), torch_model_from(model, fused_attention=True)
    np.testing.assert_allclose(to_numpy(fused(idx)), to_numpy(plain(idx)), rtol=1e-10, atol=1e-12)
