"""The extended latent Gaussian model behind every engine (DESIGN §1).

A model maps inputs to the marginal of each latent value under ``q(w) = N(m, V)``:
``m_i = a_i·m + b_i`` and ``v_i = c_i + a_iᵀ V a_i``.  All models are written in *whitened*
coordinates, where the prior on ``w`` is ``N(0, I)``:

=============  =====================  =====================  ==========================
model          ``w``                  ``a_i``                ``b_i``, ``c_i``
=============  =====================  =====================  ==========================
``GLM``        ``weights / σ_p``      ``σ_p h_i``            ``0``, ``0``
``GP``         ``L⁻¹(f − μ)``         row i of ``L = chol K``  ``μ``, ``0``
``SparseGP``   ``L_M⁻¹(u − μ)``       ``L_M⁻¹ k(Z, x_i)``     ``μ``, ``k_ii − |a_i|²``
=============  =====================  =====================  ==========================

Whitening does not change the fixed-point or Newton iterates (both are invariant under an
invertible linear change of ``w``) but it makes the KL term trivial and the linear algebra
better conditioned.  The model layer knows nothing of engines: it only provides
:meth:`Model.prior_cache` (work done once per hyperparameter setting, e.g. ``chol K_MM``)
and :meth:`Model.project` (a_i, b_i, c_i for a chunk of rows).
"""
from __future__ import annotations

import math
import numbers
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from gpvi._linalg import lower_left_matmul, tri_inv
from gpvi._module import Module, is_tracer, param, positional, static
from gpvi.kernels import Kernel, same_rows
from gpvi.likelihoods import Likelihood
from gpvi.likelihoods.base import as_array, is_real_dtype
from gpvi._compile import jit

__all__ = ["Model", "GLM", "GP", "SparseGP", "cholesky", "kl_standard_normal"]

_MAX_JITTER_TRIES = 8


def jitter_scale(K):
    """``s``, the mean diagonal of ``K`` (at least the smallest normal float): the jitter that
    :func:`cholesky` adds is ``j·s·I``."""
    return jnp.maximum(jnp.mean(jnp.diag(K)), jnp.finfo(K.dtype).tiny)


def cholesky(K, jitter):
    """Lower Cholesky factor of ``K + j·s·I`` with ``s`` the mean diagonal of K, and ``j·s``.

    ``j`` starts at ``jitter`` and grows tenfold until the factorisation succeeds (at most
    8 tries).  The jitter is chosen on ``stop_gradient(K)`` so the result stays
    differentiable in ``K``.  A factor that still fails contains NaNs; callers turn that
    into an error that names the matrix (see :func:`gpvi.fit`).
    """
    n = K.shape[0]
    eye = jnp.eye(n, dtype=K.dtype)
    # Only the discrete multiplier j is frozen; the scale s stays differentiable in K, so
    # autodiff gives the derivative of the function actually computed (j·s varies with the
    # kernel variance; freezing it biased full-GP hyperparameter gradients when K is
    # near-singular).
    scale = jitter_scale(K)
    j0 = jnp.asarray(jitter, K.dtype)
    L0 = jnp.linalg.cholesky(K + j0 * scale * eye)

    def retry(_):
        # the first factorisation failed: grow j tenfold until one succeeds (rare, so it may
        # cost a second factorisation at the j found; the first try is not repeated)
        Ks, ss = jax.lax.stop_gradient(K), jax.lax.stop_gradient(scale)

        def bad(j):
            return ~jnp.all(jnp.isfinite(jnp.linalg.cholesky(Ks + j * ss * eye)))

        j, _ = jax.lax.while_loop(lambda c: bad(c[0]) & (c[1] < _MAX_JITTER_TRIES - 1),
                                  lambda c: (c[0] * 10.0, c[1] + 1), (j0 * 10.0, 0))
        j = jax.lax.stop_gradient(j)
        return jnp.linalg.cholesky(K + j * scale * eye), j * scale

    return jax.lax.cond(jnp.all(jnp.isfinite(L0)), lambda _: (L0, j0 * scale), retry, None)


