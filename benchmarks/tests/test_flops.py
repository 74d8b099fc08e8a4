"""The FLOP formula against a hand count, and the seed configuration's size."""
from benchmarks.flops import forward_matmul_flops, step_flops
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
