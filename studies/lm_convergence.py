"""The language model's convergence: validation perplexity against training time, both twins, several seeds, beside
an interpolated Kneser-Ney n-gram for scale (``studies.ngram_baseline``'s ``ngram.json`` in ``--out``).

    python -m studies.lm_convergence --seeds 0,1,2 --epochs 1 --out docs/convergence/lm
    python -m studies.lm_convergence --out docs/convergence/lm --summarise-only     # the runs already there

Each seed trains both twins at once with the trainers' own command lines (``--workload lm``: the example's small
model and recipe), each process pinned to a core of its own with one thread, so the two share the machine evenly:
the same initial weights, the same windows in the same order, each framework's own dropout draws. The curves read
the trainers' metrics logs (``runs/<twin>-seed<N>.jsonl``); their time axis is the training steps' own seconds
(evaluation excluded, the first step's compilation included). Writes ``results.json``, ``results.md`` and
``convergence.png`` to ``--out``.

An ``--out`` holding an earlier run's logs of these seeds, or its summary, is refused before anything starts unless
``--overwrite`` (``--summarise-only`` rewrites the summary, reading the logs). The trainers each lead a process group
of their own, so that this program alone decides when they stop: on Ctrl-C, SIGTERM or SIGHUP, or when one fails, it
kills both. Their best-validation checkpoints (which make them score the test split with those weights) live in a
dot-named folder inside ``--out``, removed at the end: a kill of this program that nothing can catch (SIGKILL)
leaves it there, beside the run's output, and nothing in the system's temporary folder.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks import processes
from benchmarks.plan import int_list
from common import interrupts
from common.config import INT64_MAX, Parser, int_at_least
from common.errors import ConfigError, DataError, cli_main
from common.files import Output, atomic_file, check_outputs
from common.lm_data import corpus_path
from common.metrics import evaluations, read_metrics, training_steps

FRAMEWORKS = ("torch", "jax")
LOG_EVERY = 330  # a validation every 330 windows: four an epoch of People's Daily at batch 20, bptt 35
SUMMARY = ("results.json", "results.md", "convergence.png")
POLL_S = 0.2  # how often the twins are looked at: one failing stops the other within this


def train_command(framework: str, seed: int, epochs: int, metrics: Path, save_dir: Path,
                  data: str | None = None) -> list[str]:
    """The trainer's command line of one run (``data``: the corpus, None for the trainers' default). ``--overwrite``:
    this program has already refused an ``--out`` holding these logs, unless told to replace them."""
    return [sys.executable, "-m", f"{framework}_impl.train", "--workload", "lm", *(["--data", data] if data else []),
            "--epochs", str(epochs), "--seed", str(seed), "--log-every", str(LOG_EVERY), "--no-progress",
            "--metrics-out", str(metrics), "--save-dir", str(save_dir), "--overwrite"]


def run_seed(seed: int, epochs: int, runs: Path, best: Path, data: str | None = None) -> None:
    """Both twins of one seed at once, each on a core of its own (``taskset``, where there is one) with one thread
    and in a process group of its own, its best checkpoint and its stderr in ``best``. Whatever ends this early
    (Ctrl-C, a signal :func:`processes.ending_raises` turns into an exit, one twin failing) kills both."""
    pin = shutil.which("taskset")
    cores = sorted(os.sched_getaffinity(0))
    procs: list[subprocess.Popen] = []
    try:
        for index, framework in enumerate(FRAMEWORKS):
            command = train_command(framework, seed, epochs, runs / f"{framework}-seed{seed}.jsonl",
                                    best / f"{framework}-seed{seed}", data)
            if pin and len(cores) >= len(FRAMEWORKS):
                command = [pin, "-c", str(cores[index]), *command]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            # Held: a Ctrl-C between the start and the append would leave a twin nobody stops.
            with open(best / f"{framework}-seed{seed}.stderr", "w", encoding="utf-8") as err, processes.signals_held():
                procs.append(subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=err, start_new_session=True))
        while (codes := [proc.poll() for proc in procs]) != [0] * len(procs):  # None: still running
            failed = next((i for i, code in enumerate(codes) if code), None)
            if failed is not None:  # the other is stopped, not waited for
                said = (best / f"{FRAMEWORKS[failed]}-seed{seed}.stderr").read_text(encoding="utf-8", errors="replace")
                raise ConfigError(f"the {FRAMEWORKS[failed]} run of seed {seed} failed (exit status {codes[failed]}): "
                                  f"{(said.strip().splitlines() or [''])[-1]}")
            time.sleep(POLL_S)
    finally:
        with processes.signals_held():  # a second Ctrl-C cannot leave one running
            for proc in procs:
                if proc.poll() is None:
                    processes.kill_group(proc)


def earlier_run(seeds: Sequence[int]) -> Callable[[Path], str | None]:
    """The refusal of an ``--out`` holding what training ``seeds`` would replace: their metrics logs (the trainers
    start them afresh) or an earlier run's summary; None where it holds neither."""
    def held(out: Path) -> str | None:
        written = [*(out / "runs" / f"{fw}-seed{seed}.jsonl" for seed in seeds for fw in FRAMEWORKS),
                   *(out / name for name in SUMMARY)]
        found = next((p for p in written if p.exists()), None)
        return found and (f"--out {out}: holds an earlier run's {found.relative_to(out)}; choose another directory, "
                          f"or pass --overwrite to replace it")

    return held


