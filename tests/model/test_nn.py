"""Modules: deterministic init, parameter naming and tying, shapes, dtypes, hooks, dropout RNG, generate."""

import math

import ml_dtypes
import numpy as np
import pytest

from engine import nn, ops
from engine.tensor import Tensor


def tiny_gpt(**overrides):
    kw = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.0, tie_weights=True,
              bias=True, dtype=np.float32)
    return nn.GPT(**{**kw, **overrides})


def test_init_is_deterministic_in_place_and_seed_dependent():
    a, b = tiny_gpt(), tiny_gpt()
    views = [p.data for p in a.parameters()]
    nn.init_params(a, 5)
    nn.init_params(b, 5)
    assert all(p.data is v for p, v in zip(a.parameters(), views))  # flat-buffer views stay valid
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(pa.data, pb.data, err_msg=name)
    nn.init_params(b, 6)
    assert not np.array_equal(a.wte.weight.data, b.wte.weight.data)


def test_gpt2_init_statistics():
    model = tiny_gpt(n_layer=4, n_embd=64)
    nn.init_params(model, 0)
    params = dict(model.named_parameters())
    assert np.all(params["blocks.0.ln_1.weight"].data == 1) and np.all(params["ln_f.bias"].data == 0)
    assert np.all(params["blocks.1.attn.c_attn.bias"].data == 0)
    assert abs(params["blocks.0.mlp.layers.0.weight"].data.std() - 0.02) < 0.002
    residual = 0.02 / math.sqrt(2 * 4)
    for name in ("blocks.2.attn.c_proj.weight", "blocks.2.mlp.layers.1.weight"):
        assert abs(params[name].data.std() - residual) < 0.1 * residual, name


def test_same_seed_same_weights_across_precisions():
    a, b = tiny_gpt(dtype=np.float64), tiny_gpt(dtype=np.float16)
    nn.init_params(a, 2)
    nn.init_params(b, 2)
    np.testing.assert_array_equal(a.wte.weight.data.astype(np.float16), b.wte.weight.data)


def test_parameter_names_order_and_tied_weight_once():
    tied, untied = tiny_gpt(n_layer=1), tiny_gpt(n_layer=1, tie_weights=False, bias=False)
    block = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
             "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.layers.0.weight", "mlp.layers.0.bias",
             "mlp.layers.1.weight", "mlp.layers.1.bias"]
    expected = ["wte.weight", "wpe.weight"] + [f"blocks.0.{n}" for n in block] + ["ln_f.weight", "ln_f.bias"]
    assert [n for n, _ in tied.named_parameters()] == expected
    assert tied.lm_head.weight is tied.wte.weight
    assert [p.name for p in tied.parameters()] == expected
    untied_names = [n for n, _ in untied.named_parameters()]
    assert untied_names[-1] == "lm_head.weight" and "ln_f.bias" not in untied_names
    assert untied.lm_head.weight.shape == (11, 16)  # Linear weights are [out, in]


def test_parameter_count_matches_the_architecture():
    v, t, l, c = 11, 8, 2, 16
    per_block = 2 * 2 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c)
    expected = v * c + t * c + l * per_block + 2 * c
    assert sum(p.size for p in tiny_gpt().parameters()) == expected


def test_gpt_shapes_and_context_limit():
    model = tiny_gpt()
    idx = np.random.default_rng(0).integers(0, 11, size=(3, 8))
    assert model(idx).shape == (3, 8, 11)
    assert model(idx[:, :5]).shape == (3, 5, 11)
    with pytest.raises(ValueError, match="block_size"):
        model(np.zeros((1, 9), dtype=np.int64))


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-6), (np.float16, 1e-4),
                                       (ml_dtypes.bfloat16, 1e-3)])
def test_dtypes_flow_through_the_model(dtype, tol):
    model, reference = tiny_gpt(dtype=dtype), tiny_gpt(dtype=np.float64)
    assert {p.dtype for p in model.parameters()} == {np.dtype(dtype)}
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 11, size=(2, 8)), rng.integers(0, 11, size=(2, 8))
    logits = model(idx)
    loss = ops.cross_entropy(logits, targets)
    assert logits.dtype == np.dtype(dtype)
    assert loss.dtype == (np.float64 if dtype == np.float64 else np.float32)
    expected = ops.cross_entropy(reference(idx), targets).item()
    assert abs(loss.item() - expected) <= tol * expected
    loss.backward()
    assert all(p.grad.dtype == np.dtype(dtype) and np.isfinite(p.grad.astype(np.float32)).all()
               for p in model.parameters())


