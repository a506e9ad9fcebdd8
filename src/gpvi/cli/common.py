"""What the command line's sub-commands share: its constants, its usage error and one-line
messages, the model file's metadata and writing it, output paths written atomically and the
progress switch."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

#: real paths of the files this command writes (:func:`remove_stray_temporaries` cleans up after them)
OUTPUTS: list[str] = []

CLI_FORMAT = "gpvi-cli"


#: the newest command-line format version this gpvi reads; files are written with the oldest version
#: that describes them (:func:`file_version`), so that an older gpvi keeps reading what it can
CLI_VERSION = 2


#: The values of ``gpvi fit --likelihood`` (probit: Bernoulli with the probit link).
LIKELIHOODS = ("gaussian", "bernoulli", "probit", "poisson", "ordinal", "laplace", "studentt", "exponential",
               "softmax")


#: The values of ``gpvi fit --model``: sparse GP, full GP, Bayesian GLM, or auto (the default).
MODELS = ("sparse", "full", "glm", "auto")  # the default: auto (gpvi.fitting.defaults.model_kind)


#: the likelihoods whose targets are class labels (stored as the model file's ``labels``)
CLASSIFIERS = ("bernoulli", "probit", "ordinal", "softmax")


#: most classes of a softmax model (one latent GP per class); more is refused
MAX_CLASSES = 50


#: without --likelihood, an integer target with at most this many distinct values is taken for
#: class labels (2: bernoulli, more: softmax); more distinct values, or any non-integer: gaussian
AUTO_INTEGER_CLASSES = 10


def file_version(likelihood: str) -> int:
    """The command-line format version a model file of ``likelihood`` is written with: 2 for
    softmax (which gpvi before it cannot read: it then says "upgrade gpvi"), else 1."""
    return 2 if likelihood == "softmax" else 1


STANDARDISED_TARGET = ("gaussian", "laplace", "studentt")  # identity link: y is standardised for the fit


LOG_LINK = ("poisson", "exponential")


PARQUET_SUFFIXES = (".parquet", ".pq")


class UsageError(Exception):
    """Bad input from the user: reported as one line and exit code 2."""


def split(s):
    return [c.strip() for c in s.split(",") if c.strip()] if s else []


def support_error(target, err):
    msg = str(err).removeprefix("y ")
    return UsageError(f"target column {target!r} {msg}" if not msg.startswith(("contains", "must")) else
                      f"target column {target!r}: {msg}")


def make_likelihood(name, y_codes=None, n_levels=None):
    from gpvi import likelihoods as L

    if name == "gaussian":
        return L.Gaussian(variance=0.1)
    if name == "bernoulli":
        return L.Bernoulli(link="logit")
    if name == "probit":
        return L.Bernoulli(link="probit")
    if name == "poisson":
        return L.Poisson()
    if name == "laplace":
        return L.Laplace(scale=0.2)
    if name == "studentt":
        return L.StudentT(scale=0.2)
    if name == "exponential":
        return L.Exponential()
    if name == "ordinal":
        # Edges at the logits of the empirical cumulative level proportions (half a count added
        # to every level so that empty levels still get distinct edges).
        counts = np.bincount(y_codes.astype(int), minlength=n_levels) + 0.5
        cum = np.cumsum(counts)[:-1] / counts.sum()
        return L.Ordinal(edges=np.log(cum / (1.0 - cum)), shape=1.0)
    raise UsageError(f"unknown likelihood {name!r}; choose from {', '.join(LIKELIHOODS)}")


# ---------------------------------------------------------------------------------------------
# gpvi fit
# ---------------------------------------------------------------------------------------------
def default_out(data: str) -> Path:
    p = Path(data)
    if p.suffix.lower() == ".gz":
        p = p.with_suffix("")
    return p.with_suffix(".gpvi")


def check_writable(path: Path, what: str):
    """Raise a UsageError, before any work is done, when ``path`` cannot be written: its folder
    is missing, is not a folder or is not writable, or ``path`` is a folder.  Writability is
    tested the way the output will be written (a temporary file created and removed in the
    folder), so read-only folders and file systems are caught whoever runs the command."""
    parent = path.parent
    if not parent.exists():
        raise UsageError(f"cannot write {what} {path}: folder {parent} does not exist")
    if not parent.is_dir():
        raise UsageError(f"cannot write {what} {path}: {parent} is not a folder")
    if path.is_dir():
        raise UsageError(f"cannot write {what} {path}: it is a folder")
    if path.exists() and not path.is_file():  # a device or pipe (/dev/null, /dev/stdout): written in place
        if not os.access(path, os.W_OK):
            raise UsageError(f"cannot write {what} {path}: permission denied")
        return
    folder = Path(os.path.realpath(path)).parent  # where the atomic write puts its temporary file
    try:
        with tempfile.TemporaryFile(dir=folder):  # on Linux a file without a name: nothing to clean up
            pass
    except OSError as err:
        raise UsageError(f"cannot write {what} {path}: folder {folder} is not writable "
                         f"({(err.strerror or str(err)).lower()})") from None


def same_file(a, b) -> bool:
    """Whether paths ``a`` and ``b`` name one file: :func:`os.path.samefile` when both exist (so
    symlinks, hard links and spellings such as ``./d.csv`` count), else equal resolved paths."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def refuse_overwriting_input(out, what: str, inputs: dict):
    """UsageError when the output ``out`` is one of ``inputs`` ({description: path}): writing it
    would destroy the input."""
    for name, path in inputs.items():
        if path is not None and same_file(out, path):
            raise UsageError(f"{what} {out} is the {name} {path}: writing it would destroy the {name}; "
                             "choose another --out")


