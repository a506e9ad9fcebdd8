"""The :class:`Objective`: the VLB of a model on in-memory data and the sums the engines need."""
from __future__ import annotations


import numpy as np

from gpvi.models.base import Model
from gpvi.objective.state import DEFAULT_CACHE_BYTES, DEFAULT_CHUNK, State, Sums
from gpvi.objective.chunks import as_device_array, chunk_setup, make_chunks, pads_rows, prior_inputs
from gpvi.objective.blocks import num_blocks
from gpvi.objective.passes import data_sums, expected_vlb
from gpvi.objective.newton import coupled_direction


class Objective:
    """The VLB of ``model`` on data ``(X, y)``, and the sums the engines need.

    Parameters
    ----------
    model : Model
        A concrete model (see :meth:`gpvi.models.Model.initialise`).
    X : (N, D) array; y : (N,) array in the likelihood's internal coding;
    offset : (N,) array or None, added to every latent (``log`` exposure for counts).
    chunk_size : most rows per chunk of the data sums (see :func:`make_chunks`).
    cache_bytes : keep all projections ``a_i`` in memory when they take at most this much.
    blocks : number of row blocks the projections are split into (default
        :func:`num_blocks` of the number of weights; any value gives the same sums).
    coupled : whether fpi's mean steps take the joint Newton direction of Q latents that the
        likelihood couples (softmax); ``None`` (default): where the projections are in memory.
    newton_rtol : relative residual at which that direction's conjugate gradients stop.

    Raises
    ------
    numpy.linalg.LinAlgError
        Naming the matrix, when the prior covariance cannot be factorised even with the largest
        jitter (:meth:`check_prior`): a constructed objective always has a finite prior.
    """

    def __init__(self, model: Model, X, y, offset=None, *, chunk_size=DEFAULT_CHUNK,
                 cache_bytes=DEFAULT_CACHE_BYTES, blocks: int | None = None, coupled: bool | None = None,
                 newton_rtol: float = 1e-3):
        self.model = model
        self.X = as_device_array(X)
        self.num_data = int(self.X.shape[0])
        self.chunks = make_chunks(X, y, offset, chunk_size, bucketed=pads_rows(model, np.shape(X)[0]))
        self.dim = model.num_weights(X)
        self.num_latents = getattr(model, "num_latents", None)  # None: a single-latent model
        C, n = self.chunks.mask.shape
        self.cached = C * n * (self.dim + 2) * (self.num_latents or 1) * 8 <= cache_bytes
        self.blocks = num_blocks(self.dim) if blocks is None else int(blocks)
        if not 1 <= self.blocks <= self.dim:
            raise ValueError(f"blocks must be between 1 and the number of weights ({self.dim}), got {blocks!r}")
        self.prior, self._prior_finite, self.proj = chunk_setup(model, prior_inputs(model, self.X, self.chunks),
                                                           self.chunks.X, self.cached, self.blocks)
        self.check_prior()
        self.num_evaluations = 0
        # Q latents that the likelihood couples: the mean steps use the joint Newton direction
        # (:meth:`newton_direction`) when the projections are in memory (each CG iteration is a
        # product with them); coupled=False takes the per-latent steps instead.
        can_couple = bool(self.num_latents and getattr(model.likelihood, "num_latents", 1) > 1 and self.cached)
        if coupled not in (None, True, False):
            raise ValueError(f"coupled must be None (automatic), True or False, got {coupled!r}")
        if coupled and not can_couple:
            raise ValueError("coupled=True needs several latents that the likelihood couples (softmax) and the "
                             "projections in memory (cache_bytes)")
        self.coupled = can_couple if coupled is None else coupled
        # relative residual at which the conjugate gradients of that direction stop (an inexact
        # Newton step; see coupled_direction)
        if not (isinstance(newton_rtol, (int, float)) and 0 < newton_rtol < 1):
            raise ValueError(f"newton_rtol must be a number in (0, 1), got {newton_rtol!r}")
        self.newton_rtol = float(newton_rtol)

    def newton_direction(self, state: State, grad, RH_inv, rows_h=None):
        """The joint Newton direction of the means of all latent blocks and the gain it
        predicts (see :func:`coupled_direction`); ``RH_inv`` holds the inverses of the
        per-latent precision factors (:func:`gpvi.engines._common.precision_and_inverse`), or
        another preconditioner's lower-triangular factors (see there), and
        ``rows_h`` the rows' curvatures from the sums at ``state`` (recomputed if ``None``)."""
        return coupled_direction(self.model, self.chunks, self.proj, state, grad, RH_inv, rows_h,
                                  rtol=self.newton_rtol)

    # -- the three sums ------------------------------------------------------------------
    def sums(self, state: State, want_hessian: bool = True, clip_gamma: bool = False) -> Sums:
        """The VLB with its derivatives at ``state`` (see :class:`Sums`)."""
        self.num_evaluations += 1
        return data_sums(self.model, self.prior, self.chunks, self.proj, state, self.cached,
                     self.blocks, want_hessian, clip_gamma, want_hessian and self.coupled)

    def vlb(self, state: State):
        """The variational lower bound in nats, summed over the data."""
        self.num_evaluations += 1
        return expected_vlb(self.model, self.prior, self.chunks, self.proj, state, self.cached, self.blocks)

    def check_prior(self):
        """Raise a clear error when the prior covariance could not be factorised."""
        if not bool(self._prior_finite):
            name = "K(Z, Z) of the inducing inputs" if type(self.model).__name__ == "SparseGP" else "K(X, X)"
            raise np.linalg.LinAlgError(
                f"Cholesky of {name} failed even with jitter up to {self.model.jitter * 10**7:g}×mean diagonal; "
                "remove duplicate inducing inputs, shorten the lengthscale or raise the model's jitter"
            )
