"""Covariance functions.

A kernel is an immutable pytree (see :mod:`gpvi._module`).  Calling it on two input
arrays ``X1`` of shape (N1, D) and ``X2`` of shape (N2, D) gives the (N1, N2) covariance
matrix; :meth:`Kernel.diag` gives the (N,) diagonal without forming the matrix.  Positive
parameters (variances, lengthscales, periods, ...) are learned on the log scale.  They are
checked when a kernel is built: a variance must be a finite number > 0, a lengthscale a finite
number > 0 or a 1-D array (or list) of them (ARD), else a ``ValueError`` names the parameter.

Kernels are written as in scikit-learn and GPflow:

- **algebra**: ``k1 + k2`` (:class:`Sum`), ``k1 * k2`` (:class:`Product`), ``c * k`` and
  ``k * c`` for a number ``c > 0`` (:class:`Scale`, a learnable variance started at ``c``), and
  ``k + c`` / ``c + k`` (``k`` plus a :class:`Constant` of variance ``c``; ``c = 0`` gives ``k``
  itself, so the built-in ``sum(kernels)`` works);
- **positional arguments** in the order of the keywords: ``RBF(1.0, 2.0)`` is
  ``RBF(variance=1.0, lengthscale=2.0)``, ``White(0.01)``, ``Periodic(1.0, 0.5, 2.0)``
  (variance, lengthscale, period), ``Polynomial(3)`` (degree);
- **active_dims** on every kernel: a tuple of input columns (or None, all of them) that the
  kernel sees, e.g. ``RBF(active_dims=(0,)) * Linear(active_dims=(1, 2))``.  The columns are
  selected before anything else, so an ARD lengthscale has ``len(active_dims)`` entries.  In a
  :class:`Sum`, :class:`Product` or :class:`Scale` that has ``active_dims`` of its own, its
  parts' ``active_dims`` index the columns it selected.

A kernel of one's own subclasses :class:`Kernel` and implements ``_K(X1, X2)`` and
``_diag(X)`` on 2-D inputs whose columns are already selected; it combines with the others,
is learned by :func:`gpvi.fit` and is saved by :mod:`gpvi.io` like gpvi's own.  It should
call other kernels through ``k(X1, X2)`` and ``k.diag(X)``, which apply their ``active_dims``.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp

import numpy as np

from gpvi._module import Module, is_tracer, param, static

__all__ = [
    "Kernel", "RBF", "Matern12", "Matern32", "Matern52", "Linear", "Constant", "White", "Sum",
    "Product", "Scale", "MultiscaleRBF", "Periodic", "RationalQuadratic", "Polynomial", "kernel_from_spec",
    "SPEC_NAMES",
]


_EXACT_DIFF_MAX_D = 8
# names in __all__ that are not kernels one builds on their own (for the abstract-class message)
_NOT_LEAVES = ("Kernel", "Sum", "Product", "Scale", "kernel_from_spec", "SPEC_NAMES")


def _as_2d(X):
    X = jnp.asarray(X)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"kernel inputs must have shape (N, D), got shape {X.shape}")
    return X


def _positional(field):
    """``field`` (declared with :func:`~gpvi._module.param` or :func:`~gpvi._module.static`)
    made positional: such fields are the constructor's positional arguments, in declaration
    order (gpvi components are keyword-only dataclasses otherwise)."""
    kw = {} if field.default is dataclasses.MISSING else {"default": field.default}
    return dataclasses.field(kw_only=False, metadata=field.metadata, **kw)


def _check_active_dims(owner, name, val):
    """None, or a non-empty tuple of distinct column indices ≥ 0 (a list, range or 1-D integer
    array is turned into a tuple of Python ints)."""
    if val is None:
        return None
    what = (f"{owner}: {name} must be None (all columns) or a non-empty sequence of distinct column "
            f"indices >= 0")
    if isinstance(val, (str, bytes, bool, np.bool_)) or np.ndim(val) != 1:
        raise ValueError(f"{what}, got {val!r}")
    items = list(val)
    bad = [v for v in items if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0]
    if bad:
        raise ValueError(f"{what}; {bad!r} {'is' if len(bad) == 1 else 'are'} not, in {val!r}")
    if not items:
        raise ValueError(f"{what}, got an empty sequence")
    dims = tuple(int(v) for v in items)
    twice = sorted({d for d in dims if dims.count(d) > 1})
    if twice:
        raise ValueError(f"{what}; {twice} {'is' if len(twice) == 1 else 'are'} given more than once in {val!r}")
    return dims


def _number(c):
    """``c`` when it is a real number (Python, NumPy or a 0-d array, a tracer included), else None."""
    if isinstance(c, (bool, np.bool_)):
        return None
    if isinstance(c, (int, float, np.integer, np.floating)):
        return c
    if isinstance(c, (np.ndarray, jax.Array)) and c.ndim == 0 and c.dtype.kind in "iuf":
        return c
    return None


def _checked_factor(c, verb):
    """A number ``c`` checked to be finite and > 0 (``verb`` "scale") or ≥ 0 (``verb`` "add"),
    as a Python float (a tracer unchanged)."""
    if is_tracer(c):
        return c
    v = float(c)
    ok = math.isfinite(v) and (v > 0 if verb == "scale" else v >= 0)
    if not ok:
        if verb == "scale":
            raise ValueError(f"cannot scale a kernel by {v!r}: the factor must be a finite number > 0 (it starts the "
                             "learnable variance of a gpvi.kernels.Scale kernel)")
        raise ValueError(f"cannot add {v!r} to a kernel: the number must be finite and >= 0 (it is the variance of "
                         "the gpvi.kernels.Constant kernel that is added)")
    return v


_DEFINED = itertools.count()


def _is_zero(c) -> bool:
    return not is_tracer(c) and float(c) == 0.0


class Kernel(Module):
    """Base class: subclasses implement ``_K(X1, X2)`` and ``_diag(X)`` on 2-D inputs.

    ``active_dims`` (every kernel's last, keyword-only argument): None (all input columns) or a
    tuple of the column indices the kernel sees; they are selected by :meth:`__call__`,
    :meth:`diag`, :meth:`inducing_cov` and :meth:`inducing_cross` before ``_K`` and ``_diag``
    run.  A static setting (never learned), saved in model files.
    """

    active_dims: object = static(None, check=_check_active_dims)

    # NumPy scalars on the left of * and + (np.float64(2.0) * k) defer to the kernel's __rmul__
    # and __radd__ instead of building an object array.
    __array_ufunc__ = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # definition order, so that a model file's name means the latest definition of a class
        # defined again under the same name (a notebook cell run twice); see gpvi.fitting.codec
        cls._gpvi_defined = next(_DEFINED)

    def __post_init__(self):
        if type(self) in (Kernel, Stationary):
            raise ValueError(f"{type(self).__name__} is an abstract base class: use a kernel such as "
                             f"{', '.join(n for n in __all__ if n not in _NOT_LEAVES)}")

    def structure(self) -> str:
        """The kernel's structure in words, for summaries: ``RBF``, ``RBF + Periodic``,
        ``Scale * (Matern52)``; a kernel built of others shows them in parentheses."""
        parts = getattr(self, "kernels", None)
        if isinstance(parts, tuple) and parts:
            return f"{type(self).__name__}({', '.join(k.structure() for k in parts)})"
        return type(self).__name__

    def _select(self, X):
        """The columns ``active_dims`` of the 2-D inputs ``X`` (``X`` itself when None)."""
        dims = self.active_dims
        if dims is None:
            return X
        bad = [d for d in dims if d >= X.shape[1]]
        if bad:
            raise ValueError(f"{type(self).__name__}: active_dims {list(dims)} name column(s) {bad} but the inputs "
                             f"have {X.shape[1]} column(s) (0 to {X.shape[1] - 1})")
        return X[:, np.asarray(dims)]

    def __call__(self, X1, X2=None):
        """Covariance matrix ``k(X1, X2)``, shape (N1, N2); ``X2`` defaults to ``X1``."""
        X1 = self._select(_as_2d(X1))
        X2 = X1 if X2 is None else self._select(_as_2d(X2))
        return self._K(X1, X2)

    def diag(self, X):
        """Diagonal ``k(x_i, x_i)`` of the covariance of ``X`` (N, D), shape (N,)."""
        return self._diag(self._select(_as_2d(X)))

    # A sparse GP asks for the covariances of its inducing variables through these two methods,
    # so that a kernel can give inducing variables their own form (see MultiscaleRBF); for
    # every other kernel an inducing variable is the function value at a point.  An override
    # selects its active_dims itself (self._select).
    def inducing_cov(self, Z):
        """Covariance ``K_uu`` (M, M) of the inducing variables at inducing inputs ``Z`` (M, D)."""
        return self(Z, Z)

    def inducing_cross(self, Z, X):
        """Cross-covariance ``K_uf`` (M, N) between the inducing variables at ``Z`` (M, D) and
        the function values at ``X`` (N, D)."""
        return self(Z, X)

    def __add__(self, other):
        if isinstance(other, Kernel):
            return Sum(kernels=(self, other))
        c = _number(other)
        if c is None:
            return NotImplemented
        c = _checked_factor(c, "add")
        return self if _is_zero(c) else Sum(kernels=(self, Constant(variance=c)))

    def __radd__(self, other):
        c = _number(other)
        if c is None:
            return NotImplemented
        c = _checked_factor(c, "add")
        return self if _is_zero(c) else Sum(kernels=(Constant(variance=c), self))

    def __mul__(self, other):
        if isinstance(other, Kernel):
            return Product(kernels=(self, other))
        c = _number(other)
        if c is None:
            return NotImplemented
        return _scaled(self, _checked_factor(c, "scale"))

    def __rmul__(self, other):
        c = _number(other)
        if c is None:
            return NotImplemented
        return _scaled(self, _checked_factor(c, "scale"))

    def __repr__(self) -> str:
        # Module's repr without active_dims=None (every kernel has it), active_dims last otherwise.
        parts = []
        for f in dataclasses.fields(self):
            if f.name == "active_dims":
                continue
            val = getattr(self, f.name)
            if isinstance(val, (jax.Array, np.ndarray)):
                arr = np.asarray(val)
                val = float(arr) if arr.ndim == 0 else np.array2string(arr, precision=4)
            parts.append(f"{f.name}={val!r}" if not isinstance(val, str) or f.metadata.get("static")
                         else f"{f.name}={val}")
        if self.active_dims is not None:
            parts.append(f"active_dims={self.active_dims!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _K(self, X1, X2):  # pragma: no cover - abstract
        raise NotImplementedError

    def _diag(self, X):  # pragma: no cover - abstract
        raise NotImplementedError


def _scaled(kernel, c):
    """``c * kernel``: a :class:`Scale` of variance ``c`` (a Scale's own variance times ``c``)."""
    if isinstance(kernel, Scale) and not is_tracer(kernel.variance) and not is_tracer(c):
        return kernel.replace(variance=float(np.asarray(kernel.variance)) * float(c))
    return Scale(kernel=kernel, variance=c)


class Stationary(Kernel):
    """Shared code of kernels that depend on the scaled distance ``|x - x'| / lengthscale``.

    ``lengthscale`` is a scalar (isotropic) or a length-D vector (ARD).
    """

    #: Whether the profile is smooth at distance 0 (its derivative in ``d2`` is finite there),
    #: so the squared distances may be differentiated through matrix products (see
    #: :func:`_column_sqdist`); Matérn kernels take ``sqrt(d2)`` and need the exact tangent.
    _smooth_profile = False

    def _scaled_sqdist(self, X1, X2):
        ls = jnp.asarray(self.lengthscale)
        if ls.ndim == 1 and ls.shape[0] != X1.shape[1]:
            raise ValueError(
                f"lengthscale has {ls.shape[0]} entries but the inputs have {X1.shape[1]} columns"
                + (f" (active_dims {list(self.active_dims)})" if self.active_dims is not None else "")
            )
        A, B = X1 / ls, X2 / ls
        if A.shape[1] <= _EXACT_DIFF_MAX_D:
            # Few columns: sum exact squared differences column by column (a loop over
            # columns, not data).  No cancellation, so d2 is exactly 0 for equal inputs,
            # which matters for kernels with sqrt(d2) (Matérn) near zero distance.
            d2 = _column_sqdist(A, B) if self._smooth_profile else _sqdist_by_columns(A, B)
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


def _sqdist_by_columns(A, B):
    """``Σ_k (A_ik − B_jk)²`` (N1, N2), summed column by column (a loop over columns, not data)."""
    return sum((A[:, k, None] - B[None, :, k]) ** 2 for k in range(A.shape[1]))


@jax.custom_jvp
def _column_sqdist(A, B):
    """``Σ_k (A_ik − B_jk)²`` (N1, N2), summed column by column (a loop over columns, not data):
    exact, and exactly 0 for equal rows.

    Its derivatives are matrix products: the tangent ``2 Σ_k (a_ik − b_jk)(ȧ_ik − ḃ_jk)`` is
    ``2 (a_i·ȧ_i − ȧ_i·b_j − a_i·ḃ_j + b_j·ḃ_j)``, so reverse mode transposes two (N1, D)·(D, N2)
    products instead of the loop (at N1 = 512, N2 = 2048, D = 8 the loop's gradient took 65 ms
    against 6.6 ms for the values).  The expanded tangent is not exactly 0 at equal rows (its
    rounding error is ~ε|a|·|ȧ|, after centring on A's mean), so only kernels whose profile is
    smooth at 0 use it (``_smooth_profile``)."""
    return _sqdist_by_columns(A, B)


@_column_sqdist.defjvp
def _column_sqdist_jvp(primals, tangents):
    A, B = primals
    dA, dB = tangents
    c = jax.lax.stop_gradient(jnp.mean(A, axis=0))  # distances are shift invariant; centring keeps
    Ac, Bc = A - c, B - c                            # the products' terms near the result's size
    dot = (2.0 * jnp.sum(Ac * dA, 1)[:, None] - 2.0 * dA @ Bc.T
           - 2.0 * Ac @ dB.T + 2.0 * jnp.sum(Bc * dB, 1)[None, :])
    return _column_sqdist(A, B), dot


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
    """Squared exponential ``s^2 exp(-|x-x'|^2 / (2 l^2))``; vector ``lengthscale`` gives ARD.

    Arguments ``RBF(variance=1.0, lengthscale=1.0)``, positional too (GPflow's order); the
    Matérn kernels take the same.
    """

    variance: object = _positional(param("positive", 1.0, shape="scalar"))
    lengthscale: object = _positional(param("positive", 1.0, shape="scalar_or_vector"))

    _smooth_profile = True

    def _profile(self, d2):
        return jnp.exp(-0.5 * d2)


class Matern12(Stationary):
    """Matérn ν=1/2 (exponential) kernel ``s^2 exp(-r)``, ``r = |x-x'|/l``."""

    variance: object = _positional(param("positive", 1.0, shape="scalar"))
    lengthscale: object = _positional(param("positive", 1.0, shape="scalar_or_vector"))

    def _profile(self, d2):
        return jnp.exp(-_safe_sqrt(d2))


class Matern32(Stationary):
    """Matérn ν=3/2 kernel ``s^2 (1 + √3 r) exp(-√3 r)``."""

    variance: object = _positional(param("positive", 1.0, shape="scalar"))
    lengthscale: object = _positional(param("positive", 1.0, shape="scalar_or_vector"))

    def _profile(self, d2):
        r = jnp.sqrt(3.0) * _safe_sqrt(d2)
        return (1.0 + r) * jnp.exp(-r)


class Matern52(Stationary):
    """Matérn ν=5/2 kernel ``s^2 (1 + √5 r + 5 r²/3) exp(-√5 r)``."""

    variance: object = _positional(param("positive", 1.0, shape="scalar"))
    lengthscale: object = _positional(param("positive", 1.0, shape="scalar_or_vector"))

    def _profile(self, d2):
        r = jnp.sqrt(5.0) * _safe_sqrt(d2)
        return (1.0 + r + 5.0 * d2 / 3.0) * jnp.exp(-r)


class Linear(Kernel):
    """Linear (dot-product) kernel ``s^2 x·x'``; ``Linear(variance=1.0)``, positional too."""

    variance: object = _positional(param("positive", 1.0, shape="scalar"))

    def _K(self, X1, X2):
        return self.variance * (X1 @ X2.T)

    def _diag(self, X):
        return self.variance * jnp.sum(X**2, 1)


class Constant(Kernel):
    """Constant kernel ``s^2`` (a random offset shared by all points); ``k + c`` adds one of
    variance ``c``.  ``Constant(variance=1.0)``, positional too."""

    variance: object = _positional(param("positive", 1.0, shape="scalar"))

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

    The variance may be given positionally, ``White(0.01)`` being how a noise term is usually
    written (as every kernel's parameters may, in the order of their keywords).
    """

    variance: object = _positional(param("positive", 1.0, shape="scalar"))

    def _K(self, X1, X2):
        return jnp.where(same_rows(X1, X2), self.variance, 0.0).astype(X1.dtype)

    def _diag(self, X):
        return jnp.full(X.shape[0], self.variance, dtype=X.dtype)

    def inducing_cov(self, Z):
        Z = self._select(_as_2d(Z))
        return self.variance * jnp.eye(Z.shape[0], dtype=Z.dtype)

    def inducing_cross(self, Z, X):
        Z, X = self._select(_as_2d(Z)), self._select(_as_2d(X))
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
    """Sum of kernels; built by ``k1 + k2`` (``Sum((k1, k2))`` also works).

    Each term keeps its own ``active_dims`` and its own form of the inducing variables'
    covariances (:class:`White`, :class:`MultiscaleRBF`).
    """

    kernels: tuple = dataclasses.field(default=(), kw_only=False, metadata={"check": _check_kernels})

    def structure(self) -> str:
        return " + ".join(k.structure() for k in self.kernels)

    def _K(self, X1, X2):
        return sum(k(X1, X2) for k in self.kernels)

    def _diag(self, X):
        return sum(k.diag(X) for k in self.kernels)

    def inducing_cov(self, Z):
        Z = self._select(_as_2d(Z))
        return sum(k.inducing_cov(Z) for k in self.kernels)

    def inducing_cross(self, Z, X):
        Z, X = self._select(_as_2d(Z)), self._select(_as_2d(X))
        return sum(k.inducing_cross(Z, X) for k in self.kernels)

    def __add__(self, other):
        if isinstance(other, Kernel) and self.active_dims is None:
            return Sum(kernels=self.kernels + (other,))
        c = _number(other)
        if c is not None and self.active_dims is None:
            c = _checked_factor(c, "add")
            return self if _is_zero(c) else Sum(kernels=self.kernels + (Constant(variance=c),))
        return super().__add__(other)


class Product(Kernel):
    """Elementwise product of kernels; built by ``k1 * k2`` (``Product((k1, k2))`` also works).

    Each factor keeps its own ``active_dims``; the inducing variables are function values.
    """

    kernels: tuple = dataclasses.field(default=(), kw_only=False, metadata={"check": _check_kernels})

    def structure(self) -> str:
        return " * ".join(k.structure() for k in self.kernels)

    def _K(self, X1, X2):
        out = self.kernels[0](X1, X2)
        for k in self.kernels[1:]:
            out = out * k(X1, X2)
        return out

    def _diag(self, X):
        out = self.kernels[0].diag(X)
        for k in self.kernels[1:]:
            out = out * k.diag(X)
        return out

    def __mul__(self, other):
        if isinstance(other, Kernel) and self.active_dims is None:
            return Product(kernels=self.kernels + (other,))
        return super().__mul__(other)


def _check_kernel(owner, name, val):
    if not isinstance(val, Kernel):
        raise ValueError(f"{owner}: {name} must be a gpvi kernel, got {val!r} (of type {type(val).__name__})")
    return val


class Scale(Kernel):
    """``variance · k(x, x')``: a kernel times a learnable positive factor; built by ``c * k`` or
    ``k * c`` for a number ``c > 0`` (the factor's starting value), as scikit-learn's
    ``ConstantKernel(c) * k``.

    The factor is learned on the log scale like every variance, under the dotted name
    ``<path>.variance`` (``kernel.variance`` for a model's kernel ``2.0 * RBF()``, whose own
    parameters become ``kernel.kernel.variance`` and ``kernel.kernel.lengthscale``).  Since
    RBF has a variance of its own, the two are then redundant (as in scikit-learn); the factor
    matters for a kernel without a variance of its own, such as a user's.
    ``c * Scale(k, v)`` is ``Scale(k, c·v)``.  The inducing variables keep ``kernel``'s form
    (scaled).  Arguments: ``Scale(kernel, variance=1.0)``, both positional.
    """

    kernel: object = dataclasses.field(kw_only=False, metadata={"check": _check_kernel})
    variance: object = _positional(param("positive", 1.0, shape="scalar"))

    def structure(self) -> str:
        return f"Scale * ({self.kernel.structure()})"

    def _K(self, X1, X2):
        return self.variance * self.kernel(X1, X2)

    def _diag(self, X):
        return self.variance * self.kernel.diag(X)

    def inducing_cov(self, Z):
        return self.variance * self.kernel.inducing_cov(self._select(_as_2d(Z)))

    def inducing_cross(self, Z, X):
        return self.variance * self.kernel.inducing_cross(self._select(_as_2d(Z)), self._select(_as_2d(X)))


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
        return _multiscale_gram(jnp.broadcast_to(l1, Z1.shape), Z1, jnp.broadcast_to(l2, Z2.shape), Z2)

    def inducing_cov(self, Z):
        Z = self._select(_as_2d(Z))
        lz, _ = self._inducing_l(Z)
        return self.variance * self.inducing_gram(Z, lz, Z, lz)

    def inducing_cross(self, Z, X):
        Z, X = self._select(_as_2d(Z)), self._select(_as_2d(X))
        lz, ls = self._inducing_l(Z)
        return self.variance * self.inducing_gram(Z, lz, X, ls)


# Columns whose squared lengthscale sums are multiplied before one logarithm in
# _multiscale_gram: each factor l1² + l2² is finite and positive, so a product of four overflows
# only for lengthscales beyond ~1e38 (or underflows below ~1e-38).
_LOG_BLOCK = 4


def _multiscale_gram(l1, Z1, l2, Z2):
    """:meth:`MultiscaleRBF.inducing_gram` for per-row lengthscales on both sides, ``l1``
    (M1, D) and ``l2`` (M2, D): a column loop over (M1, M2) arrays (never (M1, M2, D)).

    The prefactor ``Π_d (2 l1 l2 / (l1² + l2²))^{1/2}`` is ``exp`` of separable row and column
    sums of ``log l`` less half the log of the products of ``l1² + l2²`` over blocks of
    :data:`_LOG_BLOCK` columns: one logarithm per block instead of two per column.  At M = 512,
    D = 8 the value and its gradient take about half the time of the per-column logarithms.
    """
    D = Z1.shape[1]
    a2, b2 = l1 * l1, l2 * l2
    log_pre = 0.5 * (D * np.log(2.0) + jnp.sum(jnp.log(l1), axis=1)[:, None]
                     + jnp.sum(jnp.log(l2), axis=1)[None, :])
    logs, expo = 0.0, 0.0
    for start in range(0, D, _LOG_BLOCK):  # a loop over input columns, not data points
        prod = 1.0
        for k in range(start, min(D, start + _LOG_BLOCK)):
            s2 = a2[:, k, None] + b2[None, :, k]
            expo = expo + (Z1[:, k, None] - Z2[None, :, k]) ** 2 / s2
            prod = prod * s2
        logs = logs + jnp.log(prod)
    return jnp.exp(log_pre - 0.5 * logs - expo)


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


def _per_column(v, k):
    """Entry ``k`` of a scalar-or-vector parameter ``v`` (a 0-d or 1-D array)."""
    return v if v.ndim == 0 else v[k]


def _check_length(kernel, name, v, D):
    """A ``ValueError`` when the vector parameter ``v`` does not have one entry per input column."""
    if v.ndim == 1 and v.shape[0] != D:
        where = f" (active_dims {list(kernel.active_dims)})" if kernel.active_dims is not None else ""
        raise ValueError(f"{type(kernel).__name__}: {name} has {v.shape[0]} entries but the inputs have {D} "
                         f"columns{where}")


class RationalQuadratic(Stationary):
    """Rational quadratic kernel ``s² (1 + r² / (2α))^(−α)``, ``r = |x − x'| / ℓ``.

    A scale mixture of RBF kernels (Rasmussen & Williams 2006, Eq. 4.19): ``α → ∞`` gives the
    RBF kernel, small ``α`` mixes many lengthscales.  The form of GPflow's
    ``RationalQuadratic`` and of scikit-learn's (which has no variance:
    ``ConstantKernel(s²) * RationalQuadratic(length_scale=ℓ, alpha=α)``).  ``lengthscale`` is a
    number or one per input column (ARD); ``alpha`` (> 0) is learned like the others.
    Arguments ``RationalQuadratic(variance=1.0, lengthscale=1.0, alpha=1.0)``, positional too.
    """

    variance: object = _positional(param("positive", 1.0, shape="scalar"))
    lengthscale: object = _positional(param("positive", 1.0, shape="scalar_or_vector"))
    alpha: object = _positional(param("positive", 1.0, shape="scalar"))

    _smooth_profile = True

    def _profile(self, d2):
        # (1 + d2/2α)^(−α) as exp(−α log1p(·)): exact for small d2 and α of any size
        return jnp.exp(-self.alpha * jnp.log1p(d2 / (2.0 * self.alpha)))


class Periodic(Kernel):
    """Periodic kernel ``s² exp(−2 Σ_d sin²(π (x_d − x'_d) / p_d) / ℓ_d²)``.

    In one dimension this is scikit-learn's ``ExpSineSquared`` (times ``ConstantKernel(s²)``)
    with ``length_scale = ℓ`` and ``periodicity = p``, and MacKay's periodic kernel; GPflow's
    ``Periodic(SquaredExponential(variance=s², lengthscales=ℓ/2), period=p)`` is the same
    kernel.  On several columns it is the product of the one-dimensional kernels (GPflow's
    form; scikit-learn applies the sine to the Euclidean distance instead, which is not
    positive definite in general).  ``lengthscale`` and ``period`` are each a number or one
    per input column (ARD); both are learned on the log scale, like the variance.  A function
    drawn from it repeats every ``p`` exactly; multiply by an :class:`RBF` for a quasi-periodic
    one.  Arguments ``Periodic(variance=1.0, lengthscale=1.0, period=1.0)``, positional too.
    """

    variance: object = _positional(param("positive", 1.0, shape="scalar"))
    lengthscale: object = _positional(param("positive", 1.0, shape="scalar_or_vector"))
    period: object = _positional(param("positive", 1.0, shape="scalar_or_vector"))

    def _sin2(self, X1, X2):
        """``Σ_d sin²(π (x_d − x'_d) / p_d) / ℓ_d²`` (N1, N2)."""
        ls, p = jnp.asarray(self.lengthscale), jnp.asarray(self.period)
        D = X1.shape[1]
        _check_length(self, "lengthscale", ls, D)
        _check_length(self, "period", p, D)
        if D <= _EXACT_DIFF_MAX_D:
            # a loop over input columns, not data: exact differences, exactly 0 at equal inputs
            return sum(jnp.sin(jnp.pi * (X1[:, k, None] - X2[None, :, k]) / _per_column(p, k)) ** 2
                       / _per_column(ls, k) ** 2 for k in range(D))
        # Many columns: sin²(a − b) = (sin a cos b − cos a sin b)², three matrix products.
        a, b = jnp.pi * X1 / p, jnp.pi * X2 / p
        w = jnp.broadcast_to(1.0 / ls**2, (D,))
        sa, ca, sb, cb = jnp.sin(a), jnp.cos(a), jnp.sin(b), jnp.cos(b)
        s = (sa * sa * w) @ (cb * cb).T + (ca * ca * w) @ (sb * sb).T - 2.0 * (sa * ca * w) @ (sb * cb).T
        return jnp.maximum(s, 0.0)

    def _K(self, X1, X2):
        return self.variance * jnp.exp(-2.0 * self._sin2(X1, X2))

    def _diag(self, X):
        return jnp.full(X.shape[0], jnp.asarray(self.variance, dtype=X.dtype))


def _check_degree(owner, name, val):
    """A whole number >= 1 (an integral float such as GPflow's ``degree=3.0`` included), as int."""
    if not isinstance(val, (bool, np.bool_)) and isinstance(val, (int, float, np.integer, np.floating)) \
            and math.isfinite(float(val)) and float(val) == int(val) and int(val) >= 1:
        return int(val)
    raise ValueError(f"{owner}: {name} must be a whole number >= 1, got {val!r}")


class Polynomial(Kernel):
    """Polynomial kernel ``(Σ_d s²_d x_d x'_d + c)^degree``.

    GPflow's ``Polynomial(degree, variance, offset)``, and scikit-learn's
    ``DotProduct(sigma_0=√c) ** degree`` when ``s² = 1`` (in general
    ``ConstantKernel(s^(2·degree)) * DotProduct(sigma_0=√(c/s²)) ** degree``).  ``degree`` is a
    static whole number ≥ 1 (not learned); ``variance`` (a number, or one per input column:
    ARD) and ``offset`` (``c`` > 0) are learned on the log scale.  It is not stationary: inputs
    far from the origin have large variances, so it is meant for standardised inputs.
    Arguments ``Polynomial(degree=2, variance=1.0, offset=1.0)``, positional too.
    """

    degree: int = _positional(static(2, check=_check_degree))
    variance: object = _positional(param("positive", 1.0, shape="scalar_or_vector"))
    offset: object = _positional(param("positive", 1.0, shape="scalar"))

    def _weights(self, X):
        v = jnp.asarray(self.variance)
        _check_length(self, "variance", v, X.shape[1])
        return v

    def _K(self, X1, X2):
        return ((X1 * self._weights(X1)) @ X2.T + self.offset) ** self.degree

    def _diag(self, X):
        return (jnp.sum(X * X * self._weights(X), axis=1) + self.offset) ** self.degree


# --- kernels from a text spec (the command line's --kernel) -----------------------------------------
#: The names that :func:`kernel_from_spec` knows, in the order it lists them.
SPEC_NAMES = ("rbf", "matern12", "matern32", "matern52", "linear", "periodic", "rq", "polynomial")
_STATIONARY_SPEC = ("rbf", "matern12", "matern32", "matern52", "periodic", "rq")


def _parse_spec(spec: str):
    """``spec`` as a list of terms, each a list of names (``*`` binds tighter than ``+``)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"kernel spec must be a non-empty text such as 'rbf+periodic', got {spec!r}")
    terms = []
    for term in spec.lower().split("+"):
        names = [n.strip() for n in term.split("*")]
        if any(not n for n in names):
            raise ValueError(f"kernel spec {spec!r} has an empty term or factor: write names joined by + and *, "
                             "such as 'rbf+periodic' or 'matern52*linear'")
        unknown = [n for n in names if n not in SPEC_NAMES]
        if unknown:
            import difflib

            hint = difflib.get_close_matches(unknown[0], SPEC_NAMES, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(f"unknown kernel {unknown[0]!r} in {spec!r}{extra}; known: {', '.join(SPEC_NAMES)}, "
                             "joined by + and * (* binds tighter)")
        terms.append(names)
    return terms


def kernel_from_spec(spec: str, input_dim: int, *, ard: bool = True, lengthscale: float = 1.0,
                     period: float | None = None) -> Kernel:
    """The kernel written ``spec``: names joined by ``+`` and ``*`` (``*`` binds tighter), e.g.
    ``"rbf+periodic"``, ``"matern52*linear"``, ``"rbf*periodic+linear"``.

    Names (:data:`SPEC_NAMES`): ``rbf``, ``matern12``, ``matern32``, ``matern52``, ``linear``,
    ``periodic``, ``rq`` (:class:`RationalQuadratic`, ``alpha`` 1) and ``polynomial``
    (:class:`Polynomial` of degree 2, offset 1).  Starting values, for ``input_dim`` input
    columns: every lengthscale ``lengthscale`` (one per column with ``ard=True``, the default,
    for the stationary kernels: rbf, matern*, periodic, rq), a periodic kernel's period
    ``period`` (default ``lengthscale``; one per column with ARD); the first factor of each
    of the ``T`` terms has variance ``1/T`` (so that the sum starts at variance about 1), the
    other factors variance 1.  Raises ``ValueError`` for an unknown name or a malformed spec.
    """
    terms = _parse_spec(spec)
    D = int(input_dim)
    if D < 1:
        raise ValueError(f"input_dim must be >= 1, got {input_dim!r}")
    ls = np.full(D, float(lengthscale)) if ard else float(lengthscale)
    p0 = float(lengthscale if period is None else period)
    per = np.full(D, p0) if ard else p0
    built = []
    for names in terms:
        factors = [_spec_kernel(name, 1.0 / len(terms) if j == 0 else 1.0, ls, per) for j, name in enumerate(names)]
        built.append(factors[0] if len(factors) == 1 else Product(kernels=tuple(factors)))
    return built[0] if len(built) == 1 else Sum(kernels=tuple(built))


def _spec_kernel(name, var, ls, per):
    """One kernel of :func:`kernel_from_spec`, by its name, at its starting values."""
    if name == "rbf":
        return RBF(var, ls)
    if name == "matern12":
        return Matern12(var, ls)
    if name == "matern32":
        return Matern32(var, ls)
    if name == "matern52":
        return Matern52(var, ls)
    if name == "linear":
        return Linear(var)
    if name == "periodic":
        return Periodic(var, ls, per)
    if name == "rq":
        return RationalQuadratic(var, ls, 1.0)
    return Polynomial(2, var, 1.0)