def remember_output(path):
    """Note that this command writes ``path`` (for :func:`remove_stray_temporaries`)."""
    OUTPUTS.append(os.path.realpath(path))


def show_progress(args):
    return not args.quiet and sys.stderr.isatty()


def save_model(fit, out: Path, extra: dict):
    """Write the model file with :func:`gpvi.io.save` (atomic, through a symlink rather than over
    it; a device or pipe such as ``/dev/null`` is written in place)."""
    import gpvi

    gpvi.io.save(fit, out, extra=extra)


def describe_model(fit, kind):
    latents = getattr(fit.model, "latents", None)  # MultiLatent (softmax): one latent per class
    per_class = "" if latents is None else f", {len(latents)} latent functions (one per class)"
    if kind == "sparse":
        inducing = fit.model.inducing if latents is None else latents[0].inducing
        each = "" if latents is None else " each"
        return f"sparse GP ({np.shape(inducing)[0]} inducing inputs{each}, RBF ARD kernel){per_class}"
    if kind == "full":
        return f"full GP (RBF ARD kernel){per_class}"
    return f"Bayesian GLM{per_class}"


def one_line(msg) -> str:
    """``msg`` as one line of plain words (see :func:`plain`)."""
    return " ".join(plain(msg).split())


_PICKLE_ADVICE = re.compile(r"\s*If you trust the file you can load it unsafely.*?(pickle\.load\(\)`?\.?|$)", re.S)


def plain(msg) -> str:
    """``msg`` without NumPy's advice to load a file "unsafely" with ``allow_pickle``: gpvi never
    unpickles a file, and a user must not be told to."""
    text = str(msg)
    if "pickle" not in text:
        return text
    text = _PICKLE_ADVICE.sub("", text)
    text = text.replace("This file contains pickled (object) data.",
                        "it holds pickled Python objects, which gpvi never loads")
    return text.replace("Object arrays cannot be loaded when allow_pickle=False",
                        "it holds Python objects (pickled data), which gpvi never loads")


def remove_stray_temporaries():
    """Remove the temporary files of :func:`gpvi.io.atomic_write` for this command's outputs that
    this process still has open.  An interrupt that lands between the temporary file's creation
    and the start of the write's own clean-up (inside :func:`tempfile.mkstemp`, 1 in 60 tries
    with the interrupt sent as the file appears) leaves it behind; the output itself is intact.
    Only files open in this process are touched, so another process's write is never disturbed.
    Linux (``/proc/self/fd``) only; elsewhere nothing is done."""
    fds = "/proc/self/fd"
    if not OUTPUTS or not os.path.isdir(fds):
        return
    with contextlib.suppress(OSError):
        for fd in os.listdir(fds):
            try:
                target = os.readlink(os.path.join(fds, fd))
            except OSError:
                continue
            folder, name = os.path.split(target)
            for out in OUTPUTS:
                if (folder == os.path.dirname(out) and name.startswith(f".{os.path.basename(out)}.")
                        and name.endswith(".tmp")):
                    with contextlib.suppress(OSError):
                        os.unlink(target)


def open_output(path: Path):
    """Open ``path`` for writing in binary mode with :func:`gpvi.io.atomic_write`: a regular
    file (or a new one) is replaced atomically through any symlink to it, so an error or an
    interrupt leaves a previous file intact; a device or pipe (``/dev/null``, ``/dev/stdout``) is
    written in place."""
    from gpvi.io import atomic_write

    return atomic_write(path, "wb")
