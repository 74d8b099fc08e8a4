"""The FLOP formulas against hand counts, and the sizes of the classifier seed's and the language model's steps."""
import pytest

from benchmarks.flops import executed_step_flops, forward_matmul_flops, lm_forward_matmul_flops, step_flops
from common.config import Config


def test_forward_flops_match_a_hand_count_for_a_tiny_config():
    # B 2, T 3, E 4, H 5, L 2; every product (M, K) @ (K, N) is 2·M·N·K, 4H = 20 gate columns:
    #   layer 0 input      (2·3 rows) · 4 → 20: 2·6·20·4 =  960
    #   layer 0 recurrence (2·3 rows) · 5 → 20: 2·6·20·5 = 1200
    #   layer 1 input      2·6·20·5                      = 1200
    #   layer 1 recurrence 2·6·20·5                      = 1200
    #   output layer       (2 rows)   · 5 → 1:  2·2·1·5  =   20
    assert forward_matmul_flops(batch_size=2, seq_len=3, embed_dim=4, hidden_dim=5, layers=2) == 4580


def test_training_step_is_three_forwards_and_inference_one():
    cfg = Config(batch_size=2, seq_len=3, embed_dim=4, hidden_dim=5, layers=2)
    assert step_flops(cfg, "train") == 3 * 4580
    assert step_flops(cfg, "eval") == 4580


def test_seed_configuration_training_step_is_about_72_gflop():
    # B 50, T 200, E 400, H 256, L 2: forward 2·10000·1024·(656 + 512) + 2·50·256 = 23 920 665 600.
    assert step_flops(Config(), "train") == 3 * 23_920_665_600
    assert abs(step_flops(Config(), "train") / 1e9 - 72) < 0.5


def test_the_fold_projects_the_vocabulary_instead_of_the_tokens():
    cfg = Config(batch_size=2, seq_len=3, embed_dim=4, hidden_dim=5, layers=2)  # T·B = 6 tokens
    # V = 4 < 6: layer 0's input projection is 2·4·20·4 = 640 instead of 960, once per forward-sized product.
    assert executed_step_flops(cfg, "eval", vocab_size=4, folds=True) == 4580 - 320
    assert executed_step_flops(cfg, "train", vocab_size=4, folds=True) == 3 * (4580 - 320)
    assert executed_step_flops(cfg, "train", vocab_size=7, folds=True) == 3 * 4580  # V ≥ T·B: no fold
    assert executed_step_flops(cfg, "train", vocab_size=4, folds=False) == 3 * 4580


def test_the_kernels_fold_projects_only_the_rows_a_batch_uses():
    cfg = Config(batch_size=2, seq_len=3, embed_dim=4, hidden_dim=5, layers=2)  # T·B = 6 tokens, V = 4
    # 2.5 rows used on average: 2·2.5·20·4 = 400 instead of 960, once per forward-sized product.
    assert executed_step_flops(cfg, "eval", vocab_size=4, folds=True, used_rows=2.5) == 4580 - 560
    assert executed_step_flops(cfg, "train", vocab_size=4, folds=True, used_rows=2.5) == 3 * (4580 - 560)
    assert executed_step_flops(cfg, "train", vocab_size=7, folds=True, used_rows=2.5) == 3 * 4580  # V ≥ T·B: no fold


def test_seed_configuration_fold_saves_about_14_gflop():
    saved = step_flops(Config(), "train") - executed_step_flops(Config(), "train", vocab_size=4398, folds=True)
    assert abs(saved / 1e9 - 13.8) < 0.1  # 3 · 2·1024·400·(10000 - 4398) = 13.77 GFLOP


def test_lm_forward_flops_count_the_decoder_and_each_layers_gates_by_hand():
    # 6 tokens, E 4, H 5, L 2, V 7; every product is 2·M·N·K per token row:
    #   LSTM (4H = 20 gate rows): layer 0 2·20·(4 + 5) = 360, layer 1 2·20·(5 + 5) = 400
    #   GRU (3H = 15 gate rows):  layer 0 2·15·9      = 270, layer 1 2·15·10      = 300
    #   decoder H → V: 2·5·7 = 70; the embedding is a lookup: nothing
    assert lm_forward_matmul_flops(6, embed_dim=4, hidden_dim=5, layers=2, vocab_size=7) == 6 * (360 + 400 + 70)
    assert lm_forward_matmul_flops(6, 4, 5, 2, 7, cell="gru") == 6 * (270 + 300 + 70)


def test_lm_training_window_is_three_forwards_of_its_tokens_and_evaluation_one_of_ten_columns():
    cfg = Config.for_workload("lm", batch_size=2, bptt=3, embed_dim=4, hidden_dim=5, layers=2)
    assert step_flops(cfg, "train", vocab_size=7) == 3 * 6 * (360 + 400 + 70)  # 3 rows × 2 columns
    assert step_flops(cfg, "eval", vocab_size=7) == 30 * (360 + 400 + 70)  # 3 rows × the example's 10 columns
    assert executed_step_flops(cfg, "train", vocab_size=7, folds=True) == step_flops(cfg, "train", 7)  # no fold
    with pytest.raises(ValueError, match="vocabulary size"):
        step_flops(cfg, "train")


def test_lm_small_size_decoder_is_three_quarters_of_about_11_gflop_a_training_window():
    # E = H = 200, L 2, B 20, bptt 35 (700 tokens), V 10 000: recurrence 2·800·400 per layer and token, decoder
    # 2·200·10 000 per token.
    cfg = Config.for_workload("lm")
    decoder = 3 * 700 * 2 * 200 * 10_000
    assert step_flops(cfg, "train", vocab_size=10_000) == 3 * 700 * 2 * (2 * 800 * 400) + decoder
    assert abs(step_flops(cfg, "train", vocab_size=10_000) / 1e9 - 11.09) < 0.01
    assert decoder / step_flops(cfg, "train", vocab_size=10_000) == pytest.approx(4 / 5.28)
