"""Helpers shared by the command-line tests: run ``gpvi`` in process, check a one-line error,
write and read CSV files."""
import csv

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


def write_csv(path, header, rows):
    """Write ``rows`` under ``header`` to the CSV file ``path``; returns ``path``."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def read_csv(path):
    """``(header, rows)`` of the CSV file ``path``, every cell a string."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]
