"""Likelihoods with several latent values per row, and the softmax (multiclass) likelihood.

A likelihood with ``num_latents = Q > 1`` sees, per row, the Q latent values
``f_i = (f_i1, …, f_iQ)``; under the factorised posterior of :class:`gpvi.models.multilatent.MultiLatent`
their marginal is ``N(m_i, diag(v_i))``.  Its methods take ``m, v`` of shape (n, Q) and
:meth:`~gpvi.likelihoods.Likelihood.variational_moments` returns ``E`` (n,) and ``ρ, λ`` (n, Q),
``ρ_iq = ∂E_i/∂m_iq`` and ``λ_iq = 2 ∂E_i/∂v_iq`` — per latent, which is all a factorised q
needs (Nguyen & Bonilla 2014, §3.2: "q_k(n) has a diagonal covariance").

The Gaussian expectation ``E[log Σ_k e^{f_k}]`` is a fixed weighted sum over the nodes ``z_p``
of a standard normal (:func:`softmax_nodes`), so the bound stays a deterministic function of
(m, v) and its closed-form derivatives are those of the rule:

- Q ≤ :data:`PRODUCT_MAX_CLASSES` (4) classes: ``log p(y | f) = −log(1 + Σ_{c≠y} e^{f_c − f_y})``
  depends on the Q − 1 differences from the labelled class only, which are jointly normal with
  covariance ``diag(v_c) + v_y 11ᵀ``; so the rule is product Gauss–Hermite over those Q − 1
  dimensions (:func:`product_nodes`, :func:`points_per_difference`: 40, 14² or 6³ nodes by
  default), through each row's Cholesky factor of that covariance.  Against the product rule
  over the Q latents themselves that gpvi used before (20², 10³, 5⁴ nodes) it has 3–10× fewer
  nodes and errors in ``E``, ``ρ`` and ``λ`` no larger (smaller for Q = 3 and 4; measured in
  ``tests/likelihoods/test_softmax_rules.py``);
- more classes: :func:`qmc_nodes`, a fixed scrambled-Sobol point set mapped through the normal
  quantile, in antithetic pairs ``±z`` (exact for every odd moment, so for the linear term of
  log-sum-exp), with equal weights.  Its size does not depend on Q (1024 nodes by default), so the
  cost is linear in the number of classes, where the product rule's n^Q nodes (n ≥ 2) had only 2
  points per class from 7 classes on and ran out of memory well before 50 classes.

The accuracy of both rules against a Monte Carlo reference is measured in ``benchmarks/README.md``
("Softmax expectation rules").

Or by Monte Carlo when wrapped in :class:`gpvi.MonteCarlo`.
"""
from __future__ import annotations

import itertools
import numbers
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np

from gpvi._module import static
from gpvi.likelihoods.base import Likelihood, finite_1d
from gpvi.likelihoods.quadrature import hermite_nodes

__all__ = ["Softmax", "product_nodes", "qmc_nodes", "softmax_nodes", "softmax_rule", "points_per_difference",
           "PRODUCT_NODES_BUDGET", "LATENT_NODES_BUDGET", "SOFTMAX_RULES",
           "PRODUCT_MAX_CLASSES", "QMC_PAIRS_PER_POINT", "QMC_MAX_ENTRIES", "ROW_BLOCK_VALUES"]

#: Most nodes of the product rule over the C − 1 differences from C ≥ 3 classes by default:
#: ``quadrature_points`` per difference, lowered so that the product stays within this many
#: (C = 3: 14²; C = 4: 6³).
PRODUCT_NODES_BUDGET = 216


#: Most nodes of the product rule over all C latents (``rule="latents"``, the rule of model files
#: written before the rule over the differences): 20², 10³, 5⁴.
LATENT_NODES_BUDGET = 1000

#: The values of ``Softmax.rule``.
SOFTMAX_RULES = ("differences", "latents")


