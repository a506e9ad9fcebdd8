"""Helpers shared by the command-line tests: run ``gpvi`` in process, check a one-line error."""
from gpvi.cli import main


def run(capsys, *argv):
    """``(exit code, stdout, stderr)`` of ``gpvi *argv`` run in this process."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_bad_input(rc, err, *needles):
    """The run refused its input as the CLI promises: exit 2, no traceback, one ``gpvi: error:``
    line that contains every needle."""
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpvi: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
