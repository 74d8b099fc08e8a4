"""The metrics JSONL and the seed's log line."""
from __future__ import annotations

import json

import pytest

from common.metrics import MetricsLog, evaluations, log_line, read_metrics
from common.tests.losses import step_losses


def _records(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_metrics_log_writes_one_json_record_per_line(tmp_path):
    path = tmp_path / "sub" / "m.jsonl"
    with MetricsLog(path) as log:
        log.write(step=1, epoch=1, loss=0.5)
        log.write(step=1, split="val", loss=0.4, accuracy=0.75)
    assert _records(path) == [{"step": 1, "epoch": 1, "loss": 0.5},
                              {"step": 1, "split": "val", "loss": 0.4, "accuracy": 0.75}]


def test_a_new_log_without_truncate_after_starts_empty(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 9, "epoch": 1, "loss": 1.0}\n', encoding="utf-8")
    with MetricsLog(path) as log:
        log.write(step=1, epoch=1, loss=0.5)
    assert [r["step"] for r in _records(path)] == [1]


def test_truncate_after_drops_later_steps_and_half_written_lines_then_appends(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [json.dumps({"step": s, "epoch": 1, "loss": 0.1 * s}) for s in (1, 2, 3, 4)]
    lines.insert(2, json.dumps({"step": 2, "split": "val", "loss": 0.3, "accuracy": 0.5}))
    path.write_text("\n".join(lines) + '\n{"step": 5, "epo', encoding="utf-8")  # killed mid-record
    with MetricsLog(path, truncate_after=2) as log:
        log.write(step=3, epoch=1, loss=0.25)
    records = _records(path)
    assert [(r["step"], r.get("split")) for r in records] == [(1, None), (2, None), (2, "val"), (3, None)]
    assert records[-1]["loss"] == 0.25


def test_truncate_after_on_a_missing_file_starts_one(tmp_path):
    path = tmp_path / "m.jsonl"
    with MetricsLog(path, truncate_after=10) as log:
        log.write(step=11, epoch=2, loss=0.5)
    assert _records(path) == [{"step": 11, "epoch": 2, "loss": 0.5}]


def _header(run_id: str) -> str:
    return json.dumps({"step": 0, "run": {}, "run_id": run_id}) + "\n"


def test_a_resumed_log_continues_the_file_whose_first_record_names_its_run(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(_header("mine") + '{"step": 1, "epoch": 1, "loss": 1.0}\n{"step": 2, "epoch": 1, "loss": 0.9}\n',
                    encoding="utf-8")
    with MetricsLog(path, truncate_after=1, run_id="mine") as log:
        log.write(step=2, epoch=1, loss=0.8)
    assert log.continued and _records(path) == [{"step": 0, "run": {}, "run_id": "mine"},
                                                {"step": 1, "epoch": 1, "loss": 1.0},
                                                {"step": 2, "epoch": 1, "loss": 0.8}]


@pytest.mark.parametrize("first", [_header("another"), '{"step": 1, "epoch": 1, "loss": 1.0}\n'])
def test_a_resumed_log_starts_afresh_a_file_of_another_run_or_of_none(tmp_path, first):
    path = tmp_path / "m.jsonl"
    path.write_text(first, encoding="utf-8")
    with MetricsLog(path, truncate_after=1, run_id="mine") as log:
        log.write(step=2, epoch=1, loss=0.8)
    assert not log.continued and _records(path) == [{"step": 2, "epoch": 1, "loss": 0.8}]


def test_numbers_that_are_not_finite_are_written_as_null(tmp_path):
    path = tmp_path / "m.jsonl"
    with MetricsLog(path) as log:
        log.write(step=1, split="val", loss=float("nan"), perplexity=float("inf"), parts=[1.5, -float("inf")])
    assert json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse) == {
        "step": 1, "split": "val", "loss": None, "perplexity": None, "parts": [1.5, None]}


def _refuse(name: str):
    raise ValueError(f"{name} is not JSON")


def test_metrics_log_without_a_path_writes_nothing(tmp_path):
    with MetricsLog(None) as log:
        log.write(step=1, epoch=1, loss=0.5)
    assert list(tmp_path.iterdir()) == []


def test_log_line_is_the_notebooks_with_validation_accuracy():
    assert log_line(2, 4, 100, 0.123456789, 0.5, 0.8125) == (
        "Epoch: 2/4... Step: 100... Loss: 0.123457... Val Loss: 0.500000... Val Acc: 0.8125")


def _run(tmp_path, steps):
    path = tmp_path / "m.jsonl"
    with MetricsLog(path) as log:
        for step in steps:
            log.write(step=step, epoch=1, loss=step / 10, train_seconds=step * 0.5)
            if step % 2 == 0:
                log.write(step=step, split="val", loss=0.3, accuracy=0.8, train_seconds=step * 0.5)
        log.write(step=steps[-1], split="test", loss=0.35, accuracy=0.79, train_seconds=steps[-1] * 0.5)
    return read_metrics(path)


def test_step_losses_are_the_training_records_in_step_order(tmp_path):
    assert step_losses(_run(tmp_path, [1, 2, 3, 4])) == [0.1, 0.2, 0.3, 0.4]


def test_step_losses_refuse_a_gap_or_a_duplicated_step(tmp_path):
    with pytest.raises(ValueError, match="not 1, 2, 3"):
        step_losses(_run(tmp_path, [1, 2, 4]))
    with pytest.raises(ValueError, match="not 1, 2, 3"):
        step_losses(_run(tmp_path, [1, 2, 2, 3]))


def test_evaluations_select_one_split_or_all(tmp_path):
    records = _run(tmp_path, [1, 2, 3, 4])
    assert [(r["step"], r["split"]) for r in evaluations(records)] == [(2, "val"), (4, "val"), (4, "test")]
    assert [r["accuracy"] for r in evaluations(records, "test")] == [0.79]


def test_read_metrics_without_timing_drops_the_wall_clock_fields_and_the_run_id(tmp_path):
    path = tmp_path / "m.jsonl"
    with MetricsLog(path) as log:
        log.write(step=0, run={}, run_id="mine")
        log.write(step=1, epoch=1, loss=0.5, train_seconds=0.5)
    assert read_metrics(path)[1]["train_seconds"] == 0.5
    assert read_metrics(path, timing=False) == [{"step": 0, "run": {}}, {"step": 1, "epoch": 1, "loss": 0.5}]