def kl_standard_normal(m, L):
    """``KL(N(m, L Lᵀ) || N(0, I))`` for lower-triangular ``L`` with positive diagonal."""
    d = m.shape[0]
    return 0.5 * (jnp.sum(L**2) + m @ m - d) - jnp.sum(jnp.log(jnp.abs(jnp.diag(L))))


# Largest |input| accepted.  Kernels square scaled differences, ((x − x')/ℓ)², and k-means
# (inducing-input placement) squares distances too: with |x| ≤ 1e150 a squared difference is
# at most (2e150)² = 4e300, below the float64 maximum (1.8e308) with room for sums over
# columns, whereas |x| ≈ 1.3e154 already overflows to inf.  Inputs that large carry no
# information a rescaled column would not, so they are rejected by column before any work.
X_ABS_MAX = 1e150


def _column(name, j, labels):
    """How a message names column ``j`` of input ``name``."""
    if labels is not None:
        return f"{name} column {labels[j]!r}"
    return f"{name} column {j} ({name}[:, {j}])"


def pandas_to_array(X, name):
    """``(array, column labels)`` for a pandas DataFrame or Series, else ``(X, None)``.

    Nullable extension columns (``Int64``, ``Float64``, ``boolean``) are numeric when they hold
    no missing value; a missing value is reported by column, not as a non-numeric dtype.
    """
    pd = sys.modules.get("pandas")
    if pd is None or not isinstance(X, (pd.DataFrame, pd.Series)):
        return X, None
    frame = X.to_frame() if isinstance(X, pd.Series) else X
    labels = list(frame.columns)
    numeric = True
    for j in range(frame.shape[1]):
        col = frame.iloc[:, j]
        dt = col.dtype
        if not (pd.api.types.is_numeric_dtype(dt) or pd.api.types.is_bool_dtype(dt)) \
                or pd.api.types.is_complex_dtype(dt):
            numeric = False
            continue
        if isinstance(dt, pd.api.extensions.ExtensionDtype):
            missing = np.flatnonzero(np.asarray(col.isna()))
            if missing.size:
                raise ValueError(f"{_column(name, j, labels)} has {missing.size} missing value(s) "
                                 f"(first in row {missing[0]}): impute or drop them before fitting")
    if not numeric:
        return np.asarray(frame), labels  # reported as non-numeric by check_X
    return frame.to_numpy(dtype=np.float64), labels


def check_input_range(X, name="X", labels=None):
    """Raise a ValueError naming the first column of the float array ``X`` (N, D) that holds
    NaN, ±inf or a value beyond ±:data:`X_ABS_MAX`."""
    finite = np.isfinite(X)
    if not np.all(finite):
        j = int(np.flatnonzero(~np.all(finite, axis=0))[0])
        i = int(np.flatnonzero(~finite[:, j])[0])
        raise ValueError(f"{_column(name, j, labels)} contains NaN or infinite values (first in row {i})")
    big = np.max(np.abs(X), axis=0) > X_ABS_MAX
    if np.any(big):
        j = int(np.flatnonzero(big)[0])
        top = float(np.max(np.abs(X[:, j])))
        raise ValueError(f"{_column(name, j, labels)} has values up to {top:.3g} in absolute value; inputs "
                         f"beyond ±{X_ABS_MAX:.0e} overflow the kernel's squared distances (rescale the column)")


def check_X(X, name="X"):
    X, labels = pandas_to_array(X, name)
    X = as_array(X, name)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array of shape (N, D), got shape {X.shape}")
    if X.shape[0] == 0:
        raise ValueError(f"{name} is empty: at least one row is needed")
    if X.shape[1] == 0:
        raise ValueError(f"{name} has no columns: at least one input dimension is needed")
    if not is_real_dtype(X.dtype):
        raise ValueError(f"{name} must be numeric (real), got dtype {X.dtype}")
    X = X.astype(np.float64)
    check_input_range(X, name, labels)
    return X


