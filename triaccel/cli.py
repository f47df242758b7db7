"""``triaccel`` command line: a thin shell over the Trainer and the search service.

Bad input (missing file, bad YAML, unknown key, model or dataset, missing data) exits with
status 2 and one line ``triaccel: error: ...``; never a traceback.
"""
from __future__ import annotations

import argparse
import sys

from triaccel.errors import Interrupted, TriAccelError


def _stop_at_a_step_on_sigterm() -> None:
    """SIGTERM during `train`: the loop stops at its next step (errors.check_stop; no exception raised
    into whatever library call is running: one landing inside MLflow's SQL layer leaves the run
    RUNNING), then the run is closed KILLED and the CLI exits 143. A second SIGTERM stops at once."""
    import signal
    import threading

    from triaccel import errors

    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum, frame):
        if errors.stop_requested():
            raise KeyboardInterrupt
        errors.request_stop(signum)

    signal.signal(signal.SIGTERM, on_term)


def cmd_train(args) -> int:
    from triaccel.api import train

    _stop_at_a_step_on_sigterm()
    train(args.config, overrides=args.set, save_dir=args.save, resume=args.resume)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error format: one line naming the command and what is wrong,
    exit 2 (argparse alone prints its whole usage block above the error, three to six lines for
    `search`; the usage is one `--help` away, and the line says so). Subcommands inherit it."""

    def error(self, message: str):
        cmd = self.prog.removeprefix("triaccel").strip()
        where = f"{cmd}: " if cmd else ""
        self.exit(2, f"triaccel: error: {one_line(where + message)} (`{self.prog} --help` lists the options)\n")


def one_line(message: str) -> str:
    """An error message on one line: a value that holds a line break (`--config $'a\\nb'`) is
    echoed with it escaped, as argparse's own messages do."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


class _Once(argparse.Action):
    """An option that takes one value: given twice, it is refused (argparse alone keeps the last
    without a word: `--config a.yaml --config b.yaml` would train b). An empty value is refused where
    ``empty`` says why (an empty --config would name the current folder); elsewhere the command's own
    check names it."""

    def __init__(self, *args, empty: str | None = None, **kw):
        self.empty = empty
        super().__init__(*args, **kw)

    def __call__(self, parser, namespace, value, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} given twice ({getattr(namespace, self.dest)!r} and {value!r}): give one")
        if self.empty and not value.strip():
            parser.error(f"{option_string} {value!r}: {self.empty}")
        setattr(namespace, self.dest, value)


_YAML = "an empty path; give a YAML file"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="triaccel", description="Tri-Accel training and threshold search")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one run from a config YAML")
    t.add_argument("--config", required=True, action=_Once, empty=_YAML,
                   help="training config YAML (configs/*.yaml, or an exported one)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set optim.lr=0.1 (repeatable)")
    t.add_argument("--save", action=_Once, empty="an empty path; give a folder", metavar="DIR",
                   help="write the training state to DIR/last.pt after every epoch and the trained model to "
                        "DIR/model.pt (a folder holding an earlier run's is refused without --resume)")
    t.add_argument("--resume", action="store_true",
                   help="continue the run whose checkpoint is in --save DIR, after its last finished epoch")
    t.set_defaults(func=cmd_train)

    try:
        from triaccel.search import cli as search_cli
    except ImportError:  # pragma: no cover - search extras missing
        search_cli = None
    if search_cli is not None:
        search_cli.add_commands(sub, once=_Once)
    # defined here, not in triaccel.profile: importing that (torch) would make `triaccel --help` take 2 s,
    # and a Ctrl-C in those seconds print a traceback
    pr = sub.add_parser("profile", help="find the real bottleneck of a config before tuning anything")
    pr.add_argument("--config", required=True, action=_Once, empty=_YAML,
                    help="training config YAML to profile (configs/*.yaml, or an exported one)")
    pr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set batch_size=256 (repeatable)")
    pr.add_argument("--steps", type=int, default=20, help="timed steps per measurement (medians)")
    pr.add_argument("--warmup", type=int, default=5, help="untimed steps before each measurement (default 5)")
    pr.add_argument("--out", help="folder for report.json, report.txt, trace.json (default: a temp folder)")
    pr.add_argument("--force", action="store_true", help="replace an earlier profile's files in --out")
    pr.set_defaults(func=cmd_profile)
    p.commands = dict(sub.choices)  # name -> its parser (main() reports unknown arguments through it)
    return p


def cmd_profile(args) -> int:
    from triaccel.profile import cmd_profile as run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    from triaccel import errors

    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the command's own parser: it names the command and its --help
            parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    except KeyboardInterrupt:  # Ctrl-C while the command line is read: no traceback
        print("triaccel: interrupted", file=sys.stderr)
        return 130
    errors.stop_on_ctrl_c()
    errors.stop_on_sigterm()
    try:
        from triaccel import progress

        progress.delay()  # an unusable TRIACCEL_PROGRESS_DELAY: said before anything runs or is written
        return int(args.func(args) or 0)
    except Interrupted as e:
        print(f"triaccel: interrupted: {e}", file=sys.stderr)
        return 143 if errors.TERMINATED else 130
    except TriAccelError as e:
        print(f"triaccel: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("triaccel: interrupted", file=sys.stderr)
        return 143 if errors.TERMINATED else 130
    except BrokenPipeError:
        # the reader of stdout went away (`triaccel train ... | head -1`): stop quietly, as a Unix tool
        # killed by SIGPIPE does, not with a traceback; stdout goes to /dev/null so the interpreter's final
        # flush at exit does not raise again
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def entry() -> None:
    """The ``triaccel`` command: ``main``, then an exit that skips the interpreter's finalization.

    What has to happen at exit still does: threads that are not daemons are told to end and joined,
    the atexit handlers run (Ray's shutdown, logging's flush, MLflow's), and stdout and stderr are flushed.
    What is skipped is the teardown of every module and object, about 3 s of wall time (and as much
    CPU) after a search with torch, Ray and MLflow loaded, paid by every command a script runs."""
    code = main()
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)  # under cProfile or a debugger: they write their results after the program returns
    import atexit
    import os
    import threading

    # the interpreter's own first step at exit: the threading module's exit hooks, which tell idle
    # thread-pool workers (concurrent.futures: Inductor's compile workers, a user's executor) to end,
    # then every non-daemon thread joined. Joining alone waited for those workers for ever.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a stream already closed
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
