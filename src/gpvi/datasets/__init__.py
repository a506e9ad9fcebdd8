"""Small data sets that ship with gpvi (see ``NOTICE.md`` in this folder for sources and licences).

``coal_mining_events()`` returns the dates of the 191 British coal-mining disasters of
1851–1962 (decimal years); ``coal_mining_counts()`` bins them into yearly counts, the
classic data for a Poisson (log-Gaussian Cox process) model; ``gpvi demo`` fits it.
"""
from __future__ import annotations

from importlib import resources

import numpy as np

__all__ = ["coal_mining_events", "coal_mining_counts"]

FIRST_YEAR, LAST_YEAR = 1851, 1962


def coal_mining_events() -> np.ndarray:
    """The 191 disaster dates as decimal years, 1851.2 … 1962.2 (increasing)."""
    text = resources.files(__name__).joinpath("coal.csv").read_text(encoding="ascii")
    return np.array([float(v) for v in text.split()], dtype=np.float64)


def coal_mining_counts() -> tuple[np.ndarray, np.ndarray]:
    """``(years, counts)``: the number of disasters in each calendar year 1851 … 1962 (112 years)."""
    t = coal_mining_events()
    years = np.arange(FIRST_YEAR, LAST_YEAR + 1)
    counts = np.bincount(np.floor(t).astype(int) - FIRST_YEAR, minlength=years.size)
    return years, counts
