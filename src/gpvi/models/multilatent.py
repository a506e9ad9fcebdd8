"""Models with several latent functions (Nguyen & Bonilla 2014, §2–3): Q latent GPs, each with its
own kernel, mean and (sparse) inducing inputs, and a likelihood that takes the Q latent values of
each row (e.g. :class:`gpvi.likelihoods.softmax.Softmax`, Q = C).

The posterior is factorised over latents, ``q(w) = Π_q N(w_q | m_q, V_q)`` (the paper's FULL
with Q blocks), so the variational state is a batch of Q single-latent states,
``State(mean (Q, d), chol (Q, d, d))``, and the data sums of :mod:`gpvi.objective` become
per-latent blocks: ``Σ_i ρ_iq a_iq`` (Q, d), ``Σ_i λ_iq a_iq a_iqᵀ`` (Q, d, d) and one
``Σ_i E_i``.  The model only stacks its latents' projections; the objective and the engines
(``fpi``: one safeguarded natural step per latent block; ``gradient``: L-BFGS on all blocks)
handle the batch.  All latents must have the same number of weights d (the same number of
inducing inputs for sparse latents).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gpvi._module import positional
from gpvi.likelihoods import Likelihood
from gpvi.models.base import GLM, GP, Model, SparseGP

__all__ = ["MultiLatent"]


def _check_latents(owner, latents):
    if isinstance(latents, list):
        latents = tuple(latents)
    if not isinstance(latents, tuple) or not latents or not all(isinstance(l, Model) for l in latents):
        raise ValueError(f"{owner}: latents must be a non-empty list of single-latent gpvi models "
                         f"(GP, SparseGP or GLM), got {latents!r}")
    for l in latents:
        if isinstance(l, MultiLatent):
            raise ValueError(f"{owner}: latents must be single-latent models, not MultiLatent")
    return latents


class MultiLatent(Model):
    """Q latent functions ``f_q`` (one single-latent model each) and one likelihood over them.

    Parameters
    ----------
    latents : list of Q models (``GP``, ``SparseGP`` or ``GLM``; their own likelihoods are
        ignored and may be None): kernel, prior mean and inducing inputs of each latent.
    likelihood : a likelihood with ``num_latents == Q`` (e.g. ``Softmax(num_classes=Q)``).

    Notes
    -----
    Use :meth:`full` / :meth:`sparse` to build one from a list of kernels.  Parameters are
    addressed as ``latents.<q>.kernel.lengthscale`` etc.
    """

    latents: tuple = positional()
    likelihood: Likelihood = positional(kind=Likelihood)

    def __post_init__(self):
        lat = _check_latents(type(self).__name__, self.latents)
        if lat is not self.latents:
            object.__setattr__(self, "latents", lat)
        if self.likelihood is not None:
            Q = getattr(self.likelihood, "num_latents", 1)
            if Q != len(lat):
                raise ValueError(f"MultiLatent: latents has {len(lat)} models but the likelihood "
                                 f"{type(self.likelihood).__name__} takes {Q} latent value(s) per row "
                                 "(give one kernel/model per latent function)")
        kinds = {type(l) for l in lat}
        if len(kinds) > 1:
            raise ValueError(f"MultiLatent: latents must all be of one kind (all GP or all SparseGP), got "
                             f"{sorted(k.__name__ for k in kinds)}")

    @classmethod
    def full(cls, kernels, likelihood, mean=0.0, jitter=1e-8):
        """Q full GPs with kernels ``kernels`` (list of Q) and constant means ``mean`` (a number or
        Q numbers)."""
        ks, means = cls._per_latent(kernels, mean, likelihood)
        return cls(tuple(GP(k, None, mean=float(mu), jitter=jitter) for k, mu in zip(ks, means)), likelihood)

    @classmethod
    def sparse(cls, kernels, likelihood, inducing, mean=0.0, jitter=1e-8):
        """Q sparse GPs sharing the number (or the array) of inducing inputs ``inducing``."""
        ks, means = cls._per_latent(kernels, mean, likelihood)
        return cls(tuple(SparseGP(k, None, inducing=inducing, mean=float(mu), jitter=jitter)
                         for k, mu in zip(ks, means)), likelihood)

    @staticmethod
    def _per_latent(kernels, mean, likelihood):
        from gpvi.kernels import Kernel

        if isinstance(kernels, Kernel):
            kernels = [kernels]
        ks = list(kernels)
        if not ks or not all(isinstance(k, Kernel) for k in ks):
            raise ValueError(f"kernels must be a gpvi kernel or a list of them, got {kernels!r}")
        Q = getattr(likelihood, "num_latents", 1)
        if len(ks) == 1 and Q > 1:
            ks = ks * Q  # one kernel given: the same prior (separate functions) for every latent
        if len(ks) != Q:
            raise ValueError(f"kernels has {len(ks)} kernels but the likelihood takes {Q} latent values "
                             "per row: give one kernel, or one per latent function")
        if np.shape(mean) not in ((), (Q,)):
            raise ValueError(f"mean must be a number or {Q} numbers (one per latent), got {mean!r}")
        return ks, np.broadcast_to(np.asarray(mean, dtype=np.float64), (Q,))

    @property
    def num_latents(self) -> int:
        return len(self.latents)

    def describe(self) -> str:
        lats = self.latents
        kinds = sorted({type(l).__name__ for l in lats})
        kern = [l.kernel.structure() for l in lats if hasattr(l, "kernel")]
        shown = (f"kernel {kern[0]} each" if len(set(kern)) == 1 else f"kernels {', '.join(kern)}") if kern else ""
        size = ""
        if isinstance(lats[0], SparseGP) and np.ndim(lats[0].inducing) == 2:
            size = f", M={np.shape(lats[0].inducing)[0]} inducing inputs each"
        return f"{type(self).__name__} of {len(lats)} {'/'.join(kinds)} latent functions{size}" + (f", {shown}" if shown else "")

    def initialise(self, X, y=None, *, seed: int = 0):
        """Each latent made concrete for ``X``.  Sparse latents given the same ``inducing`` object
        (one M or one array for all, as :meth:`sparse` builds them) get one array of inducing
        inputs: k-means runs once, and the latents keep sharing their prior factorisation
        (:meth:`_same_prior`)."""
        done, lat = {}, []  # id of a given `inducing` → (it, the initialised inputs)
        for l in self.latents:
            if type(l) is SparseGP and l.inducing is not None and id(l.inducing) in done:
                lat.append(l.replace(inducing=done[id(l.inducing)][1]))
                continue
            new = l.initialise(X, y, seed=seed)
            if type(l) is SparseGP and l.inducing is not None:
                done[id(l.inducing)] = (l.inducing, new.inducing)  # (kept alive: the id stays unique)
            lat.append(new)
        out = self.replace(latents=tuple(lat))
        out.num_weights(X)  # same d for all latents
        return out

    def num_weights(self, X) -> int:
        ds = [l.num_weights(X) for l in self.latents]
        if len(set(ds)) != 1:
            raise ValueError(f"latents: all latent functions need the same number of weights (inducing inputs), "
                             f"got {ds}")
        return ds[0]

    def input_dim(self):
        dims = {l.input_dim() for l in self.latents} - {None}
        return dims.pop() if dims else None

    def _same_prior(self) -> list[int]:
        """For each latent, the first latent whose prior is built from the very same objects
        (kernel, jitter, inducing inputs, prior variance; not the mean): a kernel given once for
        all latents, or a parameter tied across them (``latents.*.kernel.variance``, one array
        for all).  Such latents share their prior and pass caches, which are computed once (a
        full GP's O(N³) factorisation and its derivative: three times for three softmax classes
        before).  Identity, not equality: values that are merely equal are computed again; and
        only for the built-in GP, SparseGP and GLM, whose priors use no other fields."""
        firsts, out = {}, []
        for q, lat in enumerate(self.latents):
            if type(lat) not in (GP, SparseGP, GLM):  # another model's prior may use other fields
                out.append(q)
                continue
            kernel = getattr(lat, "kernel", None)
            key = (type(lat), getattr(lat, "jitter", None), jax.tree_util.tree_structure(kernel),
                   tuple(id(x) for x in jax.tree_util.tree_leaves(kernel)),
                   id(getattr(lat, "inducing", None)), id(getattr(lat, "prior_variance", None)))
            out.append(firsts.setdefault(key, q))
        return out

    def _shared(self, fn, *per_latent):
        """``fn(latent, *its arguments)`` for each latent, computed once per group of
        :meth:`_same_prior`."""
        same, out = self._same_prior(), []
        for q, lat in enumerate(self.latents):
            out.append(out[same[q]] if same[q] < q else fn(lat, *(a[q] for a in per_latent)))
        return tuple(out)

    def prior_cache(self, X):
        return self._shared(lambda l: l.prior_cache(X))

    def caches(self, X):
        both = self._shared(lambda l: l.caches(X))
        return tuple(b[0] for b in both), tuple(b[1] for b in both)

    def project(self, cache, Xc):
        """``At`` (Q, d, n), ``b`` (Q, n), ``c`` (Q, n): each latent's projections, stacked."""
        parts = [l.project(pc, Xc) for l, pc in zip(self.latents, cache)]
        return tuple(jnp.stack(t) for t in zip(*parts))

    def training_projection(self, cache):
        parts = [l.training_projection(pc) for l, pc in zip(self.latents, cache)]
        if any(p is None for p in parts):
            return None
        return tuple(jnp.stack(t) for t in zip(*parts))

    def triangular_training_projection(self) -> bool:
        return all(l.triangular_training_projection() for l in self.latents)

    def pass_cache(self, cache):
        return self._shared(lambda l, pc: l.pass_cache(pc), cache)

    def project_many(self, pcache, Xc):
        parts = [l.project_many(pc, Xc) for l, pc in zip(self.latents, pcache)]
        return tuple(jnp.stack(t) for t in zip(*parts))

    @property
    def jitter(self):
        return max(float(getattr(l, "jitter", 0.0)) for l in self.latents)

    def relative_jitter(self, cache=None, X=None) -> float:
        """The largest relative jitter over the latents (NaN where none has one)."""
        caches = cache if cache is not None else (None,) * len(self.latents)
        vals = [l.relative_jitter(pc, X) for l, pc in zip(self.latents, caches)]
        vals = [v for v in vals if np.isfinite(v)]
        return max(vals) if vals else float("nan")