def summarise_run(path: Path) -> dict[str, Any]:
    """One run's validation curve (step, training seconds, perplexity), its last validation and its test score."""
    records = read_metrics(path)
    steps = training_steps(records)
    curve = [{"step": v["step"], "train_s": v["train_seconds"], "val_perplexity": v["perplexity"]}
             for v in evaluations(records, "val")]
    test = evaluations(records, "test")[-1]
    seconds = [b["train_seconds"] - a["train_seconds"] for a, b in zip(steps, steps[1:])]
    return {"twin": records[0]["run"]["framework"], "lstm_impl": records[0]["run"]["lstm_impl"],
            "seed": int(path.stem.rsplit("seed", 1)[1]), "steps": steps[-1]["step"],
            "median_step_s": statistics.median(seconds), "train_s": steps[-1]["train_seconds"],
            "val_curve": curve, "val_perplexity": curve[-1]["val_perplexity"], "test_perplexity": test["perplexity"]}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per twin: the seeds' mean and standard deviation of the final validation and the test perplexity, and the
    mean training seconds and median step."""
    out = {}
    for twin in FRAMEWORKS:
        mine = [r for r in runs if r["twin"] == twin]
        if not mine:
            continue
        out[twin] = {"seeds": [r["seed"] for r in mine], "lstm_impl": mine[0]["lstm_impl"]}
        for key in ("val_perplexity", "test_perplexity", "train_s", "median_step_s"):
            values = [r[key] for r in mine]
            out[twin][f"{key}_mean"] = statistics.fmean(values)
            out[twin][f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return out


def table(doc: dict[str, Any]) -> str:
    rows = ["| twin (implementation) | seeds | val perplexity | test perplexity | training s | median step ms |",
            "|---|---|---:|---:|---:|---:|"]
    for twin, s in doc["summary"].items():
        rows.append(f"| {twin} ({s['lstm_impl']}) | {', '.join(map(str, s['seeds']))} | "
                    f"{s['val_perplexity_mean']:.1f} ± {s['val_perplexity_std']:.1f} | "
                    f"{s['test_perplexity_mean']:.1f} ± {s['test_perplexity_std']:.1f} | {s['train_s_mean']:.0f} | "
                    f"{1e3 * s['median_step_s_mean']:.0f} |")
    if doc.get("ngram"):
        n = doc["ngram"]
        rows.append(f"| Kneser-Ney {n['order']}-gram ({n['model']}) | | {n['val']['perplexity']:.1f} | "
                    f"{n['test']['perplexity']:.1f} | {n['fit_s']:.0f} (fit) | |")
    return "\n".join(rows)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"torch": "#ee4c2c", "jax": "#3d7ebf"}
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in doc["runs"]:
        ax.plot([c["train_s"] for c in run["val_curve"]], [c["val_perplexity"] for c in run["val_curve"]], "o-",
                color=colors[run["twin"]], alpha=0.7, label=f"{run['twin']} ({run['lstm_impl']}) seed {run['seed']}")
    if doc.get("ngram"):
        ax.axhline(doc["ngram"]["val"]["perplexity"], color="grey", linestyle=":",
                   label=f"Kneser-Ney {doc['ngram']['order']}-gram")
    ax.set(xlabel="training seconds (the steps alone, one core each)", ylabel="validation perplexity", yscale="log")
    ax.legend(fontsize=7)
    fig.suptitle("The word-level LM on People's Daily: both twins, the example's small model and recipe", fontsize=9)
    fig.tight_layout()
    atomic_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def read_ngram(path: Path) -> dict[str, Any] | None:
    """``studies.ngram_baseline``'s figures in ``path``, or None where there is none; one that is not a JSON
    object is a :class:`DataError` naming it."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError and UnicodeDecodeError
        raise DataError(f"{path}: not studies.ngram_baseline's JSON ({str(err).splitlines()[0]}); write it again "
                        f"with python -m studies.ngram_baseline --out {path} --overwrite, or remove it") from None
    if not isinstance(doc, dict):
        raise DataError(f"{path}: not studies.ngram_baseline's JSON (not an object); write it again with "
                        f"python -m studies.ngram_baseline --out {path} --overwrite, or remove it")
    return doc