def _check_jitter(owner, name, j):
    if isinstance(j, (bool, np.bool_)) or not isinstance(j, numbers.Real) or not 0.0 < j <= 1.0:
        raise ValueError(f"{owner}: {name} must be a number in (0, 1] (relative to the mean prior "
                         f"variance), got {j!r}")
    return float(j)


def _check_inducing(owner, Z):
    """``inducing`` of a SparseGP: None (not set yet), a positive int M or an (M, D) array."""
    what = f"{owner}: inducing must be a positive int M or an (M, D) array of inducing inputs"
    if Z is None or is_tracer(Z):
        return Z
    if isinstance(Z, (bool, np.bool_, str, bytes)):
        raise ValueError(f"{what}, got {Z!r}")
    if isinstance(Z, numbers.Integral) or (np.ndim(Z) == 0 and np.asarray(Z).dtype.kind in "iu"):
        if int(Z) < 1:
            raise ValueError(f"{what}, got {Z!r}")
        return Z
    if np.ndim(Z) == 0:
        raise ValueError(f"{what}, got {Z!r}")
    checked = check_X(Z, "inducing")
    return checked if isinstance(Z, (list, tuple)) else Z


class Model(Module):
    """Base class: a likelihood plus a linear-Gaussian map from ``w`` to the latents."""

    def __post_init__(self):
        if type(self) is Model:
            raise ValueError("Model is an abstract base class: use GLM, GP or SparseGP")

    def describe(self) -> str:
        """The model's kind, size and kernel on one line (the first line of ``FitResult.summary()``)."""
        kernel = getattr(self, "kernel", None)
        return type(self).__name__ + (f", kernel {kernel.structure()}" if kernel is not None else "")

    def initialise(self, X, y=None, *, seed: int = 0) -> "Model":
        """Return a copy made concrete for data ``X`` (e.g. k-means inducing inputs)."""
        return self

    def num_weights(self, X) -> int:
        """Dimension ``d`` of ``w`` for training inputs ``X``."""
        raise NotImplementedError

    def input_dim(self) -> int | None:
        """Number of input columns the model expects (None when not yet fixed)."""
        return None

    def prior_cache(self, X):
        """Per-hyperparameter work shared by all chunks (pytree)."""
        raise NotImplementedError

    def project(self, cache, Xc):
        """``(At, b, c)`` for a chunk ``Xc`` of shape (n, D): ``At`` (d, n) holds the a_i as
        *columns* (the layout that makes the two O(n·d²) products of a pass fastest on
        XLA:CPU), b (n,), c (n,)."""
        raise NotImplementedError

    def pass_cache(self, cache):
        """Work shared by the projections of many chunks (a data pass), from the prior cache;
        see :meth:`project_many`.  By default the prior cache itself."""
        return cache

    def caches(self, X):
        """``(prior_cache(X), pass_cache(·))`` together, for code that differentiates both in the
        model's parameters: a model may give the pass cache a cheaper derivative than the chain
        through the prior cache (the sparse GP does)."""
        prior = self.prior_cache(X)
        return prior, self.pass_cache(prior)

    def project_many(self, pcache, Xc):
        """:meth:`project` for one of many chunks, from ``pcache = pass_cache(prior cache)``."""
        return self.project(pcache, Xc)

    def raw_features(self, Xc):
        """Optional: ``(F, b, k)`` such that :meth:`project_many` gives ``At = T F``,
        ``c = max(k − Σ_rows At², 0)`` with ``T = pass_cache(prior cache)`` (d, d).

        A model that defines it lets a pass that recomputes its projections work on ``F``
        directly: ``T`` moves onto the state (``Tᵀ m``, ``Tᵀ(V − I)T``) before the pass and onto
        the sums after it, so the per-chunk product with ``T`` is never formed (see
        :func:`gpvi.objective.data_pass`).  The base class has none.
        """
        raise NotImplementedError

    def project_raw(self, pcache, F, b, k):
        """:meth:`project_many`'s ``(At, b, c)`` from a chunk's :meth:`raw_features`, for a model
        that has them: ``At = T F``, ``c = max(k − Σ_rows At², 0)`` with ``T = pcache``."""
        At = pcache @ F
        return At, b, jnp.maximum(k - jnp.sum(At**2, 0), 0.0)

    def training_projection(self, cache):
        """Optional: ``(At, b, c)`` of the training inputs the prior cache was built on, all
        rows at once, where that is cheaper than :meth:`project` on them (the full GP: ``At = Lᵀ``
        with no solve).  ``None`` where the model has none (the default)."""
        return None

    def triangular_training_projection(self) -> bool:
        """Whether :meth:`training_projection`'s ``At`` is upper triangular in its leading columns
        (row k zero in the columns of the training rows before row k), so that the objective may
        keep its row blocks cut to their trailing columns
        (:func:`gpvi.objective.blocks.trim_triangular`).  False by default."""
        return False

    def conditional_cov(self, cache, X, At):
        """``K_** − AᵀA`` (n, n): the prior covariance of the latent at ``X`` (n, D) that the
        weights leave, given ``At = project(cache, X)[0]``; the full-covariance counterpart of
        ``c`` (see :meth:`gpvi.FitResult.predict_f_cov`)."""
        raise NotImplementedError(f"predict_f_cov: no full covariance for a {type(self).__name__} "
                                  "(GP, SparseGP, GLM and MultiLatent of them have one)")

    def relative_jitter(self, cache=None, X=None) -> float:
        """The relative jitter ``j`` the factorisation of this model's prior used (``j·s·I``
        added, ``s`` the mean prior variance; see :func:`cholesky`), from the prior ``cache``
        on the training inputs where given, else by factorising again (a full GP needs its
        training inputs ``X`` then).  NaN for a model without jitter (the default)."""
        return float("nan")


