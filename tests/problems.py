"""Small problems shared by several test modules (tests/ is on sys.path through its conftest)."""
import numpy as np

from gpvi import likelihoods as L


def regression_data(rng, N, D=2):
    X = rng.uniform(-3, 3, (N, D))
    f = np.sin(X[:, 0]) + 0.5 * np.cos(2 * X[:, 1] if D > 1 else X[:, 0])
    return X, f


def jittered(K, jitter=1e-8):
    # gpvi adds jitter·mean(diag K) to the prior covariance; the oracle uses the same model.
    return K + jitter * np.mean(np.diag(K)) * np.eye(K.shape[0])


def titsias_bound(kernel, X, y, Z, noise, mean):
    Kmm = jittered(np.asarray(kernel(Z, Z)))
    Knm = np.asarray(kernel(X, Z))
    Qnn = Knm @ np.linalg.solve(Kmm, Knm.T)
    N = X.shape[0]
    C = Qnn + noise * np.eye(N)
    r = y - mean
    _, logdet = np.linalg.slogdet(C)
    trace = np.sum(np.asarray(kernel.diag(X))) - np.trace(Qnn)
    return -0.5 * (N * np.log(2 * np.pi) + logdet + r @ np.linalg.solve(C, r)) - 0.5 * trace / noise


def problem(kind, rng, N):
    X, f = regression_data(rng, N)
    if kind == "logit":
        return L.Bernoulli(), X, (rng.uniform(size=N) < 1 / (1 + np.exp(-2 * f))).astype(int)
    if kind == "probit":
        return L.Bernoulli(link="probit"), X, np.where(rng.uniform(size=N) < 0.5 * (1 + np.tanh(f)), 1, -1)
    if kind == "poisson":
        return L.Poisson(), X, rng.poisson(np.exp(f))
    if kind == "ordinal":
        edges = np.array([-1.0, 0.0, 1.0])
        lat = 2 * f + rng.logistic(size=N)
        return L.Ordinal(edges=edges, shape=2.0), X, np.searchsorted(edges, lat / 2)
    if kind == "laplace":
        return L.Laplace(scale=0.3), X, f + rng.laplace(scale=0.3, size=N)
    if kind == "studentt":
        return L.StudentT(df=3.0, scale=0.3), X, f + 0.3 * rng.standard_t(3.0, size=N)
    if kind == "exponential":
        return L.Exponential(), X, rng.exponential(np.exp(f))
    raise KeyError(kind)
