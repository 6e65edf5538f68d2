"""A client command (one that talks to the API) as a `handler` like every other command's: its
coroutine runs on a fresh event loop, and what goes wrong is one line for the user, not a traceback.
Ctrl-C too: exit status 130 (128 + SIGINT, as a shell reports it), with what the command left behind
when it knows (`Interrupted`)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from minions.sdk import ApiUnreachable, MinionsError


class Interrupted(Exception):
    """Ctrl-C stopped a command that knows what it leaves behind; the message says it, and what to do."""


def client_command(
    handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(handler(args))
        except BrokenPipeError:
            # The reader went away (`minions results ... | head`): what it wanted it got. No message, and
            # stdout points at /dev/null so the interpreter's final flush cannot complain either.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0
        except Interrupted as exc:
            print(f"minions: {exc}", file=sys.stderr)
            return 130
        except KeyboardInterrupt:
            print("minions: interrupted", file=sys.stderr)
            return 130
        except (MinionsError, ApiUnreachable) as exc:
            print(f"minions: {exc}", file=sys.stderr)
            return 1
        except (aiohttp.ClientError, OSError) as exc:
            # Connected, then lost (the API stopped mid-answer), or a local file error.
            print(f"minions: {exc or type(exc).__name__}", file=sys.stderr)
            return 1

    return run