def _points_per_latent(n: int, C: int) -> int:
    """Gauss–Hermite points per latent of the product rule over all C latents (``rule="latents"``)."""
    return max(2, min(n, int(np.floor(LATENT_NODES_BUDGET ** (1.0 / C) + 1e-9))))


def points_per_difference(n: int, C: int) -> int:
    """Gauss–Hermite points per dimension of :class:`Softmax`'s product rule over the C − 1
    differences of C classes, for ``quadrature_points = n``: ``2n`` for two classes (one
    dimension: 40 nodes by default, as accurate in E and ρ as the 20² nodes of a product rule
    over both latents), else ``n`` lowered to keep ``points^(C−1)`` within
    :data:`PRODUCT_NODES_BUDGET` (at least 2)."""
    if C <= 2:
        return 2 * n
    return max(2, min(n, int(np.floor(PRODUCT_NODES_BUDGET ** (1.0 / (C - 1)) + 1e-9))))


@lru_cache(maxsize=32)
def _product(n: int, Q: int):
    z, w = hermite_nodes(n)
    Z = np.array(list(itertools.product(z, repeat=Q)))
    W = np.prod(np.array(list(itertools.product(w, repeat=Q))), axis=1)
    return Z, W


def product_nodes(n: int, Q: int):
    """Nodes (n^Q, Q) and weights (n^Q,) of the product Gauss–Hermite rule for ``N(0, I_Q)``."""
    Z, W = _product(int(n), int(Q))
    return jnp.asarray(Z), jnp.asarray(W)


#: Most classes for which :class:`Softmax` uses the product rule (≥ 5 points per class within
#: :data:`PRODUCT_NODES_BUDGET`); from Q = 5 on, where it would have 3 points per class or fewer,
#: the antithetic QMC rule's 1024 nodes were 5× (Q = 5) to 40× (Q = 10) more accurate in E.
PRODUCT_MAX_CLASSES = 4

#: Antithetic pairs of the QMC rule per unit of ``quadrature_points``, rounded up to a power of
#: two (Sobol's balanced sizes): the default 20 points give 512 pairs, 1024 nodes.
QMC_PAIRS_PER_POINT = 25

#: Most entries (nodes × classes) of a QMC node array (2²⁴ float64: 128 MiB).  Each row's
#: expectation then touches nodes × classes values, so the per-row work is bounded as well.
QMC_MAX_ENTRIES = 2 ** 24
#: Values (rows × classes × nodes) per block of rows of the QMC rule's sums
#: (:meth:`Softmax._stacked`): 64 rows at C = 10 and 1 024 nodes (5 MiB per array), where blocks
#: of 16 and of 256 rows were slower; fewer rows for more classes or nodes, at least one.
ROW_BLOCK_VALUES = 64 * 10 * 1024

#: Seed of the scrambling of the QMC rule (fixed: the bound is a deterministic function).
QMC_SEED = 20141208


def _qmc_pairs(quadrature_points: int) -> int:
    return 1 << int(np.ceil(np.log2(QMC_PAIRS_PER_POINT * int(quadrature_points))))


@lru_cache(maxsize=32)
def _qmc(pairs: int, Q: int, seed: int):
    import warnings

    from scipy.special import ndtri
    from scipy.stats import qmc

    with warnings.catch_warnings():  # "balance properties" warning for a size not a power of 2
        warnings.simplefilter("ignore")
        u = qmc.Sobol(d=Q, scramble=True, seed=np.random.default_rng(np.random.SeedSequence(seed))).random(pairs)
    z = ndtri(np.clip(u, 1e-15, 1.0 - 1e-15))
    Z = np.concatenate([z, -z])
    Z.flags.writeable = False
    return Z, np.full(2 * pairs, 1.0 / (2 * pairs))