def _relative(start, absolute, scale):
    """The relative jitter ``j`` of an absolute one ``j·s``: ``start·10^k`` (the only values
    :func:`cholesky` tries), k read off the ratio."""
    ratio = float(absolute) / (float(start) * float(scale))
    if not np.isfinite(ratio) or ratio <= 0:
        return float("nan")
    return float(start) * 10.0 ** round(math.log10(ratio))


def factored(model) -> bool:
    """Whether ``model`` defines :meth:`Model.raw_features`."""
    return type(model).raw_features is not Model.raw_features


class GLM(Model):
    """Bayesian generalised linear model ``f_i = h_i·w``, ``w ~ N(0, prior_variance·I)``.

    Add a column of ones to ``X`` for an intercept.
    """

    likelihood: Likelihood = positional(kind=Likelihood)
    prior_variance: object = param("positive", 1.0, shape="scalar")

    def describe(self) -> str:
        return "GLM (Bayesian generalised linear model)"

    def num_weights(self, X):
        return int(np.shape(X)[1])

    def prior_cache(self, X):
        return jnp.sqrt(jnp.asarray(self.prior_variance))

    def project(self, cache, Xc):
        z = jnp.zeros(Xc.shape[0], Xc.dtype)
        return Xc.T * cache, z, z

    def conditional_cov(self, cache, X, At):
        return jnp.zeros((X.shape[0], X.shape[0]), X.dtype)  # the weights determine f exactly


