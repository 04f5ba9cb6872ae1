"""Datasets: deterministic corpora, world-size-independent batches, exact rank/micro-batch slicing."""

from types import SimpleNamespace

import numpy as np
import pytest

from engine import data


def cfgs(kind="stdlib", path="", max_chars=50_000, val_fraction=0.1, n_samples=256, block_size=16,
         widths=(8, 16, 4)):
    return (SimpleNamespace(kind=kind, path=path, max_chars=max_chars, val_fraction=val_fraction,
                            n_samples=n_samples),
            SimpleNamespace(block_size=block_size, widths=list(widths)))


def test_stdlib_corpus_is_deterministic_capped_and_python_source():
    text = data.stdlib_text(20_000)
    assert len(text) == 20_000
    assert data.stdlib_text(20_000) is text  # cached per process
    data.stdlib_text.cache_clear()
    assert data.stdlib_text(20_000) == text  # re-read from disk: same bytes
    assert "def " in text and "import " in text
    assert data.stdlib_text(5_000) == text[:5_000]  # the cap is a prefix of the same ordered walk


def test_char_vocab_roundtrip_and_sorted():
    vocab = data.CharVocab("hello, world\n")
    assert vocab.chars == sorted(set("hello, world\n"))
    ids = vocab.encode("low hello")
    assert ids.dtype == np.int32 and vocab.decode(ids) == "low hello"
    with pytest.raises(ValueError):
        vocab.encode("xyz")


def test_stdlib_dataset_splits_and_vocab():
    d, m = cfgs(max_chars=30_000, val_fraction=0.25)
    ds = data.make_dataset(d, m, seed=0, global_batch=8)
    assert len(ds.splits["train"]) == 22_500 and len(ds.splits["val"]) == 7_500
    assert ds.vocab_size == len(ds.vocab) == len(set(data.stdlib_text(30_000)))
    whole = np.concatenate([ds.splits["train"], ds.splits["val"]])
    assert ds.vocab.decode(whole) == data.stdlib_text(30_000)  # the val split is the contiguous tail


def test_lm_batches_are_shifted_windows_and_deterministic():
    d, m = cfgs(max_chars=30_000)
    ds = data.make_dataset(d, m, seed=3, global_batch=12)
    x, y = ds.global_batch(5, "train")
    assert x.shape == y.shape == (12, 16) and x.dtype == np.int64
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    x2, y2 = data.make_dataset(d, m, seed=3, global_batch=12).global_batch(5, "train")
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert not np.array_equal(x, ds.global_batch(6, "train")[0])
    assert not np.array_equal(x, data.make_dataset(d, m, seed=4, global_batch=12).global_batch(5)[0])
    assert not np.array_equal(x, ds.global_batch(5, "val")[0])
    # Each row is a real window of the split's token stream.
    train = ds.splits["train"]
    for row_x, row_y in zip(x, y):
        text = ds.decode(np.append(row_x, row_y[-1]))
        assert text in ds.decode(train)
    assert ds.global_batch(0, "val", rows=3)[0].shape == (3, 16)
    with pytest.raises(ValueError):
        ds.global_batch(0, "test")


@pytest.mark.parametrize("world", range(1, 9))
def test_rank_slices_concatenate_back_to_the_global_batch(world):
    d, m = cfgs(kind="synthetic-lm")
    for n_micro in (1, 2, 3):
        rows = world * n_micro * 2
        ds = data.make_dataset(d, m, seed=1, global_batch=rows)
        x, y = ds.global_batch(7)
        parts = [data.rank_slice((x, y), r, world, mi, n_micro)
                 for r in range(world) for mi in range(n_micro)]
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
        assert all(np.shares_memory(p[0], x) for p in parts)  # slices are views
        # A rank's slice is the same rows whatever the micro-batching.
        whole_rank = data.rank_slice(x, world - 1, world)
        np.testing.assert_array_equal(np.concatenate(
            [data.rank_slice(x, world - 1, world, mi, n_micro) for mi in range(n_micro)]), whole_rank)


