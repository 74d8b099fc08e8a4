"""A session's measurements made results: the rows (one per variant and step kind, over its replicates), the paired
comparisons against the baseline, whether a row's kernel is a fallback, parity and its bands, the GEMM peak, the
warnings, the scaling efficiency, and the headline sentences that open the report (driven by the variant table,
:data:`benchmarks.plan.VARIANTS` and :data:`benchmarks.plan.HEADLINES`). A row's time per step is the median over
every replicate's rounds of the per-round medians; a comparison's ratio and interval are :func:`stats.paired_ratio`'s.
"""
from types import SimpleNamespace
from typing import Sequence

from benchmarks import flops, plan
from benchmarks.plan import BASELINE
from benchmarks.schema import Comparison, EntryResult, Round, Row, Session, Setup
from benchmarks.stats import METHOD, paired_ratio, spread
from benchmarks.tables import pairs

PARITY_TOL = 1e-5  # float32: the twins' losses agree to rounding (parity_tests/test_trajectories.py measures ~1e-6)
# bfloat16 rows against the baseline's float32 losses: the parity suite's band for each twin's bfloat16 against its own
# float32 (parity_tests/test_bfloat16.py: ≤ 1.0e-3 over 50 steps, held at 3e-3); measured here at the seed's
# configuration over the default 20 parity steps: torch:eager 8.7e-4, jax:scan 8.3e-4, jax:flax 7.5e-4.
BFLOAT16_BAND = 3e-3
# The language model's parity steps run at lr 0.1, a 200th of the example's: at lr 20, SGD amplifies float32 rounding
# ~10^4-fold within 20 steps (E = H = 200: max |Δloss| 2.9e-2 by step 20, from 1.9e-6 at step 2; at lr 1 still 2e-4),
# so no float32 band could tell a bug from rounding; at lr 0.1 every JAX row stays within 2.9e-6 of torch:eager over
# 20 steps (1 to 3 float32 ulps of a loss near 9), under the float32 band. (float64 would need every row to compute it;
# oneDNN and our kernel compute float32 only.)
LM_PARITY_LR = 0.1
REFERENCE = f"{BASELINE} float32"  # the parity curve of a bfloat16 run's rows: the baseline's, trained in float32
PARTS = ("forward", "backward", "optimizer")  # the training step's parts, one after the other: they add up to it
# Parts inside them, timed on their own: the language model's decoder and loss, forward and backward (in forward +
# backward; the rest of those two is the embedding and the recurrence).
INNER_PARTS = ("decoder",)


def parity_tol(dtype: str, workload: str = "classifier") -> float:
    """The largest max |Δloss| a row of ``dtype`` may show against its reference curve."""
    return BFLOAT16_BAND if dtype == "bfloat16" else PARITY_TOL


def by_variant(session: Session) -> dict[str, list[EntryResult]]:
    """Each variant's replicates, in the order the variants were set up."""
    out: dict[str, list[EntryResult]] = {}
    for e in session.entries.values():
        out.setdefault(e.label, []).append(e)
    return out


def fallback(label: str, setup: Setup | None) -> str | None:
    """Why the kernel that ran is not the one ``label`` promises on its device (and in its dtype), or None."""
    if setup is None or setup.provenance is None:
        return None
    device = "gpu" if setup.info.get("device") == "cuda" else setup.info.get("device")
    promises = plan.variant(label).kernel
    promised = promises.get(f"{device}:{setup.record.get('dtype')}", promises.get(device))
    kernels = setup.provenance["kernels"]
    if promised and not any(promised in k for k in kernels):
        return f"{label} promises {promised} on the {device}, but its training step ran {', '.join(kernels) or 'none'}"
    return None


def descriptions(session: Session, variants: Sequence[plan.Variant], workload: str = "classifier") -> dict[str, str]:
    """Each variant's description (the language model's where it has one); for ``jax:jit`` (``--lstm-impl auto``),
    what it ran here and why; for a variant that names the implementation ``--lstm-impl auto`` runs here and changes
    nothing else, that it is ``jax_impl.train``'s default here, and why (the workers' ``choice.auto``)."""
    records = {e.label: e.setup.record for e in session.entries.values() if e.setup}

    def said(v: plan.Variant) -> str:
        record = records.get(v.label, {})
        if "lstm_impl_auto" in record:
            return f". Here: {record['lstm_impl_auto']}"
        if set(v.changes) == {"lstm_impl"} and record.get("lstm_impl_default") == v.changes["lstm_impl"]:
            return f". jax_impl.train's default here (--lstm-impl auto: {record['lstm_impl_default_why']})"
        return ""

    return {v.label: (workload == "lm" and v.lm_description or v.description) + said(v) for v in variants}


