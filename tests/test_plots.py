"""gpvi.plots: VLB-vs-time traces and 1-D posteriors draw the expected artists and write PNGs."""
import sys

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402

import gpvi  # noqa: E402
from gpvi.plots import plot_posterior_1d, plot_traces, require_matplotlib  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def poisson_fits():
    rng = np.random.default_rng(11)
    X = rng.uniform(-3, 3, (150, 1))
    y = rng.poisson(np.exp(np.sin(X[:, 0]) + 0.5))
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=gpvi.likelihoods.Poisson(), inducing=8)
    fits = {e: gpvi.fit(model, X, y, engine=e, tol=1e-8) for e in ("fpi", "gradient")}
    return fits, X, y


def _save(fig, path):
    fig.savefig(path)
    plt.close(fig)
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 5000
    return data


def test_plot_traces_one_line_per_fit(poisson_fits, tmp_path):
    fits, _, _ = poisson_fits
    ax = plot_traces(fits)
    lines = ax.get_lines()
    assert [ln.get_label() for ln in lines] == ["fpi", "gradient"]
    for ln, fit in zip(lines, fits.values()):
        np.testing.assert_array_equal(ln.get_xdata(), fit.trace[:, 0])
        np.testing.assert_array_equal(ln.get_ydata(), fit.trace[:, 1])
    assert ax.get_xlabel() == "seconds" and "VLB" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fpi", "gradient"]
    _save(ax.figure, tmp_path / "traces.png")


@pytest.mark.slow
def test_plot_traces_gap_is_log_scale_and_positive(poisson_fits, tmp_path):
    fits, _, _ = poisson_fits
    fig, ax = plt.subplots()
    assert plot_traces(fits, ax=ax, gap=True) is ax
    assert ax.get_yscale() == "log"
    for ln in ax.get_lines():
        assert np.all(np.asarray(ln.get_ydata()) > 0)
    _save(fig, tmp_path / "gap.png")


def test_plot_traces_rejects_bad_input():
    with pytest.raises(ValueError, match="non-empty dict"):
        plot_traces({})
    with pytest.raises(ValueError, match="trace"):
        plot_traces({"x": object()})


def test_plot_posterior_1d_artists(poisson_fits, tmp_path):
    fits, X, y = poisson_fits
    fit = fits["fpi"]
    ax = plot_posterior_1d(fit, X, y)
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert labels == ["predictive mean", "data", "inducing inputs"]
    mean_line, data_line, z_line = ax.get_lines()
    grid = np.asarray(mean_line.get_xdata())
    np.testing.assert_allclose(mean_line.get_ydata(), fit.predict_y(grid[:, None])[0])
    np.testing.assert_array_equal(data_line.get_ydata(), y)
    np.testing.assert_allclose(np.sort(z_line.get_xdata()), np.sort(np.asarray(fit.model.inducing)[:, 0]))
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1
    # a band of Poisson rates: never negative
    verts = bands[0].get_paths()[0].vertices
    assert verts[:, 1].min() >= 0
    _save(ax.figure, tmp_path / "posterior.png")


def test_plot_posterior_1d_latent_and_bernoulli(tmp_path):
    rng = np.random.default_rng(12)
    X = rng.uniform(-2, 2, 80)
    y = np.where(rng.uniform(size=80) < 1 / (1 + np.exp(-3 * X)), 1, -1)  # labels ±1
    fit = gpvi.fit(gpvi.GP(kernel=gpvi.kernels.RBF(), likelihood=gpvi.likelihoods.Bernoulli()), X[:, None], y)
    fig, (a1, a2) = plt.subplots(1, 2)
    plot_posterior_1d(fit, X, y, ax=a1)
    data = [ln for ln in a1.get_lines() if ln.get_label() == "data"][0]
    assert set(np.unique(data.get_ydata())) == {0.0, 1.0}  # drawn as 0/1 on the probability scale
    mean = a1.get_lines()[0].get_ydata()
    assert np.all((mean > 0) & (mean < 1))
    assert "inducing inputs" not in [ln.get_label() for ln in a1.get_lines()]  # full GP
    plot_posterior_1d(fit, X, y, ax=a2, scale="latent")
    assert [ln.get_label() for ln in a2.get_lines()] == ["latent mean"]
    assert a2.get_ylabel() == "latent f"
    _save(fig, tmp_path / "bern.png")


def test_plot_posterior_1d_rejects_bad_input(poisson_fits):
    fits, X, y = poisson_fits
    with pytest.raises(ValueError, match="one input column"):
        plot_posterior_1d(fits["fpi"], np.c_[X, X], y)
    with pytest.raises(ValueError, match="scale"):
        plot_posterior_1d(fits["fpi"], X, y, scale="log")


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r'pip install "gpvi\[plot\]"'):
        require_matplotlib()


@pytest.mark.slow
def test_plots_and_datasets_are_attributes_of_gpvi_after_import_gpvi():
    # The README says `gpvi.plots` draws the figures: after a bare `import gpvi` it raised
    # AttributeError (as did gpvi.datasets) until `import gpvi.plots` was written out.
    import subprocess

    code = ("import gpvi; assert callable(gpvi.plots.plot_traces); assert callable(gpvi.datasets.coal_mining_counts); "
            "import sys; print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # and a bare import still skips matplotlib, and SciPy's optimisers (0.4 s of the import),
    # which the searches import when they run
    code = "import gpvi, sys; print('matplotlib' in sys.modules, 'scipy.optimize' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False False", out.stdout + out.stderr