def qmc_nodes(pairs: int, Q: int, seed: int = QMC_SEED):
    """Nodes (2·pairs, Q) and equal weights of the antithetic randomised-QMC rule for ``N(0, I_Q)``:
    ``pairs`` scrambled Sobol points (fixed ``seed``) through the normal quantile, each with its
    mirror image ``−z``, so the rule integrates every odd function (every odd moment) exactly.

    Raises ValueError where the node array would exceed :data:`QMC_MAX_ENTRIES` entries."""
    pairs, Q = int(pairs), int(Q)
    if pairs < 1 or Q < 1:
        raise ValueError(f"qmc_nodes needs pairs ≥ 1 and Q ≥ 1, got pairs={pairs}, Q={Q}")
    if 2 * pairs * Q > QMC_MAX_ENTRIES:
        raise ValueError(
            f"Softmax's quadrature rule would have {2 * pairs} nodes × {Q} classes = {2 * pairs * Q:,} entries, "
            f"more than QMC_MAX_ENTRIES = {QMC_MAX_ENTRIES:,} (and each row's expectation would touch as many "
            f"values): lower quadrature_points (nodes = 2·2^⌈log2({QMC_PAIRS_PER_POINT}·quadrature_points)⌉), or "
            f"use gpvi.MonteCarlo(Softmax(num_classes={Q}), num_samples=S) with a smaller S")
    Z, W = _qmc(pairs, Q, int(seed))
    return jnp.asarray(Z), jnp.asarray(W)


def softmax_rule(quadrature_points: int, Q: int) -> str:
    """``"product"`` or ``"qmc"``: the rule :class:`Softmax` uses for Q classes."""
    return "product" if int(Q) <= PRODUCT_MAX_CLASSES else "qmc"


def softmax_nodes(quadrature_points: int, Q: int, rule: str = "differences"):
    """Nodes and weights (P,) of :class:`Softmax`'s rule for Q classes:

    - Q ≤ :data:`PRODUCT_MAX_CLASSES`: nodes (P, Q − 1) of ``N(0, I_{Q−1})``, product
      Gauss–Hermite with ``points_per_difference(quadrature_points, Q)`` points per dimension
      (``quadrature_points``, lowered so that the product stays within
      :data:`PRODUCT_NODES_BUDGET`), for the Q − 1 differences from a reference class;
    - more classes: nodes (P, Q) of ``N(0, I_Q)``, :func:`qmc_nodes` with
      ``2^⌈log2(QMC_PAIRS_PER_POINT·quadrature_points)⌉`` antithetic pairs (quadrature_points =
      20: 1024 nodes whatever Q; 10: 512; 40: 2048).

    With ``rule="latents"`` and Q ≤ :data:`PRODUCT_MAX_CLASSES`: nodes (P, Q) of the product rule
    over all Q latents, ``min(quadrature_points, ⌊1000^{1/Q}⌋)`` points per latent (20², 10³, 5⁴).
    """
    if softmax_rule(quadrature_points, Q) == "qmc":
        return qmc_nodes(_qmc_pairs(quadrature_points), Q)
    if rule == "latents":
        return product_nodes(_points_per_latent(quadrature_points, Q), Q)
    return product_nodes(points_per_difference(quadrature_points, Q), Q - 1)


def _check_rule(owner, name, rule):
    if rule not in SOFTMAX_RULES:
        raise ValueError(f"{owner}: {name} must be one of {SOFTMAX_RULES}, got {rule!r}")
    return rule


def _check_classes(owner, name, c):
    if isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Integral) or c < 2:
        raise ValueError(f"{owner}: {name} must be an int ≥ 2 (the number of classes C), got {c!r}")
    return int(c)


def _check_reference(owner, name, r):
    if r is None:
        return None
    if isinstance(r, (bool, np.bool_)) or not isinstance(r, numbers.Integral) or r < 0:
        raise ValueError(f"{owner}: {name} must be None or a class index ≥ 0, got {r!r}")
    return int(r)


def _mean_hessian(ps, pw, Ep):
    """``Σ_p w_p π_pa π_pb − δ_ab E[π_a]`` (…, C, C): a softmax rule's second derivative in the
    means, from the softmax ``ps`` (C arrays (…, P)) at the nodes, ``pw`` the same times the weights
    and ``Ep`` (C arrays (…)) their weighted sums; each product once (the matrix is symmetric)."""
    C = len(ps)
    Epp = {(a, b): jnp.sum(pw[a] * ps[b], axis=-1) for a in range(C) for b in range(a, C)}
    return jnp.stack([jnp.stack([Epp[min(a, b), max(a, b)] - (Ep[a] if a == b else 0.0) for b in range(C)], -1)
                      for a in range(C)], -2)