def samples_per_step(cfg, kind: str) -> int:
    """What a step of ``kind`` processes, the samples of samples/s: the classifier's texts (--batch-size; an
    evaluation batch is padded to it), the language model's tokens predicted (:func:`flops.lm_tokens`)."""
    return flops.lm_tokens(cfg, kind) if getattr(cfg, "workload", "classifier") == "lm" else cfg.batch_size


def rows_for(session: Session, configs: dict[str, dict], sweep: dict | None, peak: float | None,
             parity: dict | None = None) -> list[Row]:
    """One row per variant and step kind, over its replicates that ran (all of them, for one that did not)."""
    rows = []
    # The model's FLOPs are every variant's, the language model's decoder V included: any worker's vocabulary.
    vocab = next((e.setup.vocab_size for e in session.entries.values() if e.setup), 0)
    for name, replicates in by_variant(session).items():
        ran = [e for e in replicates if e.status == "ok"] or replicates[:1]
        e = ran[0]
        cfg = SimpleNamespace(**configs[name])  # not a Config: a skipped variant's choice may not validate
        workload = getattr(cfg, "workload", "classifier")
        setup = e.setup or Setup(0, {}, {}, {})
        record, info = setup.record, setup.info
        folds = record.get("lstm_impl") in ("fused", "kernel") and cfg.embed_fold
        # the kernel folds the embedding over the rows a batch uses only, XLA's fold over the whole table
        used = (setup.distinct_tokens or {}) if record.get("lstm_impl") == "kernel" else {}
        # jax:jit runs --lstm-impl auto's choice: the kernel on an AVX-512 CPU, the stock scan stack under bfloat16
        tier = plan.IMPL_TIERS.get(record.get("lstm_impl"), plan.variant(name).tier)
        dloss = (parity or {}).get("max_abs_dloss", {}).get(name, 0.0 if name == BASELINE and parity else None)
        for kind in ("train", "eval"):
            phase, per_rep = setup.phases.get(kind, {}), [x.round_s.get(kind, []) for x in ran]
            model, used_rows = flops.step_flops(cfg, kind, vocab) / 1e9, used.get(kind)
            step_s = spread([t for r in per_rep for t in r])
            median = step_s and step_s.median
            executed = flops.executed_step_flops(cfg, kind, setup.vocab_size, folds, used_rows) / 1e9 if e.setup \
                else None
            parts = {p: spread([t for x in ran for t in x.round_s.get(p, [])]) for p in PARTS}
            parts.update({p: spread(t) for p in INNER_PARTS if (t := [t for x in ran for t in x.round_s.get(p, [])])})
            rows.append(Row(
                framework=name.split(":")[0], variant=name.split(":", 1)[1], tier=tier, step=kind,
                sweep=sweep, status=e.status, error=e.error,
                provenance=setup.provenance if kind == "train" else None,
                fallback=fallback(name, e.setup) if e.status == "ok" else None,
                parity=dloss, parity_ok=None if dloss is None else dloss <= parity_tol(cfg.dtype, workload),
                config=configs[name],
                lstm_impl=record.get("lstm_impl"), device_name=info.get("device_name"),
                flush_denormal=record.get("flush_denormal"), threads=info.get("threads"),
                compile_s=phase.get("compile_s"), lower_s=phase.get("lower_s"), first_step_s=phase.get("first_step_s"),
                step_s=step_s, parts=parts if kind == "train" and any(parts.values()) else None,
                replicates=len(ran) if step_s else 0, rounds=min((len(r) for r in per_rep), default=0),
                steps_per_round=e.steps_per_round.get(kind), round_s=per_rep,
                samples_per_s=median and samples_per_step(cfg, kind) / median, model_gflop_per_step=model,
                executed_gflop_per_step=executed, achieved_gflop_s=median and executed and executed / median,
                model_gflop_s=median and model / median,
                # The peak is a float32 GEMM's: a row of another dtype has no utilisation against it. Against the
                # FLOPs the variant executes: the model's count would put a fold above the GEMM peak.
                utilisation=median and executed and peak and cfg.dtype == "float32" and executed / median / peak
                or None,
                peak_mem_mb=phase.get("peak_device_mb" if info.get("device") == "cuda" else "peak_rss_mb"),
                nnx_dispatch_ms=phase.get("nnx_dispatch_ms"), nnx_overhead_ms=phase.get("nnx_overhead_ms")))
    return rows