def test_slice_bounds_layout_and_errors():
    assert data.slice_bounds(24, rank=1, world=2, micro=2, n_micro=3) == (20, 24)
    assert data.slice_bounds(24, rank=0, world=2, micro=1, n_micro=3) == (4, 8)
    with pytest.raises(ValueError, match="multiple of world_size"):
        data.slice_bounds(10, 0, 4)
    with pytest.raises(ValueError):
        data.slice_bounds(8, 2, 2)


def test_synthetic_lm_follows_its_markov_chain():
    tokens = data.synthetic_lm_tokens(20_000, 16, seed=0)
    assert tokens.min() >= 0 and tokens.max() < 16
    np.testing.assert_array_equal(tokens, data.synthetic_lm_tokens(20_000, 16, seed=0))
    # Learnable: for each token one successor dominates (~90% of transitions plus the noise share).
    counts = np.zeros((16, 16))
    np.add.at(counts, (tokens[:-1], tokens[1:]), 1)
    top = counts.max(axis=1) / counts.sum(axis=1)
    assert np.all(top > 0.85)
    d, m = cfgs(kind="synthetic-lm", n_samples=100, block_size=8)
    ds = data.make_dataset(d, m, seed=0, global_batch=4)
    assert ds.vocab_size == data.SYNTHETIC_LM_VOCAB
    assert len(ds.splits["train"]) + len(ds.splits["val"]) == 800


def test_synthetic_classification_is_deterministic_and_learnable():
    x, y = data.synthetic_classification(2_000, 20, 5, seed=0)
    assert x.shape == (2_000, 20) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(x, data.synthetic_classification(2_000, 20, 5, seed=0)[0])
    assert set(np.unique(y)) == set(range(5))
    # Nearest class mean (estimated on the first half) classifies the second half well above chance.
    means = np.stack([x[:1000][y[:1000] == c].mean(axis=0) for c in range(5)])
    pred = np.argmin(((x[1000:, None, :] - means) ** 2).sum(-1), axis=1)
    assert (pred == y[1000:]).mean() > 0.8
    d, m = cfgs(kind="synthetic-classification", n_samples=100, val_fraction=0.2, widths=(20, 32, 5))
    ds = data.make_dataset(d, m, seed=0, global_batch=8)
    assert (ds.in_features, ds.n_classes) == (20, 5)
    assert len(ds.splits["train"][0]) == 80 and len(ds.splits["val"][0]) == 20
    xb, yb = ds.global_batch(2, "val")
    assert xb.shape == (8, 20) and yb.shape == (8,)
    np.testing.assert_array_equal(xb, ds.global_batch(2, "val")[0])


def test_text_file_and_folder(tmp_path):
    (tmp_path / "b.txt").write_text("bbbb " * 20)
    (tmp_path / "a.md").write_text("aaaa " * 20)
    (tmp_path / "skip.bin").write_text("zzzz")
    text = data.read_text(tmp_path)
    assert text == "aaaa " * 20 + "\n" + "bbbb " * 20  # sorted, other suffixes ignored
    assert data.read_text(tmp_path / "b.txt", max_chars=7) == "bbbb bb"
    d, m = cfgs(kind="text", path=str(tmp_path), block_size=4, val_fraction=0.2)
    ds = data.make_dataset(d, m, seed=0, global_batch=2)
    assert "".join(ds.vocab.chars) == "\n ab"


def test_missing_path_and_too_little_text_are_one_line_errors(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(data.DataError) as err:
        data.make_dataset(*cfgs(kind="text", path=str(missing)), seed=0, global_batch=2)
    assert str(missing) in str(err.value) and "\n" not in str(err.value) and "data.path" in str(err.value)
    (tmp_path / "tiny.txt").write_text("short")
    with pytest.raises(data.DataError, match="block_size"):
        data.make_dataset(*cfgs(kind="text", path=str(tmp_path / "tiny.txt")), seed=0, global_batch=2)
    with pytest.raises(data.DataError, match="data.kind"):
        data.make_dataset(*cfgs(kind="imagenet"), seed=0, global_batch=2)


def test_max_chars_zero_means_the_whole_text(tmp_path):
    (tmp_path / "a.txt").write_text("hello ")
    (tmp_path / "b.txt").write_text("world")
    assert data.read_text(tmp_path, 0) == "hello \nworld"
    assert data.read_text(tmp_path, 3) == "hel"
