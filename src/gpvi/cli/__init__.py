"""The ``gpvi`` command line: ``gpvi fit``, ``gpvi predict``, ``gpvi demo`` and ``gpvi cache``.

``gpvi fit DATA --target COL --likelihood NAME`` fits a model to a CSV (or Parquet) file and
writes a model file that also records the feature columns, their standardisation and the
label coding, so that ``gpvi predict MODEL DATA`` applies the same preprocessing to new rows.
Without ``--likelihood`` the likelihood is chosen from the target (:func:`_choose_likelihood`:
class labels give bernoulli or, for 3 to 50 classes, softmax; other numbers gaussian) and a
line says which.
``gpvi demo`` fits a Poisson sparse GP to the coal-mining disaster counts that ship with
gpvi, with the ``fpi`` and ``gradient`` engines, and prints and plots the comparison.
``gpvi cache info`` shows the on-disk cache of compiled programs (directory, size, limit) and
``gpvi cache clear`` empties it (see :mod:`gpvi._compile`).

Bad input (a missing file or column, a missing or non-numeric value, a feature or numeric target
value beyond ±1e150, which standardising would overflow, labels outside the
likelihood's support, a corrupt model file, an output path that is an input or cannot be
written, an unknown option value) gives one line ``gpvi: error: …`` on stderr and exit code 2.
Output files are written atomically (a temporary file in the same folder, renamed into place),
so a failed or interrupted run leaves any previous file intact.  An interrupt (Ctrl-C) gives the
one line ``gpvi: interrupted`` and exit code 130, whatever the command was doing.
:func:`main` takes the argument list and returns the exit code, so it can be called in-process.
"""
from gpvi.cli.app import EXIT_BAD_INPUT, EXIT_FIT_FAILED, EXIT_INTERRUPTED, build_parser, main
from gpvi.cli.common import LIKELIHOODS, MODELS
from gpvi.cli.demo import run_demo
from gpvi.cli.predict import predict_columns
from gpvi.cli.table import Table, read_table

__all__ = ["main", "build_parser", "read_table", "Table", "predict_columns", "run_demo", "LIKELIHOODS", "MODELS",
           "EXIT_BAD_INPUT", "EXIT_FIT_FAILED", "EXIT_INTERRUPTED"]