class SparseGP(Model):
    """Sparse (inducing-point) GP of Titsias (2009) / Sheth et al. (2015), whitened.

    ``inducing`` is an (M, D) array of inducing inputs, used exactly as given, or an int M,
    in which case :meth:`initialise` places them at k-means centres of the training inputs
    (fitted on a random sample of max(20·M, 10 000) rows).  ``mean`` is a constant prior mean (learnable).
    ``learn_inducing`` is handled by :func:`gpvi.fit`.
    """

    kernel: Kernel = positional(kind=Kernel)
    likelihood: Likelihood = positional(kind=Likelihood)
    inducing: object = param("real", None, domain=None, shape=None)
    mean: object = param("real", 0.0, shape="scalar")
    jitter: float = static(1e-8, check=_check_jitter)

    def __post_init__(self):
        Z = _check_inducing(type(self).__name__, self.inducing)
        if Z is not self.inducing:
            object.__setattr__(self, "inducing", Z)

    def initialise(self, X, y=None, *, seed: int = 0):
        X = check_X(X)
        Z = self.inducing
        if Z is None:
            raise ValueError("inducing must be an (M, D) array or a positive int M")
        if np.ndim(Z) == 0:
            M = int(Z)
            if M < 1 or M != Z:
                raise ValueError(f"inducing must be a positive int or an (M, D) array, got {Z!r}")
            if M > X.shape[0]:
                raise ValueError(f"inducing: M = {M} inducing inputs but only N = {X.shape[0]} data rows (need M ≤ N)")
            Z = _kmeans(X, M, seed)
            return self.replace(inducing=jax.device_put(np.asarray(Z, np.float64)))  # (no staging program)
        Z = check_X(Z, "inducing")
        if Z.shape[1] != X.shape[1]:
            raise ValueError(f"inducing has {Z.shape[1]} columns but X has {X.shape[1]}")
        if Z.shape[0] > X.shape[0]:
            raise ValueError(f"inducing: M = {Z.shape[0]} inducing inputs but only N = {X.shape[0]} data rows (need M ≤ N)")
        return self.replace(inducing=jax.device_put(np.asarray(Z, np.float64)))

    def describe(self) -> str:
        M = np.shape(self.inducing)[0] if np.ndim(self.inducing) == 2 else self.inducing
        return f"SparseGP (M={M} inducing inputs), kernel {self.kernel.structure()}"

    def num_weights(self, X):
        return int(np.shape(self.inducing)[0])

    def input_dim(self):
        return None if np.ndim(self.inducing) < 2 else int(np.shape(self.inducing)[1])

    def _inducing_factor(self):
        """``(K, L, added)``: ``K = K(Z, Z)``, its jittered factor and the jitter added."""
        K = self.kernel.inducing_cov(jnp.asarray(self.inducing))
        return (K, *cholesky(K, self.jitter))

    def prior_cache(self, X):
        return self._inducing_factor()[1]

    def project(self, cache, Xc):
        Kzx = self.kernel.inducing_cross(jnp.asarray(self.inducing), Xc)
        At = solve_triangular(cache, Kzx, lower=True)
        c = jnp.maximum(self.kernel.diag(Xc) - jnp.sum(At**2, 0), 0.0)
        return At, jnp.full(Xc.shape[0], self.mean, Xc.dtype), c

    def caches(self, X):
        # L⁻¹ with its derivative in K(Z, Z) in closed form (see inverse_factor)
        K, L, added = self._inducing_factor()
        return L, inverse_factor(K + added * jnp.eye(K.shape[0], dtype=K.dtype), jax.lax.stop_gradient(L))

    def pass_cache(self, cache):
        # L⁻¹ once per pass: each chunk's L⁻¹ K(Z, X) is then a matrix product, which XLA:CPU
        # runs ~7× faster than the triangular solve (M = 300, n = 2048: 4.4 ms against 33 ms);
        # |a_i|² ≤ k_ii bounds the result, so the product's rounding error stays ~ε·|L⁻¹|·|K|.
        return tri_inv(cache)

    def project_many(self, pcache, Xc):
        return self.project_raw(pcache, *self.raw_features(Xc))

    def project_raw(self, pcache, F, b, k):
        At = lower_left_matmul(pcache, F)  # pcache = L⁻¹ is lower triangular
        return At, b, jnp.maximum(k - jnp.sum(At**2, 0), 0.0)

    def raw_features(self, Xc):
        Kzx = self.kernel.inducing_cross(jnp.asarray(self.inducing), Xc)
        return Kzx, jnp.full(Xc.shape[0], self.mean, Xc.dtype), self.kernel.diag(Xc)

    def conditional_cov(self, cache, X, At):
        return self.kernel(X, X) - At.T @ At

    def relative_jitter(self, cache=None, X=None) -> float:
        """From the prior cache ``L``: the added ``j·s`` is the mean of ``diag(L Lᵀ) − diag(K_ZZ)``
        (no refactorisation); without it ``K_ZZ`` is factorised again."""
        if cache is not None and self.jitter >= 1e-12:
            scale, added = (float(a) for a in _inducing_added_jitter(self, cache))
            if added >= 0.5 * self.jitter * scale:
                return _relative(self.jitter, added, scale)
        scale, added = (float(a) for a in _inducing_refactorised_jitter(self))
        return _relative(self.jitter, added, scale)


