"""How every command starts and ends: one `error:` line for a user's mistake (never a traceback), SIGTERM handled as
Ctrl-C (temporaries removed, workers stopped), a reader that stops reading (`| head`) ending it quietly, and --help
that shows each option's default and an example."""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import math
import os
import re
import select
import signal
import sys
import threading
from collections.abc import Callable


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is (temporaries removed, workers stopped), then exit 143."""


def _terminate(signum, frame) -> None:
    raise Terminated


_term_owner: int | None = None  # the process whose run_cli handles SIGTERM as Ctrl-C
_held: set[signal.Signals] | None = None  # while a fork runs: the signal mask from before it


def _hold_term() -> None:
    """Before a fork: hold SIGTERM back, so that none reaches the child while it still has the parent's handler
    (CPython drops a signal that lands between fork and the child's reset: the worker then lives on, and the pool
    that terminated it waits for ever)."""
    global _held
    if _term_owner == os.getpid():
        _held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _release_term(child: bool) -> None:
    """After a fork: a child takes SIGTERM's default (a pool's worker ends as it always did, whatever it holds),
    then both let through a SIGTERM held meanwhile."""
    global _held
    if _held is None:
        return
    if child:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if signal.SIGTERM not in _held:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    _held = None


os.register_at_fork(
    before=_hold_term,
    after_in_parent=functools.partial(_release_term, False),
    after_in_child=functools.partial(_release_term, True),
)


def run_cli(main: Callable[..., int | None]) -> Callable[..., int]:
    """Wrap a script's main so that user errors print one `error:` line and exit with their code, SIGTERM stops it
    as Ctrl-C does, and the process ends without a last garbage collection."""

    def wrapped(argv: list[str] | None = None, **kwargs) -> int:
        global _term_owner
        from paraphrastic.fileio import Error  # here, not above: --help is answered before numpy (fileio's) loads

        # at exit, the interpreter's last garbage collection walks every object left, torch's million among them, to
        # free memory the process is giving back anyway: 0.3 s of each command that loaded torch, skipped when frozen
        atexit.unregister(gc.freeze)  # registered once however many commands run in this process
        atexit.register(gc.freeze)
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
        outer, _term_owner = _term_owner, os.getpid() if main_thread else _term_owner
        try:
            return main(argv, **kwargs) or 0
        except Error as e:
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
        except OSError as e:
            if isinstance(e, BrokenPipeError) and stdout_unread():  # `| head` has what it wanted: stop as Unix tools do
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit then writes nowhere
                return 128 + signal.SIGPIPE
            where = f"{e.filename}: " if e.filename else ""
            print(f"error: {where}{e.strerror or e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as e:
            print("interrupted: no partial output was left behind", file=sys.stderr)
            return 143 if isinstance(e, Terminated) else 130
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
                _term_owner = outer

    return wrapped


def stdout_unread() -> bool:
    """Whether standard output is a pipe whose reader has closed it (poll says so of a pipe with no reader left),
    rather than a pipe to a worker that died."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):  # no standard output, or one without a file descriptor
        return False


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help that shows each option's default (where it has one) and keeps the example's line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
        return text + " (default: %(default)s)" if shown and "default" not in text else text


def cli_parser(doc: str, example: str, prog: str | None = None) -> argparse.ArgumentParser:
    """A command's parser: the first paragraph of `doc` as its description, defaults shown, one example; named
    as the example's console command (`python -m paraphrastic.evaluate --help` says paraphrastic-evaluate)."""
    if prog is None and example.startswith("paraphrastic-"):
        prog = example.split()[0]
    return argparse.ArgumentParser(
        prog=prog, description=doc.split("\n\n")[0], epilog=f"example:\n  {example}", formatter_class=HelpFormatter
    )


def refuse_unused(p: argparse.ArgumentParser, args: argparse.Namespace, mode: str, why: str, *dests: str) -> None:
    """One usage error naming each option of `dests` given (off its default) that `mode` would not follow, where a
    run that ignored them would surprise (--dtype float16 giving float32)."""
    given = [f"--{dest.replace('_', '-')}" for dest in dests if getattr(args, dest) != p.get_default(dest)]
    if given:
        p.error(f"{mode} does not take {', '.join(given)} ({why}): leave them out")


def device_name(text: str) -> str:
    """An argparse type for --device: cpu, cuda, cuda:N or auto (any case), else a usage error naming them."""
    name = text.strip().lower()
    if name in ("cpu", "cuda", "auto") or re.fullmatch(r"cuda:\d+", name):
        return name
    raise argparse.ArgumentTypeError(f"{text!r}: expected cpu, cuda, cuda:N (a GPU's number) or auto")


def at_least(low: int, kind=int) -> Callable[[str], int]:
    """An argparse type: a finite number of `kind` that is at least `low`, else a usage error naming the bound."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse
