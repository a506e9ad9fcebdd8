"""Loaders of the real data sets in ``../shared/data`` (see its ``MANIFEST.md``) for the benchmarks.

Shared by several benchmark scripts: **append-only** — add new loaders at the end, never
rewrite someone else's function.  Every loader returns raw (un-normalised) NumPy arrays
``X`` (N, D) float64 and ``y`` (N,) and raises :class:`DataUnavailable` (a ``FileNotFoundError``)
with the missing path when the data are not there, so a script can skip the data set cleanly.
Normalisation (Z-scores with training statistics only) is the caller's job, because it must
be done per training split.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

# ``../shared/data`` relative to the repository root; overridable for other checkouts.
DATA_DIR = Path(os.environ.get("GPVI_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


class DataUnavailable(FileNotFoundError):
    """A data file (or the reader it needs) is missing."""


def data_path(*parts) -> Path:
    """Path of a file under :data:`DATA_DIR`; raises :class:`DataUnavailable` when it is absent."""
    p = DATA_DIR.joinpath(*parts)
    if not p.exists():
        raise DataUnavailable(f"data file not found: {p}")
    return p


def data_available() -> bool:
    """Whether the shared data directory exists at all."""
    return DATA_DIR.is_dir()


def zscore(train, *others):
    """Z-score the columns of ``train`` with its own mean and standard deviation and apply the
    same transform to ``others``.  Columns constant on ``train`` get scale 1 (they become 0).

    Returns ``(train_z, *others_z)``.
    """
    train = np.asarray(train, dtype=np.float64)
    mu = train.mean(axis=0)
    sd = train.std(axis=0)
    sd = np.where(sd > 1e-12 * np.maximum(1.0, np.abs(mu)), sd, 1.0)
    out = [(train - mu) / sd] + [(np.asarray(o, dtype=np.float64) - mu) / sd for o in others]
    return tuple(out) if others else out[0]


# ---- count regression ------------------------------------------------------------------------
def load_abalone_counts():
    """UCI abalone as count regression (Sheth et al. 2015, Table 2): 4177 rows.

    X (4177, 10): one-hot sex (M, F, I) followed by the 7 physical measurements;
    y (4177,): number of rings (integers 1..29).
    """
    import pandas as pd

    df = pd.read_csv(data_path("abalone", "abalone.data"), header=None)
    sex = df.iloc[:, 0].to_numpy()
    onehot = np.stack([(sex == s).astype(np.float64) for s in ("M", "F", "I")], axis=1)
    X = np.concatenate([onehot, df.iloc[:, 1:8].to_numpy(np.float64)], axis=1)
    y = df.iloc[:, 8].to_numpy(np.float64)
    return X, y


def load_blogfeedback_counts(n: int | None = 4000, seed: int = 0):
    """UCI BlogFeedback (``blogData_train.csv`` in the zip), comments in the next 24 h as counts.

    A random subsample of ``n`` rows (drawn with ``seed``; ``None`` = all 52 397) of the 280
    features.  Columns that are constant on the subsample are dropped (they carry nothing and
    would only be zeroed by the Z-scores).  y: non-negative integer counts (64 % zeros, heavy
    tail up to ~1400).
    """
    import zipfile

    import pandas as pd

    with zipfile.ZipFile(data_path("blogfeedback", "BlogFeedback.zip")) as z, z.open("blogData_train.csv") as f:
        arr = pd.read_csv(f, header=None).to_numpy(np.float64)
    if n is not None and n < arr.shape[0]:
        arr = arr[np.sort(np.random.default_rng(seed).choice(arr.shape[0], n, replace=False))]
    X, y = arr[:, :-1], arr[:, -1]
    X = X[:, X.std(axis=0) > 0]
    return X, y


# ---- binary classification -------------------------------------------------------------------
def load_usps_3v5():
    """USPS digits 3 against 5, train and test files pooled: 1540 rows × 256 grey levels.

    y = 1 for a 3 (824 rows), 0 for a 5 (716 rows).  Needs ``h5py`` (the file is HDF5).
    """
    path = data_path("usps", "usps.h5")
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise DataUnavailable(f"reading {path} needs h5py (pip install h5py)") from e
    with h5py.File(path, "r") as f:
        X = np.concatenate([f["train/data"][:], f["test/data"][:]]).astype(np.float64)
        t = np.concatenate([f["train/target"][:], f["test/target"][:]])
    keep = (t == 3) | (t == 5)
    return X[keep], (t[keep] == 3).astype(np.float64)


def load_musk():
    """UCI Musk version 2 (PMLB ``clean2``): 6598 conformations × 166 features, y ∈ {0, 1}
    (1017 musks).  The molecule and conformation names are dropped."""
    import pandas as pd

    df = pd.read_csv(data_path("musk_clean2", "pmlb", "clean2.tsv.gz"), sep="\t")
    y = df["target"].to_numpy(np.float64)
    X = df.drop(columns=["molecule_name", "conformation_name", "target"]).to_numpy(np.float64)
    return X, y


# ---- ordinal regression ----------------------------------------------------------------------
_CHU_FILES = {"stocks": ("stocksdomain", "stock"), "abalone": ("abalone", "abalone"),
              "bostonhousing": ("bostonhousing", "housing"), "machinecpu": ("machinecpu", "machine"),
              "pyrimidines": ("pyrimidines", "pyrim"), "triazines": ("triazines", "triazines"),
              "wisconsin": ("wisconsin", "wisconsin"), "auto-mpg": ("Auto-Mpg", "auto"),
              "diabetes": ("Diabetes", "diabetes")}


def load_chu_ordinal(name: str, bins: int = 5):
    """One of Chu & Ghahramani's (2005) ordinal regression sets, discretised into ``bins``
    (5 or 10) equal-frequency levels by the authors.

    The whole set is split 1's training and test files pooled (every split holds all rows).
    ``name``: stocks (950 × 9), abalone (4177 × 10), bostonhousing (506 × 13), machinecpu,
    pyrimidines, triazines, wisconsin, auto-mpg, diabetes.  y: levels 0..bins−1 (the files
    use 1..bins).
    """
    if name not in _CHU_FILES:
        raise ValueError(f"name must be one of {sorted(_CHU_FILES)}, got {name!r}")
    if bins not in (5, 10):
        raise ValueError(f"bins must be 5 or 10, got {bins!r}")
    folder, stem = _CHU_FILES[name]
    parts = [np.loadtxt(data_path("ordinal_chu_ghahramani", folder, f"{bins}bins", f"{stem}_{s}_{bins}.1"),
                        ndmin=2) for s in ("train", "test")]
    arr = np.concatenate(parts)
    y = arr[:, -1] - 1.0
    if not np.array_equal(np.unique(y), np.arange(bins)):
        raise ValueError(f"{name}: expected levels 1..{bins} in the files, got {np.unique(y + 1)}")
    return arr[:, :-1], y


# ---- added for vlb_time.py (Sheth & Khardon 2016, Figs 2-5) -------------------------------
def load_a9a(test: bool = False):
    """LIBSVM a9a (UCI Adult): train 32 561 × 123 binary features (``test=True``: the 16 281-row
    test file), y ∈ {0, 1} (1 = the LIBSVM +1 class, income > 50K)."""
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(data_path("a9a", "a9a.t" if test else "a9a")), n_features=123)
    return np.asarray(X.todense(), dtype=np.float64), (np.asarray(y) > 0).astype(np.float64)


def load_magic04():
    """UCI MAGIC gamma telescope: 19 020 × 10 real features, y = 1 for gamma ('g', 12 332
    rows), 0 for hadron."""
    import pandas as pd

    df = pd.read_csv(data_path("magic04", "magic04.data"), header=None)
    return df.iloc[:, :10].to_numpy(np.float64), (df.iloc[:, 10] == "g").to_numpy(np.float64)


def load_kin40k():
    """kin40k, the treforevans copy (10k train + 30k test pooled and shuffled): 40 000 × 8
    inputs, real target (already near zero mean, unit variance)."""
    import pandas as pd

    a = pd.read_csv(data_path("kin40k", "treforevans", "data.csv.gz"), header=None).to_numpy(np.float64)
    return a[:, :-1], a[:, -1]


# ---- added for conditions.py (Sheth & Khardon 2016, Fig. 1) ---------------------------------
def load_german_numer():
    """LIBSVM german.numer (Statlog German credit, numeric version): 1000 × 24 features,
    y ∈ {0, 1} (1 = the LIBSVM +1 class, 300 rows)."""
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(data_path("german_numer", "german.numer")), n_features=24)
    return np.asarray(X.todense(), dtype=np.float64), (np.asarray(y) > 0).astype(np.float64)


def load_sarcos(torque: int = 1):
    """SARCOS inverse dynamics, the GPML *test* file (the only one available): 4 449 rows × 21
    inputs (7 joint positions, velocities, accelerations), y = joint torque ``torque`` (1..7)."""
    import scipy.io

    if torque not in range(1, 8):
        raise ValueError(f"torque must be 1..7, got {torque!r}")
    a = scipy.io.loadmat(str(data_path("sarcos", "sarcos_inv_test.mat")))["sarcos_inv_test"]
    return np.asarray(a[:, :21], np.float64), np.asarray(a[:, 20 + torque], np.float64)


# ---- added for izmailov2017.py (Izmailov & Kropotov 2017, Figs 4-7) ----------------------------
def load_svmguide1(test: bool = False):
    """LIBSVM svmguide1: train 3 089 × 4 (``test=True``: the 4 000-row test file), y ∈ {0, 1}."""
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(data_path("svmguide1", "svmguide1.t" if test else "svmguide1")), n_features=4)
    return np.asarray(X.todense(), dtype=np.float64), (np.asarray(y) > 0).astype(np.float64)


def load_cod_rna(test: bool = False):
    """LIBSVM cod-rna from the zip: train 59 535 × 8 (``test=True``: the 271 617-row test file),
    y ∈ {0, 1} (1 = the LIBSVM +1 class)."""
    import io
    import zipfile

    from sklearn.datasets import load_svmlight_file

    with zipfile.ZipFile(data_path("cod_rna", "rna_dataset.zip")) as z:
        raw = z.read("cod-rna.t" if test else "cod-rna.txt")
    X, y = load_svmlight_file(io.BytesIO(raw), n_features=8)
    return np.asarray(X.todense(), dtype=np.float64), (np.asarray(y) > 0).astype(np.float64)


def load_skin_nonskin():
    """UCI skin segmentation: 245 057 × 3 (B, G, R), y = 1 for skin (50 859 rows), 0 otherwise."""
    import pandas as pd

    df = pd.read_csv(data_path("skin_nonskin", "Skin_NonSkin.txt"), sep="\t")
    return df.iloc[:, :3].to_numpy(np.float64), (df.iloc[:, 3] == 1).to_numpy(np.float64)