def test_mlp_forward_and_widths():
    model = nn.MLP([6, 8, 3], dropout=0.0)
    x = np.random.default_rng(0).standard_normal((5, 6))
    out = model(x)
    assert out.shape == (5, 3) and out.dtype == np.float32
    h = ops.gelu(ops.linear(Tensor(x.astype(np.float32)), model.layers[0].weight, model.layers[0].bias))
    expected = ops.linear(h, model.layers[1].weight, model.layers[1].bias).data
    np.testing.assert_allclose(out.data, expected, rtol=1e-6)
    assert [n for n, _ in model.named_parameters()] == ["layers.0.weight", "layers.0.bias",
                                                       "layers.1.weight", "layers.1.bias"]
    with pytest.raises(ValueError, match="an input and an output width"):
        nn.MLP([4])


def test_forward_hooks_and_children():
    model = tiny_gpt()
    calls = []
    block = model.blocks[1]
    block.forward_pre_hooks.append(lambda m: calls.append(("pre", m is block)))
    block.forward_post_hooks.append(lambda m, out: calls.append(("post", out.shape)))
    block.forward_post_hooks.append(lambda m, out: out * 0.0)  # a replacement output
    logits = model(np.zeros((1, 4), dtype=np.int64))
    assert calls == [("pre", True), ("post", (1, 4, 16))]
    np.testing.assert_allclose(logits.data, 0.0)  # ln_f of zeros is its bias (0): logits are 0
    assert model.children()[:3] == [model.wte, model.wpe, model.drop]
    assert model.blocks[0] in model.children()


def test_dropout_uses_the_model_rng_and_rewinding_it_replays_a_block():
    """What activation checkpointing relies on: same rng position in, bitwise the same block output."""
    model = tiny_gpt(dropout=0.3)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32))
    position = model.rng.position()
    first = model.blocks[0](x).data
    assert not np.array_equal(model.blocks[0](x).data, first)  # the next dropout sites: new masks
    model.rng.rewind(position)
    np.testing.assert_array_equal(model.blocks[0](x).data, first)
    model.eval()
    np.testing.assert_array_equal(model.blocks[0](x).data, model.blocks[0](x).data)
    assert not any(m.training for m in model.modules())


def test_generate_is_reproducible_and_greedy_matches_argmax():
    model = tiny_gpt()
    nn.init_params(model, 1)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    a = model.generate(prompt, 10, temperature=1.0, rng=np.random.default_rng(0))
    b = model.generate(prompt, 10, temperature=1.0, rng=np.random.default_rng(0))
    assert a.shape == (2, 13) and np.array_equal(a, b) and np.array_equal(a[:, :3], prompt)
    assert a.min() >= 0 and a.max() < 11
    greedy = model.generate(prompt, 1, temperature=0)
    np.testing.assert_array_equal(greedy[:, -1], model(prompt).data[:, -1].argmax(-1))
    assert model.training  # generate restores the mode it found


def test_top_k_samples_only_among_the_k_most_likely_tokens():
    """Each sampled token, given the sequence before it, is among the k highest logits of an independent
    forward pass; k = 1 is greedy at any temperature; k = 0 or k >= vocab is plain sampling."""
    model = tiny_gpt()
    nn.init_params(model, 2)
    model.eval()
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    out = model.generate(prompt, 12, temperature=2.0, rng=np.random.default_rng(5), top_k=3)
    for t in range(3, out.shape[1]):
        logits = model(out[:, max(0, t - model.block_size):t]).data[:, -1]
        top3 = np.argsort(logits, axis=-1)[:, -3:]
        assert all(out[b, t] in top3[b] for b in range(len(out))), t
    greedy = model.generate(prompt, 8, temperature=0)
    assert np.array_equal(model.generate(prompt, 8, temperature=1.5, rng=np.random.default_rng(9), top_k=1),
                          greedy)
    plain = model.generate(prompt, 8, temperature=1.0, rng=np.random.default_rng(4))
    for k in (0, model.vocab_size, model.vocab_size + 5):
        again = model.generate(prompt, 8, temperature=1.0, rng=np.random.default_rng(4), top_k=k)
        assert np.array_equal(again, plain)
    wide = model.generate(prompt, 40, temperature=50.0, rng=np.random.default_rng(1), top_k=3)
    assert len(np.unique(wide[:, 3:])) > 3  # it does sample: more than k distinct tokens over many contexts
