"""Mixture of experts in the model (engine/moe.py), float64: the forward against a token-by-token NumPy
reference, capacity drops by position, the load-balancing loss, and every gradient (inputs, router, experts)
against central finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from engine.moe import MoEGPT, add_aux_losses, moe_layers
from engine.tensor import Tensor
from tests.moe_helpers import WIDTH, make_moe, reference_forward, tokens
from tests.numeric_helpers import numeric_grad


@pytest.mark.parametrize("top_k,capacity_factor", [(1, 0.0), (2, 0.0), (2, 0.75), (1, 1.0)])
def test_forward_matches_the_token_by_token_reference(top_k, capacity_factor):
    moe = make_moe(4, top_k, capacity_factor)
    x = tokens(24)
    y = moe(Tensor(x.reshape(2, 12, WIDTH))).data.reshape(24, WIDTH)
    want, aux, dropped = reference_forward(moe, x)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-14)
    assert moe.aux_loss.item() == pytest.approx(aux, rel=1e-12)
    assert moe.stats["dropped"] == dropped
    assert moe.stats["tokens_per_expert"].sum() == 24 * top_k - dropped
    if capacity_factor == 0:
        assert dropped == 0


def test_capacity_keeps_the_first_tokens_in_position_order():
    moe = make_moe(4, 1, capacity_factor=1.0)
    x = tokens(8, routing="one", expert=2, moe=moe)  # all 8 tokens pick expert 2; capacity 1.0 * 8 / 4 = 2
    y = moe(Tensor(x)).data
    assert moe.stats["dropped"] == 6
    assert list(moe.stats["tokens_per_expert"]) == [0, 0, 2, 0]
    assert np.all(y[2:] == 0) and np.all(np.abs(y[:2]).sum(-1) > 0)  # tokens 0 and 1 kept, the rest dropped


def _loss_fn(moe, upstream):
    def loss(x):
        return (moe(Tensor(x)).data * upstream).sum() + moe.aux_loss.item()
    return loss


@pytest.mark.parametrize("top_k,capacity_factor", [(1, 0.0), (2, 0.0), (2, 0.75)])
def test_gradients_match_finite_differences(top_k, capacity_factor):
    moe = make_moe(4, top_k, capacity_factor, aux=0.3)
    x = tokens(10, seed=3)
    upstream = np.random.default_rng(7).standard_normal(x.shape)
    xt = Tensor(x.copy(), requires_grad=True)
    (moe(xt) * Tensor(upstream)).sum().__add__(moe.aux_loss).backward()
    loss = _loss_fn(moe, upstream)
    np.testing.assert_allclose(xt.grad, numeric_grad(lambda a: np.array(loss(a)), [x], 0, 1.0), rtol=1e-6,
                               atol=1e-8)
    for name, p in moe.named_parameters():
        def of_param(v, p=p):
            saved = p.data.copy()
            p.data[...] = v
            try:
                return np.array(loss(x))
            finally:
                p.data[...] = saved
        numeric = numeric_grad(of_param, [p.data.copy()], 0, 1.0)
        np.testing.assert_allclose(p.grad, numeric, rtol=1e-6, atol=1e-8, err_msg=name)
    assert np.abs(moe.router.gate.weight.grad).max() > 0


def test_router_learns_through_the_aux_loss_alone_when_outputs_carry_no_gradient():
    moe = make_moe(4, 2, aux=1.0)
    moe(Tensor(tokens(10)))
    moe.aux_loss.backward()
    assert np.abs(moe.router.gate.weight.grad).max() > 0
    assert all(p.grad is None for n, p in moe.named_parameters() if ".mlps." in n)


def test_gpt_blocks_follow_moe_every_and_the_aux_loss_joins_the_loss():
    moe = dict(n_experts=4, top_k=2, every=2, capacity_factor=0.0, aux_loss_coef=0.01)
    model = MoEGPT(11, 8, 3, 2, 8, dtype=np.float64, moe=moe)
    assert [type(b.mlp).__name__ for b in model.blocks] == ["MoE", "MLP", "MoE"]
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    logits = model(idx)
    base = Tensor(np.array(1.5))
    total = add_aux_losses(model, base)
    assert total.item() == pytest.approx(1.5 + sum(m.aux_loss.item() for m in moe_layers(model)), rel=1e-15)
    assert logits.shape == (2, 8, 11) and model.config["moe"] == moe
