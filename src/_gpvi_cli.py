"""The ``gpvi`` command's entry point: Ctrl-C is handled from the first instant.

Importing gpvi (JAX, XLA) takes over a second before :func:`gpvi.cli.main` can install its
interrupt handling, and an interrupt then ended the command with Python's traceback and the
signal's own exit status.  This module uses only the standard library and is imported first:
until the command takes over, SIGINT prints the command's one line, ``gpvi: interrupted``, and
ends the process with exit code 130 (without the interpreter's teardown, which could race
threads of a half-initialised runtime).  It lives outside the gpvi package because importing any
module of the package imports JAX first.
"""
import os
import signal
import sys

EXIT_INTERRUPTED = 130


def _interrupted(signum=None, frame=None):
    try:
        sys.stderr.write("gpvi: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


def main():
    early = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not ignored by a parent
    if early:
        signal.signal(signal.SIGINT, _interrupted)
    try:
        from gpvi.cli import main as cli_main

        if early:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # the command takes over
        return cli_main()
    except KeyboardInterrupt:  # in the instant between giving SIGINT back and the command's handling
        _interrupted()


if __name__ == "__main__":
    sys.exit(main())