# SparseGP.relative_jitter's arithmetic as compiled programs: eagerly, its K_ZZ, scale and sums
# were about ten small programs in every fresh process that fits a sparse GP (each traced,
# lowered and compiled or loaded), nearly half of those of the default estimators' first fits.
@jit
def _inducing_added_jitter(model, L):
    """``(s, mean of diag(L Lᵀ) − diag K_ZZ)`` for the factor ``L`` of ``K_ZZ + j·s·I``."""
    K = model.kernel.inducing_cov(jnp.asarray(model.inducing))
    return jitter_scale(K), jnp.mean(jnp.sum(L * L, axis=1) - jnp.diag(K))


@jit
def _inducing_refactorised_jitter(model):
    """``(s, j·s)`` of :func:`cholesky` of ``K_ZZ`` factorised again."""
    K = model.kernel.inducing_cov(jnp.asarray(model.inducing))
    return jitter_scale(K), cholesky(K, model.jitter)[1]


class GP(Model):
    """Full GP, ``f ~ N(mean, K(X, X))``, whitened by ``L = chol K``; O(N³) per fit.

    The jitter that makes ``K`` factorisable is part of the prior as a nugget,
    ``k(x, x') + j·δ(x = x')``, so that the training latents are exactly ``f = mean + L w``
    (``c_i = 0``) and predictions at new inputs are the matching GP conditionals.
    """

    kernel: Kernel = positional(kind=Kernel)
    likelihood: Likelihood = positional(kind=Likelihood)
    mean: object = param("real", 0.0, shape="scalar")
    jitter: float = static(1e-8, check=_check_jitter)

    def describe(self) -> str:
        return f"GP (full), kernel {self.kernel.structure()}"

    def num_weights(self, X):
        return int(np.shape(X)[0])

    def prior_cache(self, X):
        L, nugget = cholesky(self.kernel(X, X), self.jitter)
        return X, L, nugget

    def project(self, cache, Xc):
        X, L, nugget = cache
        At = solve_triangular(L, self.kernel(X, Xc) + nugget * same_rows(X, Xc), lower=True)
        # On training rows c_i = 0 up to rounding; elsewhere the conditional variance.
        c = jnp.maximum(self.kernel.diag(Xc) + nugget - jnp.sum(At**2, 0), 0.0)
        return At, jnp.full(Xc.shape[0], self.mean, Xc.dtype), c

    def training_projection(self, cache):
        """The training latents are ``f = mean + L w`` exactly: ``At = Lᵀ``, ``c = 0``, no
        triangular solve against ``K(X, X)`` (O(N³), 1.9 GFLOP at N = 1233)."""
        X, L, _ = cache
        N = X.shape[0]
        return L.T, jnp.full(N, self.mean, L.dtype), jnp.zeros(N, L.dtype)

    def triangular_training_projection(self) -> bool:
        """``At = Lᵀ`` is upper triangular."""
        return True

    def conditional_cov(self, cache, X, At):
        nugget = cache[2]
        return self.kernel(X, X) + nugget * same_rows(X, X) - At.T @ At

    def relative_jitter(self, cache=None, X=None) -> float:
        """From the prior cache, which holds the nugget ``j·s`` it added; without it ``K(X, X)``
        on the training inputs ``X`` is factorised again (NaN with neither)."""
        if cache is not None:
            # the mean diagonal of K from the factor of K + j·s·I (row sums of L², less j·s), on
            # the host: K's own diagonal would be eager JAX programs (two compilations per fit)
            _, L, nugget = cache
            L, nugget = np.asarray(L), float(nugget)
            mean_diag = float(np.mean(np.einsum("ij,ij->i", L, L))) - nugget
            return _relative(self.jitter, nugget, max(mean_diag, float(np.finfo(np.float64).tiny)))
        if X is None:
            return float("nan")
        K = self.kernel(jnp.asarray(X), jnp.asarray(X))
        return _relative(self.jitter, cholesky(K, self.jitter)[1], jitter_scale(K))