def comparisons_for(session: Session, sweep: dict | None) -> list[Comparison]:
    """Every measured variant against :data:`BASELINE`, per step kind and part, over the rounds both have; a
    variant whose kernel is a fallback (or a baseline that is one) is kept out."""
    out = []
    variants = {k: [e for e in v if e.status == "ok"] for k, v in by_variant(session).items()}
    base = variants.get(BASELINE) or []
    if not base or fallback(BASELINE, base[0].setup):
        return out
    for kind in ("train", "eval", *PARTS, *INNER_PARTS):
        rounds = session.rounds.get("parts" if kind in (*PARTS, *INNER_PARTS) else kind, [])
        base_s = [e.round_s.get(kind) for e in base if e.round_s.get(kind)]
        for name, ran in variants.items():
            times = [e.round_s.get(kind) for e in ran if e.round_s.get(kind)]
            # A part measured as a difference (JAX's backward) can come out at or below 0 on tiny steps: no ratio.
            positive = all(t > 0 for r in (*base_s, *times) for t in r)
            if name != BASELINE and times and base_s and positive and not fallback(name, ran[0].setup):
                ratio, ci = paired_ratio(base_s, times)
                n = min(len(r) for r in (*base_s, *times))
                out.append(Comparison(BASELINE, name, kind, sweep, ratio, ci, n, sum(r.busy for r in rounds[:n]),
                                      METHOD))
    return out


def gemm_peak(measured: dict, device: str) -> dict:
    """The highest rate among the libraries measured on the benchmark ``device`` (numpy counts on the CPU)."""
    on_device = {k: v for k, v in measured.items() if v.get("device") == device}
    best = max(on_device, key=lambda k: on_device[k]["gflop_s"]) if on_device else None
    return {"gflop_s": on_device[best]["gflop_s"] if best else None, "backend": best, "measurements": measured}


def parity(losses: dict, steps: int) -> dict:
    """Each variant's max |Δloss| against the reference loss curve (same weights, same batches, dropout 0):
    :data:`BASELINE`'s, or in a bfloat16 run :data:`REFERENCE` (then the baseline's own curve is compared too)."""
    curves = {k: v for k, v in losses.items() if isinstance(v, list)}
    errors = {k: v for k, v in losses.items() if k not in curves}
    reference = REFERENCE if REFERENCE in losses else BASELINE
    base = curves.get(reference)
    dloss = {k: max(abs(x - y) for x, y in zip(base, v)) for k, v in curves.items() if k != reference} if base else {}
    status = ("skipped (--parity-steps 0)" if steps == 0 else "failed: " + pairs(errors) if errors
              else f"skipped: needs {BASELINE} and another variant in the run" if not dloss else "ok")
    return {"steps": steps, "baseline": reference, "losses": curves, "max_abs_dloss": dloss, "errors": errors,
            "status": status}


def warnings(rows: Sequence[Row], rounds: Sequence[Round]) -> list[str]:
    """What makes this run's numbers less comparable than they look."""
    out = []
    devices = {r.framework: r.device_name for r in rows if r.device_name}
    if len(set(devices.values())) > 1:
        out.append(f"the twins ran on different devices ({devices}): their times are not comparable")
    if any((r.utilisation or 0) > 1 for r in rows):
        out.append("a variant executes more FLOP/s than the measured GEMM peak: the peak measurement was disturbed "
                   "(other work on the machine?), so utilisation figures are unreliable")
    if sum(r.busy for r in rounds):
        out.append(f"{sum(r.busy for r in rounds)} of {len(rounds)} rounds ran while other processes used more "
                   "than half the cores (busy in results.json): times are inflated, paired ratios less so")
    for r in rows:
        if r.step == "train" and r.fallback:
            out.append(f"fallback, kept out of the comparisons: {r.fallback}")
        if r.step == "train" and r.parity_ok is False:
            dtype = r.config["dtype"]
            out.append(f"{r.framework}:{r.variant}: max |Δloss| {r.parity:.3g} against {BASELINE} is beyond "
                       f"{parity_tol(r.config['dtype'], r.config.get('workload', 'classifier')):g} ({dtype}): kept out "
                       "of the tier sentences")
    return out