def train_all(seeds: Sequence[int], epochs: int, out: Path, data: str | None) -> None:
    """Every seed's two runs, their logs in ``out/runs``, their best checkpoints in a dot-named folder of ``out``
    removed at the end, however the runs end."""
    (out / "runs").mkdir(parents=True, exist_ok=True)
    best = Path(tempfile.mkdtemp(prefix=".lm-best-", dir=out))
    try:
        for seed in seeds:
            interrupts.check()
            run_seed(seed, epochs, out / "runs", best, data)
    finally:
        with processes.signals_held():
            shutil.rmtree(best, ignore_errors=True)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m studies.lm_convergence", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help=f"comma list of seeds, each between 0 and {INT64_MAX}")
    parser.add_argument("--epochs", type=int_at_least(1), default=1, help="epochs per run")
    parser.add_argument("--data", default=None, help="the corpus both trainers read (default: theirs, the People's "
                        "Daily)")
    parser.add_argument("--out", required=True, help="folder for runs/, results.json, results.md, convergence.png")
    parser.add_argument("--summarise-only", action="store_true", help="summarise the runs already in --out/runs, "
                        "rewriting the summary (results.json, results.md, convergence.png)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier run's logs of these seeds and "
                        "its summary in --out")
    args = parser.parse_args(argv)
    out, seeds = Path(args.out), int_list(args.seeds, "--seeds", 0, INT64_MAX)
    if args.data is not None and not corpus_path(args.data).is_file():
        raise DataError(f"--data {args.data}: no such file")
    check_outputs([Output("--out", out, directory=True, contents="the runs' logs and their summary",
                          held=None if args.summarise_only else earlier_run(seeds))], args.overwrite)
    ngram = read_ngram(out / "ngram.json")  # an input: read before the hours of training
    runs_dir = out / "runs"
    if not args.summarise_only:
        with processes.ending_raises():
            train_all(seeds, args.epochs, out, args.data)
    paths = [runs_dir / f"{fw}-seed{seed}.jsonl" for seed in seeds for fw in FRAMEWORKS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ConfigError(f"no metrics log {missing[0]}: run without --summarise-only first")
    runs = [summarise_run(p) for p in paths]
    doc = {"mode": "lm convergence", "seeds": seeds, "epochs": args.epochs, "log_every": LOG_EVERY,
           "commands": [" ".join(train_command(fw, s, args.epochs, Path(f"runs/{fw}-seed{s}.jsonl"), Path("BEST"),
                                               args.data)[1:]) for s in seeds for fw in FRAMEWORKS],
           "runs": runs, "summary": aggregate(runs), "ngram": ngram,
           "environment": processes.environment()}
    if doc["ngram"]:
        doc["ngram"].pop("normalisation", None)  # the n-gram's own self-check, in ngram.json
    atomic_file(out / "results.json", lambda tmp: tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False)))
    plot(doc, out / "convergence.png")
    text = table(doc)
    atomic_file(out / "results.md", lambda tmp: tmp.write_text(
        f"# The language model's convergence\n\n`python -m studies.lm_convergence --seeds {args.seeds} --epochs "
        f"{args.epochs}{f' --data {args.data}' if args.data else ''} --out {args.out}`\n\n{text}\n\n"
        f"![convergence.png](convergence.png)\n", encoding="utf-8"))
    print(text)
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main())