@jax.custom_jvp
def inverse_factor(K, L):
    """``L⁻¹`` for ``L = chol(K)`` (given, and held constant: its tangent is ignored), with the
    derivative in ``K`` in closed form, ``d(L⁻¹) = −Φ(L⁻¹ dK L⁻ᵀ) L⁻¹`` (``Φ``: the lower
    triangle with the diagonal halved).  Reverse mode then transposes three (M, M) products,
    where the chain through the factorisation and the triangular inverse cost XLA:CPU about
    1.4× more (M = 512: 22 against 30 ms for value and gradient)."""
    return tri_inv(L)


@inverse_factor.defjvp
def _inverse_factor_jvp(primals, tangents):
    K, L = primals
    dK, _ = tangents
    T = tri_inv(L)
    P = T @ dK @ T.T
    return T, -(jnp.tril(P, -1) + 0.5 * jnp.diag(jnp.diag(P))) @ T


# k-means for inducing inputs runs on a random sample of KMEANS_ROWS_PER_CENTRE·M rows (at least
# KMEANS_MIN_ROWS), seeded by k-means++ with one candidate per centre, then at most
# KMEANS_ITER Lloyd iterations.  On a9a (32 561 × 123, M = 500) scikit-learn's default k-means++
# (2 + log M candidates per centre, over every row) took 8-10 s of a fit's start on the 2-core
# machine; the sampled version takes about a second there, and its centres gave a higher VLB at
# the starting hyperparameters on each of a9a (+2.2 nats), kin40k (20 000 rows, M = 512: +38) and
# magic04 (20 000 rows, M = 300: +0.2).
KMEANS_ROWS_PER_CENTRE, KMEANS_MIN_ROWS, KMEANS_ITER = 20, 10_000, 50


def _kmeans(X, M, seed):
    rng = np.random.default_rng(seed)
    n = max(KMEANS_ROWS_PER_CENTRE * M, KMEANS_MIN_ROWS)
    sub = X if X.shape[0] <= n else X[rng.choice(X.shape[0], n, replace=False)]
    if np.unique(sub, axis=0).shape[0] < M:  # few distinct rows: use them all (at most 100 000)
        sub = X if X.shape[0] <= 100_000 else X[rng.choice(X.shape[0], 100_000, replace=False)]
        uniq = np.unique(sub, axis=0)
        if uniq.shape[0] < M:
            raise ValueError(
                f"inducing: asked for M = {M} k-means centres but X has only {uniq.shape[0]} distinct rows"
            )
    from sklearn.cluster import KMeans, kmeans_plusplus

    init, _ = kmeans_plusplus(sub, M, random_state=seed, n_local_trials=1)
    km = KMeans(n_clusters=M, n_init=1, init=init, max_iter=KMEANS_ITER).fit(sub)
    return km.cluster_centers_
