"""The language model's convergence: its summary (curves, per-twin means over seeds, the n-gram beside them), the
refusal of what a run would lose, and its twins stopped with it."""
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from studies import lm_convergence
from common.tests.lm_corpus import write_lm_corpus

REPO = Path(__file__).resolve().parents[2]


def write_run(folder, framework, seed, perplexities, step_s):
    lines = [{"step": 0, "run": {"framework": framework, "lstm_impl": "scan" if framework == "jax" else "nn.LSTM"}}]
    for step in range(1, 7):
        lines.append({"step": step, "epoch": 1, "loss": 6.0, "train_seconds": step * step_s})
        if step % 3 == 0:
            ppl = perplexities[step // 3 - 1]
            lines.append({"step": step, "split": "val", "loss": math.log(ppl), "perplexity": ppl,
                          "train_seconds": step * step_s})
    lines.append({"step": 6, "split": "test", "loss": 5.0, "perplexity": perplexities[-1] - 10, "train_seconds": 1})
    path = folder / f"{framework}-seed{seed}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_each_run_gives_its_validation_curve_on_the_training_seconds(tmp_path):
    run = lm_convergence.summarise_run(write_run(tmp_path, "jax", 2, [400.0, 300.0], 0.5))
    assert run["seed"] == 2 and run["twin"] == "jax" and run["lstm_impl"] == "scan"
    assert run["val_curve"] == [{"step": 3, "train_s": 1.5, "val_perplexity": 400.0},
                                {"step": 6, "train_s": 3.0, "val_perplexity": 300.0}]
    assert (run["val_perplexity"], run["test_perplexity"], run["median_step_s"]) == (300.0, 290.0, 0.5)


def test_the_summary_averages_each_twin_over_its_seeds(tmp_path):
    runs = [lm_convergence.summarise_run(write_run(tmp_path, fw, seed, [500.0, ppl], 0.25))
            for fw, seed, ppl in (("torch", 0, 300.0), ("torch", 1, 310.0), ("jax", 0, 305.0), ("jax", 1, 315.0))]
    summary = lm_convergence.aggregate(runs)
    assert summary["torch"]["val_perplexity_mean"] == 305.0 and summary["jax"]["val_perplexity_mean"] == 310.0
    assert math.isclose(summary["torch"]["val_perplexity_std"], math.sqrt(50.0))
    assert summary["jax"]["seeds"] == [0, 1] and summary["jax"]["median_step_s_mean"] == 0.25


def convergence(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m studies.lm_convergence ARGS`` from the repository root, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "studies.lm_convergence", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Enough of the tiny grammar for the example's model and recipe: 17 windows an epoch, a second each."""
    return write_lm_corpus(tmp_path / "corpus.txt", lines=3000)


def children(pid: int) -> list[int]:
    """The processes ``pid`` started that are still its children (Linux's /proc)."""
    with contextlib.suppress(FileNotFoundError):
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_an_out_holding_an_earlier_runs_logs_is_refused_before_anything_starts(tmp_path, corpus):
    log = tmp_path / "out" / "runs" / "torch-seed1.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("an earlier run's log\n", encoding="utf-8")
    proc = convergence("--seeds", "0,1", "--data", str(corpus), "--out", str(tmp_path / "out"))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"error: --out {tmp_path / 'out'}: holds an earlier run's runs/torch-seed1.jsonl; choose "
                           f"another directory, or pass --overwrite to replace it\n")
    assert log.read_text(encoding="utf-8") == "an earlier run's log\n"
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["runs", "torch-seed1.jsonl"]


def test_an_earlier_summary_is_refused_too_and_overwrite_goes_on_to_train(tmp_path, monkeypatch, capsys):
    (tmp_path / "results.json").write_text("{}", encoding="utf-8")
    assert lm_convergence.main(["--seeds", "0", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: --out {tmp_path}: holds an earlier run's results.json; choose another "
                                       f"directory, or pass --overwrite to replace it\n")
    started = []
    monkeypatch.setattr(lm_convergence, "run_seed", lambda seed, *args: started.append(seed))
    assert lm_convergence.main(["--seeds", "0,1", "--out", str(tmp_path), "--overwrite"]) == 2  # no logs: none ran
    assert started == [0, 1] and "no metrics log" in capsys.readouterr().err


def test_an_ngram_file_that_is_not_json_is_one_line_naming_it_before_any_training(tmp_path, monkeypatch, capsys):
    (tmp_path / "ngram.json").write_text("{", encoding="utf-8")
    monkeypatch.setattr(lm_convergence, "run_seed", lambda *args: pytest.fail("trained before reading ngram.json"))
    assert lm_convergence.main(["--seeds", "0", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'ngram.json'}: not studies.ngram_baseline's JSON (Expecting property name enclosed in "
        f"double quotes: line 1 column 2 (char 1)); write it again with python -m studies.ngram_baseline --out "
        f"{tmp_path / 'ngram.json'} --overwrite, or remove it\n")


@pytest.mark.parametrize("seeds, message", [
    ("-1", "--seeds: each value must be between 0 and 9223372036854775807, got -1"),
    (f"0,{2**64}", f"--seeds: each value must be between 0 and 9223372036854775807, got {2**64}"),
    ("3,1,3", "--seeds takes distinct values, got 3 twice in '3,1,3'"),
])
def test_every_seed_is_checked_before_anything_is_made(tmp_path, seeds, message):
    proc = convergence("--seeds", seeds, "--out", str(tmp_path / "out"))
    assert (proc.returncode, proc.stderr) == (2, f"error: {message}\n")
    assert not (tmp_path / "out").exists()


def leaders(pids: list[int]) -> bool:
    """Whether each of ``pids`` leads its own process group."""
    try:
        return all(os.getpgid(pid) == pid for pid in pids)
    except ProcessLookupError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the twins through Linux's /proc")
@pytest.mark.parametrize("signum, status, said", [(signal.SIGINT, 130, "interrupted\n"), (signal.SIGTERM, 143, "")],
                         ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_both_twins_and_removes_their_best_checkpoints(tmp_path, corpus, signum, status, said):
    out = tmp_path / "out"
    before = set(Path(tempfile.gettempdir()).glob("lm-best-*"))
    proc = subprocess.Popen([sys.executable, "-m", "studies.lm_convergence", "--seeds", "0", "--epochs", "1000",
                             "--data", str(corpus), "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    twins: list[int] = []
    try:
        deadline = time.monotonic() + 60
        # Both started, each in the group it leads (a child found between its fork and its setsid has not yet).
        while (len(twins := children(proc.pid)) < 2 or not leaders(twins)) and time.monotonic() < deadline \
                and proc.poll() is None:
            time.sleep(0.05)
        assert len(twins) == 2, proc.communicate(timeout=60)
        assert leaders(twins)  # each leads its group: a terminal's Ctrl-C misses it
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        for pid in twins:  # a failed assertion above leaves them running otherwise
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    assert (proc.returncode, stdout, stderr) == (status, "", said)
    assert all(gone(pid) for pid in twins)
    assert [p.name for p in out.iterdir()] == ["runs"]  # the best checkpoints' folder removed
    assert set(Path(tempfile.gettempdir()).glob("lm-best-*")) == before


@pytest.mark.slow
def test_a_run_trains_both_twins_and_keeps_only_their_logs_and_the_summary(tmp_path, corpus):
    proc = convergence("--seeds", "0", "--epochs", "1", "--data", str(corpus), "--out", str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "convergence.png", "corpus.txt", "results.json", "results.md", "runs", "runs/jax-seed0.jsonl",
        "runs/torch-seed0.jsonl"]
    doc = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert [r["twin"] for r in doc["runs"]] == ["torch", "jax"] and f"--data {corpus}" in doc["commands"][0]
