"""The command line: bad flags fail in one line with status 2; --quick runs end to end in a subprocess; compare."""
import json
from types import SimpleNamespace

import pytest

from benchmarks import bench
from benchmarks.flops import step_flops
from jax_impl.recurrences.choice import Run, auto
from benchmarks.tests.command import BOTH, run_bench
from common.config import parse_with_workload


@pytest.mark.parametrize("argv, message", [
    (["--sweep", "nonexistent_field=1"], "no configuration field 'nonexistent_field'"),
    (["--sweep", "batch_size=0"], "--batch-size must be > 0"),
    (["--frameworks", "foo"], "unknown framework 'foo'"),
    (["--variants", "torch:fast"], "unknown variant 'torch:fast'"),
    (["--rounds", "3"], "--rounds must be >= 5 for an interval over paired rounds (>= 1 under --quick, a smoke run), "
     "got 3"),
    (["--quick", "--rounds", "0"], "--rounds must be >= 1 under --quick (a smoke run), got 0"),
    (["--workload", "lm", "--device-counts", "1,2"], "--device-counts: data-parallel scaling is the classifier's; the "
     "language model trains on one device (its trainers refuse --devices and torchrun)"),
    (["--workload", "lm", "--sweep", "devices=1,2"], "--sweep devices=1,2: data-parallel scaling is the classifier's"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--hidden-dim", "0"], "--hidden-dim must be > 0"),
    (["--device", "tpu"], "cpu or gpu"),
    (["--threads", "0"], "--threads must be between 1"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--timeout", "nan"], "--timeout must be a finite number of seconds > 0, got nan"),
    (["--timeout", "inf"], "--timeout must be a finite number of seconds > 0, got inf"),
    (["--timeout", "-1"], "--timeout must be a finite number of seconds > 0, got -1.0"),
    (["--frameworks", ""], "--frameworks: empty; give a comma list of values"),
    (["--frameworks", "torch,"], "--frameworks: an empty value in 'torch,'"),
    (["--variants", ""], "--variants: empty; give a comma list of values"),
    (["--device-counts", ""], "--device-counts: empty; give a comma list of values"),
    (["--sweep", "seq_len=10,,20"], "--sweep seq_len=10,,20: an empty value in '10,,20'"),
    (["--workload", "lm", "--mode", "convergence"], "--mode convergence trains the classifier"),
    (["--workload", "lm", "--seq-len", "10"], "--seq-len is not a setting of the lm workload"),
    (["--workload", "lm", "--sweep", "seq_len=10,20"], "--seq-len is not a setting of the lm workload"),
])
def test_bad_flags_print_one_line_and_exit_2(argv, message, capsys, tmp_path):
    out = tmp_path / "never"
    assert bench.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not out.exists()  # refused before anything ran or was written


def test_bad_flag_exit_status_from_the_real_command_line():
    proc = run_bench("--frameworks", "foo", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: --frameworks: unknown framework 'foo' (known: torch, jax)"]


RESULT_KEYS = {"framework", "variant", "tier", "step", "config", "compile_s", "first_step_s", "step_s", "samples_per_s",
               "peak_mem_mb", "achieved_gflop_s", "model_gflop_s", "utilisation", "status", "provenance", "fallback",
               "parity", "parity_ok", "parts", "replicates", "model_gflop_per_step", "executed_gflop_per_step",
               "flush_denormal", "rounds", "round_s"}


@pytest.mark.slow
def test_quick_run_writes_the_table_results_json_markdown_and_charts(tmp_path):
    out = tmp_path / "bench"
    proc = run_bench("--quick", "--no-progress", "--replicates", "2", "--variants",
                     "torch:eager,torch:eager-defaults,torch:compile,jax:flax,jax:scan,jax:nofold,jax:fused,jax:jit,"
                     "jax:cudnn",
                     "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("tier"))
    assert lines[header].split()[:5] == ["tier", "variant", "step", "kernel", "parity"]
    assert "parity over 5 training steps" in proc.stdout
    assert ("jax:cudnn (vendor): not timed, n/a: --lstm-impl cudnn: it needs a CUDA GPU, and this backend is cpu"
            in proc.stdout)
    # The tier sentences come first under the table, each with its interval.
    sentences = lines[lines.index("", header) + 1:]
    assert sentences[0].startswith("Stock against stock, torch:eager being PyTorch's nn.LSTM: Flax nn.RNN over Flax's "
                                   "nn.OptimizedLSTMCell (jax:flax) trains at ")
    assert sentences[1].startswith("Best tuned JAX against stock PyTorch: jax:")
    assert sentences[2].startswith("The same algorithm as nn.LSTM, hand-tuned (jax:nofold), trains at ")
    # jax:jit is the trainers' default: our kernel where auto picks it (a kernel row), else a tuned one.
    default, why = auto(Run(platform="cpu"))
    kernel_sentence = ["JAX with a custom kernel against stock PyTorch: our recurrence kernel as jax_impl.train's "
                       "default (jax:jit) trains at "] if default == "kernel" else []
    assert [x[:len(y)] for x, y in zip(sentences[3:], kernel_sentence)] == kernel_sentence
    told = 3 + len(kernel_sentence)
    assert all(" [" in x and "–" in x for x in sentences[:told])
    # Dynamo does not compile nn.LSTM: torch:compile is listed with its reason and not timed.
    assert sentences[told] == "torch:compile (compiled): not timed, n/a: Dynamo: Attempted to wrap RNN, GRU, or LSTM"

    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert {"environment", "gemm_peak", "parity", "results", "settings", "base_config"} <= doc.keys()
    assert doc["schema_version"] == 5 and doc["headline"] == sentences[:len(doc["headline"])]
    assert {"date", "cpu_model", "python", "versions", "xla_env"} <= doc["environment"].keys()
    assert doc["environment"]["xla_env"]["xla_scatter_workaround"] is False  # a CPU host: no GPU workaround
    assert doc["gemm_peak"]["gflop_s"] > 0
    # Each library's peak at the precision its twin runs: full float32 (XLA's HIGHEST), no numpy on a GPU run.
    assert {k: v["precision"] for k, v in doc["gemm_peak"]["measurements"].items()} == {
        "torch": "float32", "jax": "highest", "numpy": "float32"}
    rows = doc["results"]
    assert rows and all(RESULT_KEYS <= r.keys() for r in rows)
    main_rows = [r for r in rows if r["variant"] in ("eager", "jit", "scan", "flax", "nofold", "fused")]
    assert main_rows and all(r["status"] == "ok" for r in main_rows), [r["error"] for r in main_rows]
    for r in main_rows:
        assert set(r["step_s"]) == {"median", "p25", "p75"}
        assert r["step_s"]["p25"] <= r["step_s"]["median"] <= r["step_s"]["p75"]
        assert r["samples_per_s"] == pytest.approx(r["config"]["batch_size"] / r["step_s"]["median"], rel=1e-9)
        assert r["peak_mem_mb"] > 0 and 0 < r["utilisation"] <= 1
        assert r["flush_denormal"] is True and r["rounds"] == 5 and r["replicates"] == 2
        assert [len(x) for x in r["round_s"]] == [5, 5]  # per replicate
    train = {r["variant"]: r for r in main_rows if r["step"] == "train"}
    # Provenance: the op torch.profiler saw, the implementation and the loops JAX's compiled step holds.
    eager = train["eager"]["provenance"]
    assert "aten::mkldnn_rnn_layer" in eager["kernels"] and eager["onednn"]
    assert [train[v]["provenance"]["kernels"][0] for v in ("jit", "fused", "nofold", "scan", "flax")] == [
        f"impl:{default}", "impl:fused", "impl:fused", "impl:scan", "impl:flax"]
    assert train["fused"]["provenance"]["float_while_loops"] == 2  # the wavefront forward and backward
    assert train["jit"]["tier"] == {"kernel": "kernel", "fused": "tuned"}[default]
    assert doc["variants"]["jax:jit"].endswith(". Here: " + why)
    # The float rules in force, per row: full float32 matmuls, denormals flushed on every torch thread.
    assert eager["precision"]["float32_matmul_precision"] == "highest" and eager["flush_denormal"] is True
    assert train["jit"]["provenance"]["precision"]["jax_impl_precision"] == "highest"
    assert all(r["fallback"] is None for r in train.values())
    # Every timed row has its own parity against torch:eager, within float32 rounding.
    assert all(train[v]["parity"] <= 1e-5 and train[v]["parity_ok"] for v in ("jit", "fused", "nofold", "scan", "flax"))
    # The training step in parts: each positive for torch, and the ratios per part.
    assert all(train["eager"]["parts"][p]["median"] > 0 for p in ("forward", "backward", "optimizer"))
    compile_row = next(r for r in rows if r["variant"] == "compile" and r["step"] == "train")
    assert compile_row["status"] == "n/a" and "dynamo" in compile_row["provenance"]
    defaults = [r for r in rows if r["variant"] == "eager-defaults"]
    assert [r["flush_denormal"] for r in defaults] == [False, False] and defaults[0]["steps_per_round"] == 1
    nofold = next(r for r in rows if r["variant"] == "nofold" and r["step"] == "train")
    assert nofold["executed_gflop_per_step"] == nofold["model_gflop_per_step"]
    compared = {(c["variant"], c["step"]) for c in doc["comparisons"] if c["step"] in ("train", "eval")}
    assert compared == {(v, k) for v in ("torch:eager-defaults", "jax:flax", "jax:scan", "jax:jit", "jax:nofold",
                                         "jax:fused") for k in ("train", "eval")}
    assert {c["step"] for c in doc["comparisons"] if c["variant"] == "jax:jit"} >= {"train", "eval", "forward",
                                                                                    "optimizer"}
    assert all(c["baseline"] == "torch:eager" and c["ci95"][0] <= c["ratio"] <= c["ci95"][1] and c["rounds"] == 5
               for c in doc["comparisons"])
    assert [len(doc["rounds"][k]) for k in ("train", "eval", "parts")] == [5, 5, 5]

    if BOTH:
        parity = doc["parity"]
        assert parity["status"] == "ok" and len(parity["losses"]["torch:eager"]) == 5
        # Same float32 weights and batches, dropout 0: the twins agree to rounding (observed 0 on CPU).
        assert parity["max_abs_dloss"]["jax:jit"] < 1e-5

    md = (out / "results.md").read_text(encoding="utf-8")
    assert "| tier | variant | step | kernel | parity |" in md and "## Parity" in md and "## Environment" in md
    assert "## Where the training step's time goes" in md
    for chart in ("time_per_step.png", "time_parts.png", "parity_loss.png") if BOTH else ("time_per_step.png",):
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


    compare = run_bench("compare", str(out), str(out / "results.json"), "--out", str(out / "same.md"), timeout=60)
    assert compare.returncode == 0, compare.stderr
    line = next(x for x in compare.stdout.splitlines() if x.startswith("jax:jit") and " train " in x)
    assert line.split()[-1] == "1.00×"  # a run against itself
    assert (out / "same.md").read_text(encoding="utf-8").startswith("# Two benchmark runs side by side")


@pytest.mark.slow
def test_lm_quick_run_times_its_rows_with_parity_at_a_small_lr_and_counts_the_decoder(tmp_path):
    out = tmp_path / "lm"
    proc = run_bench("--workload", "lm", "--quick", "--no-progress", "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    cfg = doc["base_config"]
    assert (cfg["workload"], cfg["embed_dim"], cfg["hidden_dim"], cfg["batch_size"], cfg["bptt"]) == (
        "lm", 16, 16, 8, 16)  # the quick sizes over the LM's defaults (SGD at lr 20, V 10 000 kept)
    rows = {(r["variant"], r["step"]): r for r in doc["results"] if r["sweep"] is None}
    for v in ("eager", "scan", "flax"):
        for kind in ("train", "eval"):
            r = rows[v, kind]
            assert r["status"] == "ok" and r["step_s"]["median"] > 0 and r["rounds"] == 5, (v, kind, r["error"])
            # samples are tokens: bptt × B in training, bptt × the example's 10 columns in evaluation
            tokens = 16 * (8 if kind == "train" else 10)
            assert r["samples_per_s"] == pytest.approx(tokens / r["step_s"]["median"], rel=1e-9)
            # the model's FLOPs count the decoder (H → V at every token), three quarters and more of them here
            model = step_flops(SimpleNamespace(**cfg), kind, doc["vocab_size"]) / 1e9
            decoder = tokens * 2 * 16 * doc["vocab_size"] * (3 if kind == "train" else 1) / 1e9
            assert r["model_gflop_per_step"] == pytest.approx(model) and model > decoder > 0
            assert r["executed_gflop_per_step"] == pytest.approx(model)
        train = rows[v, "train"]
        assert train["parity_ok"] is True and train["fallback"] is None
        assert all(train["parts"][p]["median"] > 0 for p in ("forward", "optimizer", "decoder"))
    assert doc["vocab_size"] == 10_000
    assert "aten::mkldnn_rnn_layer" in rows["eager", "train"]["provenance"]["kernels"]
    assert [rows[v, "train"]["provenance"]["kernels"][0] for v in ("scan", "flax")] == ["impl:scan", "impl:flax"]
    # Parity at lr 0.1, where SGD does not amplify float32 rounding as the example's 20 does: agreement to rounding.
    parity = doc["parity"]
    assert parity["status"] == "ok" and len(parity["losses"]["torch:eager"]) == 5
    assert all(0 <= parity["max_abs_dloss"][k] < 1e-5 for k in ("jax:scan", "jax:flax", "jax:fused"))
    # cuDNN on the CPU: not applicable, with the reason jax_impl.recurrences.choice gives.
    cudnn = rows["cudnn", "train"]
    assert cudnn["status"] == "n/a" and cudnn["step_s"] is None
    assert cudnn["error"] == "--lstm-impl cudnn: it needs a CUDA GPU, and this backend is cpu"
    assert ("compile", "train") not in rows  # --quick leaves torch:compile out (plan.LM_QUICK_LEAVES_OUT)
    # The variant list names the row jax_impl.train's default runs, as choice.auto answers in the workers.
    impl, why = auto(Run(workload="lm", platform="cpu"))
    assert [k for k, said in doc["variants"].items() if "jax_impl.train's default here" in said] == [f"jax:{impl}"]
    assert doc["variants"][f"jax:{impl}"].endswith(f". jax_impl.train's default here (--lstm-impl auto: {why})")
    compared = {(c["variant"], c["step"]) for c in doc["comparisons"]}
    assert {(v, k) for v in ("jax:scan", "jax:flax") for k in ("train", "eval", "decoder")} <= compared
    assert "Stock against stock, torch:eager being PyTorch's nn.LSTM: " in proc.stdout and "tokens/s" in proc.stdout
    md = (out / "results.md").read_text(encoding="utf-8")
    assert md.startswith("# LSTM twins benchmark: the word-level language model") and "| decoder ms |" in md


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "absent", "no such results directory or results.json"),
    (lambda d: (d / "bad.json").write_text("[1, 2", encoding="utf-8") and d / "bad.json", "not a bench results.json"),
])
def test_compare_with_a_missing_or_malformed_run_prints_one_line_and_exits_2(make, message, tmp_path, capsys):
    bad = make(tmp_path)
    assert bench.main(["compare", str(bad), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: compare: ") and message in err and err.count("\n") == 1


def test_out_holding_earlier_results_is_refused_unless_overwrite(tmp_path, capsys, monkeypatch):
    (tmp_path / "results.json").write_text("{}", encoding="utf-8")
    assert bench.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {tmp_path}: holds the results of an earlier run; choose another directory, or pass " \
                  "--overwrite to replace them\n"
    assert (tmp_path / "results.json").read_text(encoding="utf-8") == "{}"  # untouched
    monkeypatch.setattr(bench, "speed_main", lambda ns, *rest: print(bench.output_dir(ns.out, ns.overwrite)) or 0)
    assert bench.main(["--out", str(tmp_path), "--overwrite"]) == 0


@pytest.mark.parametrize("make, message", [
    (lambda d: (d / "f").write_text("mine", encoding="utf-8") and d / "f" / "bench", "is a file)"),
    (lambda d: "/proc/self/bench", "cannot write there ("),
    (lambda d: "/proc/self", "cannot write there ("),  # a directory that exists, where no file can be made
])
def test_an_out_that_cannot_be_written_is_refused_before_any_worker_starts(make, message, tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.setattr(bench.harness, "run", lambda *args, **kwargs: pytest.fail("a worker started"))
    out = make(tmp_path)
    assert bench.main(["--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {out}: ") and message in err and err.count("\n") == 1


def test_convergence_mode_refuses_an_unwritable_out_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench.convergence, "main", lambda *args: pytest.fail("trained before refusing"))
    (tmp_path / "f").write_text("mine", encoding="utf-8")
    assert bench.main(["--mode", "convergence", "--out", str(tmp_path / "f" / "conv")]) == 2
    assert capsys.readouterr().err == (f"error: --out {tmp_path / 'f' / 'conv'}: cannot write there "
                                       f"({tmp_path / 'f'} is a file)\n")


def test_help_states_each_default_once():
    text = " ".join(bench.build_parser().format_help().split())  # unwrapped
    own = text[text.index("benchmark:"):]  # the benchmark's options, after the Config's
    assert "(default 6, with --full 8, with --quick 5) --replicates" in own and "(default: None)" not in own
    assert "(default: installed) --variants" in text and "timed out (default: 1800.0)" in text
    assert "(default bench-results/<timestamp>/) --overwrite" in text


def test_coverage_needs_three_runs(tmp_path, capsys):
    assert bench.main(["coverage", str(tmp_path), str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: coverage: needs at least 3 runs, got 2\n"


def test_a_missing_twin_is_named_and_skipped_by_default_but_refused_when_asked_for(monkeypatch, capsys):
    monkeypatch.setattr(bench, "missing_modules", lambda name: ["torch"] if name == "torch" else [])
    assert bench.resolve_frameworks(None) == ["jax"]
    assert "skipping the torch twin: torch not installed" in capsys.readouterr().err
    with pytest.raises(bench.ConfigError, match="--frameworks torch: not installed"):
        bench.resolve_frameworks("torch,jax")


def test_full_sets_the_longer_counts_and_every_variant_and_the_default_leaves_the_parts_to_it():
    def settings(*argv):
        ns = parse_with_workload(bench.build_parser(), list(argv))
        return bench.settings_from(ns, bench.base_config(ns))

    assert {k: settings()[k] for k in bench.DEFAULTS} == {"rounds": 6, "steps": 1, "eval_steps": 1, "parts_steps": 0,
                                                          "warmup": 1, "parity_steps": 10, "replicates": 2}
    assert {k: settings("--full")[k] for k in bench.FULL} == bench.FULL
    assert settings("--full", "--rounds", "12")["rounds"] == 12  # a count named still wins
    assert settings("--workload", "lm")["parts_steps"] == 1  # the decoder's share is the LM comparison's point
