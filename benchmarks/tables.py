"""What every report of the bench is made of: one value of a results document as a table cell (a time, a ratio with
its interval, a row's kernel or parity) and a table of cells, as aligned text (stdout) or Markdown. The cells read the
document as ``results.json`` holds it (dicts), so that a report can be rebuilt from any saved run."""
from typing import Any, Sequence

from benchmarks.plan import BASELINE


def fmt(x: Any, spec: str) -> str:
    """``x`` formatted by ``spec``, or a dash for a value that was not measured."""
    return "–" if x is None else format(x, spec)


def pairs(d: dict) -> str:
    """A dict as ``k=v, ...`` (nested dicts in parentheses)."""
    return ", ".join(f"{k}: ({pairs(v)})" if isinstance(v, dict) else f"{k}={v}" for k, v in d.items())


def label(r: dict) -> str:
    """A row's variant as ``framework:variant``."""
    return f"{r['framework']}:{r['variant']}"


def ratio_cell(doc: dict, r: dict | None) -> str:
    """``r``'s paired ratio against the baseline with its interval, ``baseline`` on the baseline's own row."""
    if r and label(r) == BASELINE:
        return "baseline"
    c = r and next((c for c in doc["comparisons"] if c["variant"] == label(r) and c["step"] == r["step"]
                    and c["sweep"] == r["sweep"]), None)
    return f"{c['ratio']:.2f}× [{c['ci95'][0]:.2f}–{c['ci95'][1]:.2f}]" if c else "–"


def ms(r: dict | None) -> str:
    """A row's median time per step in milliseconds."""
    return f"{r['step_s']['median'] * 1e3:.1f}" if r and r["step_s"] else "–"


def kernel(r: dict) -> str:
    """The provenance in a table cell: torch's LSTM op, or JAX's implementation and the loops its step compiled to."""
    prov = r["provenance"]
    if not prov:
        return "–"
    if r["framework"] == "torch":  # the op, and the dtypes the LSTM's ops computed in (the ATen cell: its matmuls')
        ops = [k.removeprefix("aten::") for k in prov["kernels"] if k.startswith("aten::") and k != "aten::lstm"]
        dtypes = sorted({d for v in prov.get("kernel_dtypes", {}).values() for d in v})
        return ", ".join([min(ops, key=len)] if ops else prov["kernels"][:1]) + "".join(f" {d}" for d in dtypes) + (
            " + dynamo" if "dynamo:lstm" in prov["kernels"] else "")
    calls = [c for c in prov["custom_calls"] if "rnn" in c or "lstm" in c]
    library = (f" (oneDNN {prov['onednn']})" if prov.get("onednn") else
               f" ({prov['gemm']} GEMM, {prov['kernel_threads']} threads)" if prov.get("kernel_threads") else "")
    impl = next((k.removeprefix("impl:") for k in prov["kernels"] if k.startswith("impl:")), r["lstm_impl"])  # nnx.flax
    return f"{impl}, {prov['float_while_loops']} loops" + "".join(f", {c}" for c in calls) + library


def parity_cell(r: dict) -> str:
    """A row's max |Δloss| against its reference curve, ``base`` for the reference itself, (!) beyond its band."""
    if r["parity"] is None:
        return "–"
    base = label(r) == BASELINE and r["config"]["dtype"] != "bfloat16"  # bfloat16: against its float32
    return ("base" if base else f"{r['parity']:.1e}") + ("" if r["parity_ok"] else " (!)")


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    """``rows`` under ``columns``: a Markdown table, or text columns padded to their widest cell."""
    if markdown:
        cell = lambda c: str(c).replace("|", "\\|")  # noqa: E731
        return "\n".join(["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
                         + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows])
    widths = [max([len(str(c))] + [len(str(r[i])) for r in rows]) for i, c in enumerate(columns)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in rows])
