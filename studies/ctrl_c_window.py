"""How soon after a command starts Ctrl-C is answered with one line and exit 130: ``python -m studies.ctrl_c_window
[--tries N] [--delays-ms 0,5,...] [--program jax_impl.train ...]``.

Each program (``python -m PROGRAM --max-steps 2``) is started ``--tries`` times per delay and sent SIGINT that many
milliseconds after it was started; each outcome is one of ``line`` (one line on stderr, exit 130), ``python`` (a
traceback from Python's own start: ``site``, ``runpy``, before any of the project's code), ``traceback`` (one through
the project's code), ``killed`` (ended by the signal, without a word), ``lost`` (still running a minute later) or
``other`` (any other status or output). The window is the smallest delay from which every try of every larger delay
gave ``line``; Python's own start is part of it, and lasts longer on a busy machine.
"""
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import interrupts
from common.config import Parser, int_at_least
from common.errors import cli_main

PROG = "python -m studies.ctrl_c_window"
ROOT = Path(__file__).resolve().parents[1]  # where ``python -m PROGRAM`` finds it
OUTCOMES = ("line", "python", "traceback", "killed", "lost", "other")


def outcome(argv: list[str], delay_s: float, cwd: Path = ROOT) -> str:
    """What the command ``argv`` (run in ``cwd``) does when sent SIGINT ``delay_s`` after it started."""
    # SIGINT at its default in the command, as a terminal's: exec resets a handled one, not an ignored one
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if ignored else None)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    try:
        err = proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return "lost"
    if "Traceback" in err:
        return "traceback" if any(f'File "{cwd / package}/' in err for package in interrupts.PACKAGES) else "python"
    if proc.returncode == -signal.SIGINT and not err:
        return "killed"
    return "line" if proc.returncode == 130 and err.count("\n") == 1 else "other"


def window(counts: dict[int, dict[str, int]]) -> int | None:
    """The smallest delay (ms) from which every try gave ``line``; None where the largest delay's did not."""
    start = None
    for delay in sorted(counts, reverse=True):
        if counts[delay]["line"] < sum(counts[delay].values()):
            break
        start = delay
    return start


def delays(text: str) -> list[int]:
    """``--delays-ms``: comma-separated milliseconds, 0 to 10000."""
    return sorted({int_at_least(0, 10_000)(value) for value in text.split(",")})


@cli_main
def main(argv: list[str]) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int_at_least(1, 1000), default=10)
    parser.add_argument("--delays-ms", type=delays, default=list(range(0, 65, 5)))
    parser.add_argument("--program", action="append", choices=("jax_impl.train", "torch_impl.train"))
    args = parser.parse_args(argv)
    for program in args.program or ["jax_impl.train", "torch_impl.train"]:
        counts = {d: dict.fromkeys(OUTCOMES, 0) for d in args.delays_ms}
        for _ in range(args.tries):  # delays interleaved, so that a busy moment spreads over all of them
            for delay in args.delays_ms:
                counts[delay][outcome([sys.executable, "-m", program, "--max-steps", "2"], delay / 1000)] += 1
        print(f"python -m {program} --max-steps 2, SIGINT after a delay, {args.tries} tries each")
        print("  delay ms  " + "  ".join(f"{o:>9s}" for o in OUTCOMES))
        for delay, row in counts.items():
            print(f"  {delay:8d}  " + "  ".join(f"{row[o]:9d}" for o in OUTCOMES))
        start = window(counts)
        print(f"  one line from {start} ms on" if start is not None else "  no delay tried gave one line every time")
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main(sys.argv[1:]))