def add_efficiency(rows: list[Row]) -> None:
    """Rows of a sweep of ``devices``: throughput per device relative to the smallest count (1.0: linear); none where
    that count ran another implementation (jax:jit: our kernel on one device, the fused recurrence over a mesh)."""
    scaled = [r for r in rows if r.sweep and r.sweep["field"] == "devices" and r.sweep["value"] and r.step_s]
    for r in scaled:
        first = min((x for x in scaled if (x.framework, x.variant, x.step) == (r.framework, r.variant, r.step)),
                    key=lambda x: x.sweep["value"])
        r.efficiency = (r.samples_per_s * first.sweep["value"] / (r.sweep["value"] * first.samples_per_s)
                        if first.lstm_impl == r.lstm_impl else None)


def tier_sentences(rows: Sequence[Row], comparisons: Sequence[Comparison]) -> list[str]:
    """One sentence per headline comparison of :data:`plan.HEADLINES` that has a variant to name, in that order,
    each ratio with its interval; then each variant not timed, with its reason. A variant takes part in the
    comparisons its :attr:`plan.Variant.headline` names (in the table's order; a ``fastest`` one: only the
    fastest-training of them) where its base training row was compared with the baseline and is neither a fallback,
    nor beyond its parity band, nor of another tier than the comparison's (jax:jit runs whichever implementation
    ``--lstm-impl auto`` picks: the kernel's tier on an AVX-512 CPU, the stock scan under bfloat16). A variant with a
    :attr:`plan.Variant.versus` also says its training speed against that one's (paired rounds), and one whose row
    measured ``nnx_overhead_ms`` what ``nnx.jit``'s graph traversal costs it a step."""
    base = [r for r in rows if r.sweep is None]
    tiers = {f"{r.framework}:{r.variant}": r.tier for r in base}
    good = {f"{r.framework}:{r.variant}" for r in base if r.step == "train" and r.status == "ok" and not r.fallback
            and r.parity_ok is not False}
    ratio = {(c.variant, c.step): c for c in comparisons if c.sweep is None and c.variant in good}
    trained = {f"{r.framework}:{r.variant}": r for r in base if r.step == "train"}

    def speeds(name: str) -> str:
        said = (("trains", ratio.get((name, "train"))), ("infers", ratio.get((name, "eval"))))
        phrases = [f"{verb} at {c.ratio:.2f}× [{c.ci95[0]:.2f}–{c.ci95[1]:.2f}]" for verb, c in said if c]
        return " and ".join(phrases) + f" the speed of {BASELINE}" + against(name) + overhead(name)

    def against(name: str) -> str:
        """`` (0.97× [0.95–0.99] jax:flax's training speed)``: paired over the rounds both ran, where both count."""
        versus = plan.variant(name).versus
        if versus not in good:
            return ""
        sides = [trained[x].round_s for x in (versus, name)]  # seconds per [replicate][round]
        if not all(r and min(r) > 0 for side in sides for r in side):
            return ""
        r, ci = paired_ratio(*sides)
        return f" ({r:.2f}× [{ci[0]:.2f}–{ci[1]:.2f}] {versus}'s training speed)"

    def overhead(name: str) -> str:
        ms = trained[name].nnx_overhead_ms if name in trained else None
        return "" if ms is None else f", nnx.jit's graph traversal adding {ms:.2f} ms a step over nnx.cached_partial"

    out = []
    words = plan.CELL_WORDS[next((r.config.get("cell", "lstm") for r in base), "lstm")]  # the LM's --cell
    for key, headline in plan.HEADLINES.items():
        taking = [v for v in plan.VARIANTS if key in v.headline and (v.label, "train") in ratio
                  and tiers[v.label] == headline.tier]
        if headline.fastest and taking:
            taking = [max(taking, key=lambda v: ratio[v.label, "train"].ratio)]
        members = [headline.member.format(label=v.label, wording=v.wording.format(**words), speeds=speeds(v.label))
                   for v in taking]
        if members:
            out.append(headline.sentence.format(baseline=BASELINE, members="; ".join(members), **words))
    return out + [f"{r.framework}:{r.variant} ({r.tier}): not timed, {r.status}: {r.error}" for r in base
                  if r.step == "train" and r.status in ("n/a", "skipped")]
