"""Batches: fixed size, seeded per-epoch order for training, every example once in order for evaluation."""
from __future__ import annotations

import numpy as np

from common.batches import Batch, batches, epoch_order, mean_distinct_tokens, num_train_batches
from common.data import EncodedSplit


def _split(n: int, seq_len: int = 4) -> EncodedSplit:
    """Example i has every token equal to i + 2 (so a batch row tells which example it is) and label i % 2."""
    tokens = np.repeat(np.arange(2, n + 2, dtype=np.int32)[:, None], seq_len, axis=1)
    return EncodedSplit([f"t{i}" for i in range(n)], tokens, (np.arange(n) % 2).astype(np.float32),
                        np.full(n, seq_len, dtype=np.int32))


def _ids(batch_list) -> list[list[int]]:
    return [(b.tokens[:, 0] - 2).tolist() for b in batch_list]


def test_training_batches_have_a_fixed_size_and_drop_the_last_partial_batch():
    out = list(batches(_split(10), 3, shuffle_seed=0))
    assert [b.size for b in out] == [3, 3, 3]
    ids = sum(_ids(out), [])
    assert len(set(ids)) == 9  # nine different examples; the tenth is in the dropped partial batch
    assert num_train_batches(10, 3) == 3


def test_training_batch_rows_keep_tokens_labels_and_lengths_together():
    split = _split(10)
    for b in batches(split, 4, shuffle_seed=1):
        ids = b.tokens[:, 0] - 2
        np.testing.assert_array_equal(b.labels, split.labels[ids])
        np.testing.assert_array_equal(b.lengths, split.lengths[ids])
        assert b.tokens.dtype == np.int32 and b.labels.dtype == np.float32 and b.lengths.dtype == np.int32


# Seed 3, epoch 2 of 40 examples in batches of 5, written out: every run, every process and a run resumed from
# an older checkpoint must draw exactly these. A change (in batches, epoch_order or NumPy) changes every trajectory.
SEED_3_EPOCH_2 = [[22, 1, 18, 4, 32], [19, 30, 25, 5, 21], [17, 26, 38, 7, 12], [34, 2, 37, 10, 20],
                  [0, 33, 27, 9, 36], [24, 16, 13, 8, 28], [14, 29, 23, 35, 3], [6, 39, 11, 15, 31]]


def test_training_order_is_reproducible_from_seed_and_epoch():
    split = _split(40)
    assert _ids(batches(split, 5, shuffle_seed=3, epoch=2)) == SEED_3_EPOCH_2
    # Nor do the orders drawn before it change it (a resumed run starts at its epoch, without the earlier ones).
    for seed, epoch in [(3, 0), (3, 1), (4, 2), (3, 3)]:
        list(batches(split, 5, shuffle_seed=seed, epoch=epoch))
    assert _ids(batches(split, 5, shuffle_seed=3, epoch=2)) == SEED_3_EPOCH_2


def test_training_order_differs_between_epochs_and_seeds():
    split = _split(40)
    epoch0 = _ids(batches(split, 5, shuffle_seed=3, epoch=0))
    assert epoch0 != _ids(batches(split, 5, shuffle_seed=3, epoch=1))
    assert epoch0 != _ids(batches(split, 5, shuffle_seed=4, epoch=0))
    assert epoch0 != [list(range(i, i + 5)) for i in range(0, 40, 5)]  # shuffled, not in order


def test_training_order_is_the_documented_permutation():
    # Both twins (and a resumed run) rely on the order being epoch_order(n, seed, epoch), nothing else.
    order = epoch_order(12, seed=5, epoch=1)
    assert sum(_ids(batches(_split(12), 4, shuffle_seed=5, epoch=1)), []) == order.tolist()


def test_evaluation_covers_every_example_once_in_order():
    out = list(batches(_split(10), 3))
    assert [b.size for b in out] == [3, 3, 3, 1]
    assert sum(_ids(out), []) == list(range(10))


def test_start_skips_batches():
    split = _split(20)
    full = _ids(batches(split, 4, shuffle_seed=0, epoch=1))
    assert _ids(batches(split, 4, shuffle_seed=0, epoch=1, start=2)) == full[2:]
    assert _ids(batches(split, 3, start=6)) == [[18, 19]]


def test_lengths_are_at_least_one_for_texts_with_no_tokens():
    split = _split(4)
    split = EncodedSplit(split.texts, split.tokens, split.labels, np.array([0, 3, 0, 4], dtype=np.int32))
    (batch,) = batches(split, 4)
    np.testing.assert_array_equal(batch.lengths, [1, 3, 1, 4])


def test_a_batchs_distinct_tokens_count_every_id_once_padding_included():
    first = Batch(np.array([[5, 7, 0], [7, 7, 0]]), np.zeros(2, np.float32), np.array([2, 2]))
    second = Batch(np.array([[1, 2, 3], [4, 5, 6]]), np.zeros(2, np.float32), np.array([3, 3]))
    assert mean_distinct_tokens([first]) == 3.0  # 5, 7 and the padding 0
    assert mean_distinct_tokens([first, second]) == 4.5
    assert mean_distinct_tokens([]) == 0.0
