"""The results schema: a written run reads back whole, and a file compare and coverage cannot read is refused in
one line naming it."""
import json
from dataclasses import asdict

import pytest

from benchmarks import results, schema
from benchmarks.tests.sessions import CFG, configs, session
from common.errors import ConfigError


@pytest.mark.parametrize("content, message", [
    (None, "no such results directory"), ("{not json", "not a bench"),
    ('{"results": "x"}', "no results list"),
    ('{"schema_version": 4, "results": []}', "schema_version 4; this bench reads version 5 only"),
    ('{"schema_version": 5, "results": [], "comparisons": []}',
     r"holds no results \(a run in which nothing was measured\)$"),
    ('{"schema_version": 5, "results": [{"variant": 1}]}', r"results\[0\]\.framework is missing"),
    ('{"schema_version": 5, "results": [{"framework": "jax", "variant": "jit", "step": "train", "sweep": null, '
     '"step_s": 0.1}]}', r"results\[0\]\.step_s is missing or of the wrong type"),
    ('{"schema_version": 5, "results": [{"framework": "jax", "variant": "jit", "step": "train", "sweep": null, '
     '"step_s": {"median": "fast"}}]}', r"results\[0\]\.step_s\.median is not a positive number"),
    ('{"schema_version": 5, "results": [], "comparisons": [{"variant": "jax:jit", "step": "train", "sweep": null, '
     '"ratio": 1.2}]}', r"comparisons\[0\]\.ci95 is missing or of the wrong type"),
    ('{"schema_version": 5, "results": [], "comparisons": [{"variant": "jax:jit", "step": "train", "sweep": null, '
     '"ratio": 1.2, "ci95": [1.1, "1.3"]}]}', r"comparisons\[0\]\.ci95 is not \[low, high\]")])
def test_reading_a_run_refuses_a_missing_malformed_or_other_version_file_naming_it(tmp_path, content, message):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    for spec in (str(path), str(tmp_path)):  # the file, or the directory that holds it
        with pytest.raises(ConfigError, match=message) as err:
            schema.read_run(spec)
        assert str(err.value).count("\n") == 0 and (content is None or str(path) in str(err.value))


def test_a_written_run_reads_back_with_every_row_field(tmp_path):
    s = session()
    rows = results.rows_for(s, configs(s), None, peak=10.0)
    comparisons = results.comparisons_for(s, None)
    run = schema.Run(schema.SCHEMA_VERSION, ["bench.py"], {}, {}, CFG, 30, {}, {"gflop_s": 10.0}, rows,
                     comparisons, results.tier_sentences(rows, comparisons), s.rounds, {}, results.parity({}, 0),
                     [])
    schema.write_json(run, tmp_path / "results.json")
    doc = schema.read_run(str(tmp_path))
    assert doc == json.loads(json.dumps(asdict(run)))
    assert set(doc["results"][0]) == {f for f in schema.Row.__dataclass_fields__}  # no key beside the schema's