class Softmax(Likelihood):
    """Multiclass labels ``y ∈ {0, …, C−1}`` with ``p(y = c | f) = e^{f_c} / Σ_k e^{f_k}``:
    one latent function per class (Q = C), as in Nguyen & Bonilla (2014, Table 1).

    ``E = m_y − E[log Σ_k e^{f_k}]``; the second term by the fixed rule of
    :func:`softmax_nodes`, or by Monte Carlo with ``gpvi.MonteCarlo(Softmax(C), num_samples=S)``:

    - C ≤ 4 (:data:`PRODUCT_MAX_CLASSES`): product Gauss–Hermite over the C − 1 differences
      from the labelled class, :func:`points_per_difference` points per difference
      (40, 14², 6³ nodes by default);
    - C ≥ 5: antithetic scrambled-Sobol nodes with equal weights (:func:`qmc_nodes`),
      ``quadrature_points`` sets their number (default 20: 1024 nodes for any C), so time grows
      linearly in C (rows × nodes × C values per evaluation, summed over blocks of rows of
      about :data:`ROW_BLOCK_VALUES` values, so memory stays bounded).  A
      ``quadrature_points`` whose node array would exceed :data:`QMC_MAX_ENTRIES` raises
      ValueError (in ``validate``, so when a fit starts, or when the rule is first used).

    Either way ``variational_moments`` and ``moments_and_mean_hessians`` are the exact
    derivatives of the rule used, so engines see one deterministic bound.

    ``rule="latents"`` (C ≤ 4) is the product rule over all C latents (20², 10³, 5⁴ nodes) that
    gpvi used before the rule over the differences; a model file written then is read with it,
    so that it predicts bit for bit.

    ``reference=r`` (C ≥ 3) is the identifiable multinomial logit: class r's logit is held at 0
    and the model has C − 1 latents, one per other class in order (``num_latents = C − 1``;
    every method takes and returns (…, C − 1) latent arrays, while ``predict_proba`` still
    gives all C classes).  The softmax is unchanged by adding one function to every logit, so
    with one latent per class the bound is flat along that shift except for the prior; with
    per-class kernels learned, a search then drives one class's kernel variance towards zero
    and crawls there (USPS 4-7-9, benchmarks/README.md).  A reference class removes the shift
    and a third of the work per pass for three classes; which class is the reference changes
    the model and its optimum (there: 10 and 21 nats between the three choices).
    """

    num_classes: int = static(None, check=_check_classes)
    rule: str = static("differences", check=_check_rule)
    reference: int | None = static(None, check=_check_reference)

    def __post_init__(self):
        if self.reference is not None and not (self.num_classes >= 3 and self.reference < self.num_classes):
            raise ValueError(f"Softmax: reference={self.reference} needs num_classes ≥ 3 and a class index "
                             f"below num_classes={self.num_classes} (for two classes use Bernoulli)")

    #: Field values that a model file written before the field existed means (gpvi.io): such a
    #: file's softmax used the rule over all latents, which it keeps, so it predicts bit for bit.
    _file_defaults = {"rule": "latents"}

    @property
    def num_latents(self) -> int:
        return self.num_classes - (self.reference is not None)

    def _full(self, a):
        """Latent values (…, C − 1) with the reference class's zero put in: (…, C)."""
        if self.reference is None:
            return a
        a = jnp.asarray(a)
        r = self.reference
        return jnp.concatenate([a[..., :r], jnp.zeros(a.shape[:-1] + (1,), a.dtype), a[..., r:]], axis=-1)

    def _latent_part(self, t, axes=1):
        """``t`` (…, C) or, with ``axes=2``, (…, C, C) without the reference class's entries."""
        if self.reference is None:
            return t
        keep = np.array([c for c in range(self.num_classes) if c != self.reference])
        t = jnp.take(t, keep, axis=-1)
        return jnp.take(t, keep, axis=-2) if axes == 2 else t

    def validate(self, y):
        if softmax_rule(self.quadrature_points, self.num_classes) == "qmc":
            qmc_nodes(_qmc_pairs(self.quadrature_points), self.num_classes)  # ValueError where too large
        y = finite_1d(y).astype(np.float64)
        bad = (y < 0) | (y > self.num_classes - 1) | (y != np.round(y))
        if np.any(bad):
            raise ValueError(f"y has labels {np.unique(y[bad])[:5].tolist()} outside 0..{self.num_classes - 1} "
                             f"(Softmax with num_classes={self.num_classes} needs integer labels 0..C−1)")
        return y

    def log_prob(self, y, f):
        """``log p(y | f)`` for labels ``y`` (…) and latents ``f`` (…, Q)."""
        return self._log_prob_full(y, self._full(f))

    def _log_prob_full(self, y, f):
        idx = jnp.asarray(y).astype(jnp.int32)
        fy = jnp.take_along_axis(f, idx[..., None], axis=-1)[..., 0]
        return fy - jax.scipy.special.logsumexp(f, axis=-1)

    def _nodes(self):
        return softmax_nodes(self.quadrature_points, self.num_classes, self.rule)

    @property
    def _over_latents(self) -> bool:
        """Whether the rule's nodes are over the C latents (QMC, or ``rule="latents"``)."""
        return self.num_classes > PRODUCT_MAX_CLASSES or self.rule == "latents"

    def _latent_rule(self, y, m, v):
        """``E``, the unnormalised softmax ``e^{f_c − max}`` and its total at the nodes of the
        product rule over all latents (``rule="latents"``), class by class over (…, P) arrays."""
        Z, W = self._nodes()
        s = jnp.sqrt(v)
        fs = [m[..., c, None] + s[..., c, None] * Z[:, c] for c in range(self.num_classes)]  # (…, P)
        mx = fs[0]
        for f in fs[1:]:
            mx = jnp.maximum(mx, f)
        es = [jnp.exp(f - mx) for f in fs]
        tot = sum(es[1:], es[0])
        idx = jnp.asarray(y).astype(jnp.int32)
        E = jnp.take_along_axis(m, idx[..., None], axis=-1)[..., 0] - (mx + jnp.log(tot)) @ W
        return E, es, tot

    def _latent_moments(self, y, m, v, hessians: bool):
        """``(E, ρ, λ[, h])`` of the product rule over all latents (``rule="latents"``)."""
        Z, W = self._nodes()
        C = self.num_classes
        E, es, tot = self._latent_rule(y, m, v)
        ps = [e / tot for e in es]
        Ep = jnp.stack([p @ W for p in ps], axis=-1)
        lam = -jnp.stack([p @ (Z[:, c] * W) for c, p in enumerate(ps)], axis=-1) / jnp.sqrt(v)
        rho = (jnp.arange(C) == jnp.asarray(y).astype(jnp.int32)[..., None]).astype(m.dtype) - Ep
        if not hessians:
            return E, rho, lam
        return E, rho, lam, _mean_hessian(ps, [p * W for p in ps], [Ep[..., c] for c in range(C)])

    def _latents(self, m, v):
        """``f`` at the rule's nodes: (n, P, C)."""
        Z, _ = self._nodes()
        return m[..., None, :] + jnp.sqrt(v)[..., None, :] * Z

    def _differences(self, m, v, ref):
        """The rule over the C−1 differences ``d_j = f_{o_j} − f_r`` from a reference class
        ``r = ref`` (n,) of each row (the others ``o_j = (r + j) mod C``, j = 1 … C−1):
        ``(logits, lse, pullback)``: ``logits`` the list of C (n, P) logits ``[0, d_1, …]`` at the
        nodes, ``lse`` their log-sum-exp (n, P), and ``pullback`` the vector–Jacobian product of
        the differences' Cholesky factor ``(diag, below)`` (each a list of C − 1 (n,) columns) to
        ``v`` (n, C), returned in the reference's order ``[r, o_1, …]``.

        The differences are ``N(μ, D + v_r 11ᵀ)``, ``μ_j = m_{o_j} − m_r``, ``D = diag(v_{o_j})``.
        The Cholesky factor of a diagonal plus ``β 11ᵀ`` has, in column j, the diagonal
        ``√(D_j + β_j)`` and every entry below it ``β_j / √(D_j + β_j)``, with ``β_0 = v_r`` and
        ``β_{j+1} = β_j D_j / (D_j + β_j)`` (no cancellation, whatever the scales)."""
        Z, _ = self._nodes()
        C = self.num_classes
        perm = (ref[..., None] + jnp.arange(C)) % C
        mp = jnp.take_along_axis(m, perm, axis=-1)

        def factor(vp):
            beta, diag, below = vp[..., 0], [], []
            for j in range(1, C):
                s = vp[..., j] + beta
                a = jnp.sqrt(s)
                diag.append(a)
                below.append(beta / a)
                beta = beta * vp[..., j] / s
            return diag, below

        (diag, below), pullback = jax.vjp(factor, jnp.take_along_axis(v, perm, axis=-1))
        logits, shared = [jnp.zeros(m.shape[:-1] + Z.shape[:1], m.dtype)], 0.0
        for j in range(1, C):
            zj = Z[:, j - 1]
            logits.append((mp[..., j] - mp[..., 0])[..., None] + shared + diag[j - 1][..., None] * zj)
            shared = shared + below[j - 1][..., None] * zj
        mx = logits[0]
        for f in logits[1:]:
            mx = jnp.maximum(mx, f)
        lse = mx + jnp.log(sum(jnp.exp(f - mx) for f in logits))
        return logits, lse, pullback

    def _at_nodes(self, y, m, v, hessians=False, derivatives=True):
        """``(E, ρ, λ[, h])`` of the rule over the C−1 differences from the labelled class
        (:meth:`_differences`), class by class over (…, P) arrays: on XLA:CPU the same sums over
        (n, P, C) arrays (a reduction over a minor axis of length C) took 3× longer."""
        Z, W = self._nodes()
        C = self.num_classes
        idx = jnp.asarray(y).astype(jnp.int32)
        logits, lse, pullback = self._differences(m, v, idx)
        E = -(lse @ W)  # the labelled class is the reference: log p(y | f) = −lse
        if not derivatives:
            return E
        ps = [jnp.exp(f - lse) for f in logits]  # softmax at the nodes, reference first
        Ep = [p @ W for p in ps]
        # ∂E/∂(factor): −Σ_p w_p π_pj z_pl over the nodes, for the diagonal (l = j) and for the
        # shared entries below it (l = j, rows below j: the later classes' softmax summed)
        pw = [p * W for p in ps]
        later = [jnp.zeros_like(pw[0])]  # later[j − 1] = Σ_{k > j} pw[k], as a running sum from the end
        for j in range(C - 1, 1, -1):
            later.insert(0, later[0] + pw[j])
        g_diag = [-(pw[j] @ Z[:, j - 1]) for j in range(1, C)]
        g_below = [-(later[j - 1] @ Z[:, j - 1]) for j in range(1, C)]
        (dv,) = pullback((g_diag, g_below))
        rho_p = jnp.stack([1.0 - Ep[0]] + [-e for e in Ep[1:]], axis=-1)
        inv = (jnp.arange(C) - idx[..., None]) % C  # class c sits at position (c − r) mod C
        rho = jnp.take_along_axis(rho_p, inv, axis=-1)
        lam = 2.0 * jnp.take_along_axis(dv, inv, axis=-1)
        if not hessians:
            return E, rho, lam
        hp = _mean_hessian(ps, pw, Ep)
        h = jnp.take_along_axis(jnp.take_along_axis(hp, inv[..., :, None], axis=-2), inv[..., None, :], axis=-1)
        return E, rho, lam, h

    def _stacked(self, y, m, v, moments: bool, hessians: bool = False):
        """``E`` and, with ``moments``, ``(ρ, λ[, h])`` of the QMC rule (C beyond
        :data:`PRODUCT_MAX_CLASSES`) over stacked arrays, where C separate (…, P) sums traced and
        compiled slowly (C = 50, 200 rows: 9 s to compile the moments, against 1.4 s stacked).

        The latents at the nodes are laid out (rows, C, P), so that the sums over the nodes run
        along the minor axis, and the rows go through in blocks of about :data:`ROW_BLOCK_VALUES`
        values (``lax.map``), so that a block's arrays stay in cache: at C = 10, 1 257 rows and
        1 024 nodes the moments took 290 ms over (rows, P, C) arrays at once, 28 ms so (with the
        mean Hessians 360 against 78 ms)."""
        lead = jnp.shape(m)[:-1]
        C = self.num_classes
        n = int(np.prod(lead, dtype=np.int64))
        y = jnp.broadcast_to(jnp.asarray(y), lead).reshape(n)
        m, v = jnp.reshape(m, (n, C)), jnp.reshape(v, (n, C))
        one = partial(self._stacked_rows, moments=moments, hessians=hessians)
        rows = max(1, ROW_BLOCK_VALUES // (C * self._nodes()[0].shape[0]))
        if n <= rows:
            out = one(y, m, v)
        else:
            pad = -n % rows  # padded rows: label 0, mean 0, variance 1 (finite), dropped below
            yb = jnp.pad(y, (0, pad)).reshape(-1, rows)
            mb = jnp.pad(m, ((0, pad), (0, 0))).reshape(-1, rows, C)
            vb = jnp.pad(v, ((0, pad), (0, 0)), constant_values=1.0).reshape(-1, rows, C)
            out = jax.lax.map(lambda a: one(*a), (yb, mb, vb))
            out = tuple(t.reshape((-1,) + t.shape[2:])[:n] for t in out)
        out = tuple(t.reshape(lead + t.shape[1:]) for t in out)
        return out if moments else out[0]

    def _stacked_rows(self, y, m, v, moments: bool, hessians: bool):
        """:meth:`_stacked` on one block of rows: ``y`` (n,), ``m``, ``v`` (n, C)."""
        Z, W = self._nodes()
        Zt = jnp.asarray(Z).T  # (C, P)
        s = jnp.sqrt(v)
        f = m[:, :, None] + s[:, :, None] * Zt  # (n, C, P)
        # The shift's derivative cancels exactly (as in jax's logsumexp), so it is held constant:
        # differentiated through the max inside lax.map, XLA:CPU at --xla_backend_optimization_level=0
        # (the test suite's setting) returned NaN for every entry of the gradient.
        mx = jax.lax.stop_gradient(jnp.max(f, axis=1, keepdims=True))
        e = jnp.exp(f - mx)
        tot = jnp.sum(e, axis=1, keepdims=True)
        idx = jnp.asarray(y).astype(jnp.int32)
        E = jnp.take_along_axis(m, idx[:, None], axis=-1)[:, 0] - (mx + jnp.log(tot))[:, 0, :] @ W
        if not moments:
            return (E,)
        pi = e / tot  # the softmax at the nodes
        pw = pi * W
        Ep = jnp.sum(pw, axis=-1)
        lam = -jnp.sum(pw * Zt, axis=-1) / s
        rho = (jnp.arange(self.num_classes) == idx[:, None]).astype(m.dtype) - Ep
        if not hessians:
            return E, rho, lam
        h = jax.lax.dot_general(pw, pi, (((2,), (2,)), ((0,), (0,))), precision=jax.lax.Precision.HIGHEST)
        return E, rho, lam, h - Ep[..., None] * jnp.eye(self.num_classes, dtype=m.dtype)

    def expected_log_prob(self, y, m, v):
        m, v = self._full(m), self._full(v)
        if self.num_classes > PRODUCT_MAX_CLASSES:
            return self._stacked(y, m, v, moments=False)
        if self.rule == "latents":
            return self._latent_rule(y, m, v)[0]
        return self._at_nodes(y, m, v, derivatives=False)

    def _moments(self, y, m, v, hessians: bool):
        """``(E, ρ, λ)``, and ``h`` with ``hessians``, from one softmax ``π`` at the nodes."""
        m, v = self._full(m), self._full(v)
        if self.num_classes > PRODUCT_MAX_CLASSES:
            out = self._stacked(y, m, v, moments=True, hessians=hessians)
        elif self.rule == "latents":
            out = self._latent_moments(y, m, v, hessians)
        else:
            out = self._at_nodes(y, m, v, hessians=hessians)
        if self.reference is None:
            return out
        # (the reference's own λ divides by its zero variance under the rules over the latents:
        # it is dropped here, never used)
        return (out[0],) + tuple(self._latent_part(t) for t in out[1:3]) + tuple(
            self._latent_part(t, axes=2) for t in out[3:])

    def variational_moments(self, y, m, v):
        """``(E, ρ, λ)`` in closed form: the exact derivatives of the rule (product or QMC) of
        :meth:`expected_log_prob` (``∂ lse/∂f = π``, the softmax at each node), so they agree
        with automatic differentiation of it to rounding, without a backward pass:

            ρ_c = [y = c] − Σ_p w_p π_pc,      λ_c = 2 ∂E/∂v_c = −Σ_p w_p π_pc z_pc / √v_c.
        """
        return self._moments(y, m, v, hessians=False)

    def moments_and_mean_hessians(self, y, m, v):
        """As :meth:`variational_moments`, with each row's curvature in the means,
        ``h = −Σ_p w_p (diag π_p − π_p π_pᵀ)`` (n, C, C): the exact second derivative of the
        rule, from the same softmax at the nodes."""
        return self._moments(y, m, v, hessians=True)

    def predict_proba(self, m, v):
        """Predictive class probabilities ``E[softmax(f)]`` (n, C) under ``f ~ N(m, diag v)``, by
        the rule of :meth:`expected_log_prob` (over the differences from class 0 for C ≤ 4);
        ``m, v`` (n, Q), with Q = C − 1 under a ``reference`` class."""
        m, v = self._full(m), self._full(v)
        _, W = self._nodes()
        if self._over_latents:
            return jnp.einsum("npc,p->nc", jax.nn.softmax(self._latents(m, v), axis=-1), W)
        logits, lse, _ = self._differences(m, v, jnp.zeros(m.shape[:-1], jnp.int32))
        return jnp.stack([jnp.exp(f - lse) @ W for f in logits], axis=-1)

    def class_probabilities(self, m, v):
        """(n, C): :meth:`predict_proba`."""
        return self.predict_proba(m, v)

    def predict_mean_and_var(self, m, v):
        p = self.predict_proba(m, v)
        return p, p * (1.0 - p)

    def predictive_log_density(self, y, m, v):
        """``log E[p(y | f)]``: the log of :meth:`predict_proba`'s entry for ``y`` (the same rule),
        as a log-sum-exp over the nodes (no underflow for improbable labels)."""
        m, v = self._full(m), self._full(v)
        _, W = self._nodes()
        if self._over_latents:
            lp = self._log_prob_full(jnp.asarray(y)[..., None], self._latents(m, v))
            return jax.scipy.special.logsumexp(lp + jnp.log(W), axis=-1)
        logits, lse, _ = self._differences(m, v, jnp.zeros(m.shape[:-1], jnp.int32))
        idx = jnp.asarray(y).astype(jnp.int32)[..., None]
        fy = sum(jnp.where(idx == c, f, 0.0) for c, f in enumerate(logits))
        return jax.scipy.special.logsumexp(fy - lse + jnp.log(W), axis=-1)

    def decode(self, codes):
        return np.asarray(codes).astype(int)
