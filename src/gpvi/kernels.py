"""Covariance functions.

A kernel is an immutable pytree (see :mod:`gpvi._module`).  Calling it on two input
arrays ``X1`` of shape (N1, D) and ``X2`` of shape (N2, D) gives the (N1, N2) covariance
matrix; :meth:`Kernel.diag` gives the (N,) diagonal without forming the matrix.  Kernels
combine with ``+`` and ``*``.  Positive parameters (variances, lengthscales) are learned on
the log scale.  They are checked when a kernel is built: a variance must be a finite number
> 0, a lengthscale a finite number > 0 or a 1-D array (or list) of them (ARD), else a
``ValueError`` names the parameter.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

import numpy as np

from gpvi._module import Module, is_tracer, param

__all__ = [
    "Kernel", "RBF", "Matern12", "Matern32", "Matern52", "Linear", "Constant", "White", "Sum",
    "Product", "MultiscaleRBF",
]


_EXACT_DIFF_MAX_D = 8


def _as_2d(X):
    X = jnp.asarray(X)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"kernel inputs must have shape (N, D), got shape {X.shape}")
    return X


class Kernel(Module):
    """Base class: subclasses implement ``_K(X1, X2)`` and ``_diag(X)`` on 2-D inputs."""

    def __post_init__(self):
        if type(self) in (Kernel, Stationary):
            raise ValueError(f"{type(self).__name__} is an abstract base class: use a kernel such as "
                             f"{', '.join(n for n in __all__ if n not in ('Kernel', 'Sum', 'Product'))}")

    def __call__(self, X1, X2=None):
        """Covariance matrix ``k(X1, X2)``, shape (N1, N2); ``X2`` defaults to ``X1``."""
        X1 = _as_2d(X1)
        X2 = X1 if X2 is None else _as_2d(X2)
        return self._K(X1, X2)

    def diag(self, X):
        """Diagonal ``k(x_i, x_i)`` of the covariance of ``X`` (N, D), shape (N,)."""
        return self._diag(_as_2d(X))

    # A sparse GP asks for the covariances of its inducing variables through these two methods,
    # so that a kernel can give inducing variables their own form (see MultiscaleRBF); for
    # every other kernel an inducing variable is the function value at a point.
    def inducing_cov(self, Z):
        """Covariance ``K_uu`` (M, M) of the inducing variables at inducing inputs ``Z`` (M, D)."""
        return self(Z, Z)

    def inducing_cross(self, Z, X):
        """Cross-covariance ``K_uf`` (M, N) between the inducing variables at ``Z`` (M, D) and
        the function values at ``X`` (N, D)."""
        return self(Z, X)

    def __add__(self, other):
        return Sum(kernels=(self, other))

    def __mul__(self, other):
        return Product(kernels=(self, other))

    def _K(self, X1, X2):  # pragma: no cover - abstract
        raise NotImplementedError

    def _diag(self, X):  # pragma: no cover - abstract
        raise NotImplementedError


class Stationary(Kernel):
    """Shared code of kernels that depend on the scaled distance ``|x - x'| / lengthscale``.

    ``lengthscale`` is a scalar (isotropic) or a length-D vector (ARD).
    """

    def _scaled_sqdist(self, X1, X2):
        ls = jnp.asarray(self.lengthscale)
        if ls.ndim == 1 and ls.shape[0] != X1.shape[1]:
            raise ValueError(
                f"lengthscale has {ls.shape[0]} entries but the inputs have {X1.shape[1]} columns"
            )
        A, B = X1 / ls, X2 / ls
        if A.shape[1] <= _EXACT_DIFF_MAX_D:
            # Few columns: sum exact squared differences column by column (a loop over
            # columns, not data).  No cancellation, so d2 is exactly 0 for equal inputs,
            # which matters for kernels with sqrt(d2) (Matérn) near zero distance.
            d2 = sum((A[:, k, None] - B[None, :, k]) ** 2 for k in range(A.shape[1]))
        else:
            # Many columns: |a-b|² = |a|² + |b|² − 2ab as one matrix product, centred on the
            # first argument's mean because the expansion loses precision far from the origin.
            c = jnp.mean(A, axis=0)
            A, B = A - c, B - c
            d2 = jnp.sum(A**2, 1)[:, None] + jnp.sum(B**2, 1)[None, :] - 2.0 * A @ B.T
        return jnp.maximum(d2, 0.0)

    def _diag(self, X):
        return jnp.full(X.shape[0], jnp.asarray(self.variance, dtype=X.dtype))

    def _K(self, X1, X2):
        return self.variance * self._profile(self._scaled_sqdist(X1, X2))


def _safe_sqrt(d2):
    """``sqrt(d2)`` with a finite derivative (0) at ``d2 = 0``.

    Flooring at 1e-300 changes values by ~1e-150 and leaves no masked branch: the usual
    double-``where`` guard (and a custom JVP with ``where``) gave wrong or NaN gradients
    inside ``lax.scan`` next to a triangular solve when some distances were exactly 0
    (XLA:CPU, JAX 0.10).  The tangent of ``d2`` is itself 0 at 0 distance, so the
    hyperparameter gradients are exact.
    """
    return jnp.sqrt(jnp.maximum(d2, 1e-300))


class RBF(Stationary):
    """Squared exponential ``s^2 exp(-|x-x'|^2 / (2 l^2))``; vector ``lengthscale`` gives ARD."""

    variance: object = param("positive", 1.0, shape="scalar")
    lengthscale: object = param("positive", 1.0, shape="scalar_or_vector")

    def _profile(self, d2):
        return jnp.exp(-0.5 * d2)


class Matern12(Stationary):
    """Matérn ν=1/2 (exponential) kernel ``s^2 exp(-r)``, ``r = |x-x'|/l``."""

    variance: object = param("positive", 1.0, shape="scalar")
    lengthscale: object = param("positive", 1.0, shape="scalar_or_vector")

    def _profile(self, d2):
        return jnp.exp(-_safe_sqrt(d2))


class Matern32(Stationary):
    """Matérn ν=3/2 kernel ``s^2 (1 + √3 r) exp(-√3 r)``."""

    variance: object = param("positive", 1.0, shape="scalar")
    lengthscale: object = param("positive", 1.0, shape="scalar_or_vector")

    def _profile(self, d2):
        r = jnp.sqrt(3.0) * _safe_sqrt(d2)
        return (1.0 + r) * jnp.exp(-r)


class Matern52(Stationary):
    """Matérn ν=5/2 kernel ``s^2 (1 + √5 r + 5 r²/3) exp(-√5 r)``."""

    variance: object = param("positive", 1.0, shape="scalar")
    lengthscale: object = param("positive", 1.0, shape="scalar_or_vector")

    def _profile(self, d2):
        r = jnp.sqrt(5.0) * _safe_sqrt(d2)
        return (1.0 + r + 5.0 * d2 / 3.0) * jnp.exp(-r)


class Linear(Kernel):
    """Linear (dot-product) kernel ``s^2 x·x'``."""

    variance: object = param("positive", 1.0, shape="scalar")

    def _K(self, X1, X2):
        return self.variance * (X1 @ X2.T)

    def _diag(self, X):
        return self.variance * jnp.sum(X**2, 1)


class Constant(Kernel):
    """Constant kernel ``s^2`` (a random offset shared by all points)."""

    variance: object = param("positive", 1.0, shape="scalar")

    def _K(self, X1, X2):
        return jnp.full((X1.shape[0], X2.shape[0]), self.variance, dtype=X1.dtype)

    def _diag(self, X):
        return jnp.full(X.shape[0], self.variance, dtype=X.dtype)


class White(Kernel):
    """White noise ``s² δ(x = x')``: independent Gaussian noise on each latent value.

    Added to another kernel (``RBF() + White(0.01)``) it is the "Gaussian noise term" of the
    latent function used by e.g. Izmailov & Kropotov (2017, §5.1) for classification.  Two inputs
    are the same point when all their columns are equal, the convention a full
    :class:`~gpvi.models.GP` already uses for its jitter.  In a sparse GP the inducing variables
    carry their own noise (``K_uu`` gains ``s² I``) and share none with the data
    (``K_uf`` gains nothing, even where an inducing input equals a data row), as in GPflow; each
    data point's noise then enters its conditional variance ``c_i`` through :meth:`diag`.

    The variance is the one argument that may also be given positionally, ``White(0.01)`` being
    how a noise term is usually written; every other kernel parameter is keyword-only.
    """

    # kw_only=False on this one field: gpvi components are keyword-only dataclasses otherwise.
    variance: object = dataclasses.field(
        default=1.0, kw_only=False, metadata=param("positive", 1.0, shape="scalar").metadata)

    def _K(self, X1, X2):
        return jnp.where(same_rows(X1, X2), self.variance, 0.0).astype(X1.dtype)

    def _diag(self, X):
        return jnp.full(X.shape[0], self.variance, dtype=X.dtype)

    def inducing_cov(self, Z):
        Z = _as_2d(Z)
        return self.variance * jnp.eye(Z.shape[0], dtype=Z.dtype)

    def inducing_cross(self, Z, X):
        Z, X = _as_2d(Z), _as_2d(X)
        return jnp.zeros((Z.shape[0], X.shape[0]), Z.dtype)


def same_rows(X1, X2):
    """``(n1, n2)`` boolean mask of the row pairs whose columns are all equal (the "same point"
    convention of :class:`White` and of a full GP's jitter nugget)."""
    same = jnp.ones((X1.shape[0], X2.shape[0]), bool)
    for k in range(X1.shape[1]):  # a loop over input columns, not data points
        same = same & (X1[:, k, None] == X2[None, :, k])
    return same


def _check_kernels(owner, name, val):
    """A non-empty tuple of kernels (a list is turned into a tuple)."""
    if isinstance(val, list):
        val = tuple(val)
    if not isinstance(val, tuple) or not val or not all(isinstance(k, Kernel) for k in val):
        raise ValueError(f"{owner}: {name} must be a non-empty tuple of gpvi kernels, got {val!r}")
    return val


class Sum(Kernel):
    """Sum of kernels; built by ``k1 + k2``."""

    kernels: tuple = dataclasses.field(default=(), metadata={"check": _check_kernels})

    def _K(self, X1, X2):
        return sum(k._K(X1, X2) for k in self.kernels)

    def _diag(self, X):
        return sum(k._diag(X) for k in self.kernels)

    # each term keeps its own form of the inducing variables' covariances (White, MultiscaleRBF)
    def inducing_cov(self, Z):
        return sum(k.inducing_cov(Z) for k in self.kernels)

    def inducing_cross(self, Z, X):
        return sum(k.inducing_cross(Z, X) for k in self.kernels)

    def __add__(self, other):
        return Sum(kernels=self.kernels + (other,))


class Product(Kernel):
    """Elementwise product of kernels; built by ``k1 * k2``."""

    kernels: tuple = dataclasses.field(default=(), metadata={"check": _check_kernels})

    def _K(self, X1, X2):
        out = self.kernels[0]._K(X1, X2)
        for k in self.kernels[1:]:
            out = out * k._K(X1, X2)
        return out

    def _diag(self, X):
        out = self.kernels[0]._diag(X)
        for k in self.kernels[1:]:
            out = out * k._diag(X)
        return out

    def __mul__(self, other):
        return Product(kernels=self.kernels + (other,))


class MultiscaleRBF(RBF):
    """SE-ARD kernel whose inducing variables are multiscale inducing *functions*.

    ``k(x, x') = s² Π_d exp(−(x_d − x'_d)² / (2 ℓ_d²))`` is the covariance of ``f`` (what
    ``kernel(X1, X2)`` and :meth:`diag` return, so a full GP with this kernel is an SE-ARD GP).
    In a :class:`~gpvi.models.SparseGP` the inducing variable at ``z`` is an inducing function
    with its own lengthscales ``l_z`` (``inducing_lengthscale``), the modified multiscale kernel
    of Walder et al. (2008) in the form of Cheng & Boots (2016, Eq. 17):

        ψ_zᵀψ_z' = Π_d (2 l_zd l_z'd / (l_zd² + l_z'd²))^{1/2} exp(−Σ_d (z_d − z'_d)² / (l_zd² + l_z'd²)),

    ``K_uu = s² ψ_Zᵀψ_Z`` and ``K_uf = s² ψ_Zᵀφ_X`` with ``φ_x`` the same form at ``l = ℓ``.  These
    are inner products of unit-norm Gaussian bumps of width ``l`` in L² (up to constants), so
    ``[K_uu, K_uf; K_fu, K_ff]`` is positive semi-definite for any positive lengthscales.  With
    ``l_z = ℓ`` for every ``z`` (the default ``inducing_lengthscale=None`` means exactly that)
    the inducing functions are the function values at ``Z`` and the sparse GP is the SE-ARD one
    (Cheng & Boots' remark after Eq. 17).

    ``inducing_lengthscale`` : None, a number, a (D,) vector or an (M, D) array (one row per
    inducing input; learned on the log scale like every positive parameter).  Unlike ``ℓ`` it
    is a parameter of the inducing functions only: ``ψ_Z`` does not depend on ``s`` or ``ℓ``,
    which is what lets :mod:`gpvi.engines.ivsgpr` compare posteriors across hyperparameters.
    """

    inducing_lengthscale: object = param("positive", None, shape=None)

    def __post_init__(self):
        val = self.inducing_lengthscale
        if val is not None and not is_tracer(val) and np.ndim(val) > 2:
            raise ValueError(f"MultiscaleRBF: inducing_lengthscale must be None, a finite number > 0, a (D,) "
                             f"vector or an (M, D) array of them, got shape {np.shape(val)}")

    def _inducing_l(self, Z):
        ls = jnp.broadcast_to(jnp.asarray(self.lengthscale, Z.dtype), (Z.shape[1],))
        lz = ls if self.inducing_lengthscale is None else jnp.asarray(self.inducing_lengthscale, Z.dtype)
        if lz.ndim == 2 and lz.shape[0] != Z.shape[0]:
            raise ValueError(f"inducing_lengthscale has {lz.shape[0]} rows but there are {Z.shape[0]} inducing inputs")
        if lz.ndim >= 1 and lz.shape[-1] != Z.shape[1]:
            raise ValueError(f"inducing_lengthscale has {lz.shape[-1]} columns but the inputs have {Z.shape[1]}")
        return jnp.broadcast_to(lz, Z.shape), ls

    def inducing_gram(self, Z1, l1, Z2, l2):
        """``ψᵀψ'`` (M1, M2) of Eq. 17 without the variance, for inputs ``Z1`` (M1, D),
        ``Z2`` (M2, D) and their lengthscales ``l1`` (M1, D), ``l2`` (M2, D) or (D,)."""
        if jnp.ndim(l2) == 1 and jnp.ndim(l1) == 2:
            return _multiscale_cross(Z1, l1, Z2, l2)
        l1 = jnp.broadcast_to(l1, Z1.shape)
        l2 = jnp.broadcast_to(l2, Z2.shape)
        log_pre, expo = 0.0, 0.0
        for k in range(Z1.shape[1]):  # a loop over input columns, not data points
            a, b = l1[:, k, None], l2[None, :, k]
            s2 = a * a + b * b
            log_pre = log_pre + 0.5 * (jnp.log(2.0 * a * b) - jnp.log(s2))
            expo = expo + (Z1[:, k, None] - Z2[None, :, k]) ** 2 / s2
        return jnp.exp(log_pre - expo)

    def inducing_cov(self, Z):
        Z = _as_2d(Z)
        lz, _ = self._inducing_l(Z)
        return self.variance * self.inducing_gram(Z, lz, Z, lz)

    def inducing_cross(self, Z, X):
        Z, X = _as_2d(Z), _as_2d(X)
        lz, ls = self._inducing_l(Z)
        return self.variance * self.inducing_gram(Z, lz, X, ls)


def _multiscale_cross(Z, lz, X, ls):
    """:meth:`MultiscaleRBF.inducing_gram` of inducing functions ``Z`` (M, D) with lengthscales
    ``lz`` (M, D) against data inputs ``X`` (n, D) sharing one lengthscale vector ``ls`` (D,).

    ``s²_md = lz_md² + ls_d²`` depends on the inducing row only, so the exponent
    ``Σ_d (z_md − x_nd)² / s²_md`` expands into two (M, D)·(D, n) products; the gradient with
    respect to Z, lz and ls is then products too (the column-by-column form's gradient
    materialises D (M, n) arrays: ~30× the forward time at M = 512, n = 2048, D = 8).  Inputs are
    centred on the data's mean first, which keeps the expansion's rounding at ~ε times the
    squared scaled distances of the data; the exponent is clipped at 0 from below.
    """
    c = jnp.mean(X, axis=0)
    Zc, Xc = Z - c, X - c
    w = 1.0 / (lz * lz + ls * ls)  # (M, D)
    log_pre = 0.5 * jnp.sum(jnp.log(2.0 * lz * ls) + jnp.log(w), axis=1)  # (M,)
    expo = (jnp.sum(Zc * Zc * w, axis=1)[:, None] - 2.0 * (Zc * w) @ Xc.T + w @ (Xc * Xc).T)
    return jnp.exp(log_pre[:, None] - jnp.maximum(expo, 0.0))
