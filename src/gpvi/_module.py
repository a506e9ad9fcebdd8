"""Immutable parameter containers shared by kernels, likelihoods and models.

Every component is a frozen dataclass registered as a JAX pytree.  Its fields are
either *parameters* (JAX arrays that may be learned) or *static* settings (strings,
integers, flags).  Each parameter field carries a transform that maps it to an
unconstrained real vector, so the hyperparameter optimiser can work on one flat
unconstrained vector whatever the component:

- ``"positive"``: ``x = exp(u)``;
- ``"ordered"``:  increasing vector, ``x_0 = u_0``, ``x_k = x_{k-1} + exp(u_k)``;
- ``"real"``:     identity;
- ``"fixed"``:    a parameter that is never learned (e.g. Student-t degrees of freedom).

Learnable parameters are addressed by dotted paths (``"kernel.lengthscale"``,
``"likelihood.edges"``), which is how :func:`gpvi.fit` lets a user choose what to learn.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["module", "param", "static", "positional", "Module", "flatten_params", "unflatten_params"]


def param(transform: str = "real", default: Any = dataclasses.MISSING):
    """Declare a dataclass field holding a parameter with the given transform."""
    if transform not in ("positive", "ordered", "real", "fixed"):
        raise ValueError(f"unknown transform {transform!r}")
    kw = {} if default is dataclasses.MISSING else {"default": default}
    return dataclasses.field(metadata={"transform": transform}, **kw)


def static(default: Any = dataclasses.MISSING):
    """Declare a static (non-array, never learned) dataclass field."""
    kw = {} if default is dataclasses.MISSING else {"default": default}
    return dataclasses.field(metadata={"static": True}, **kw)


def positional(default: Any = None):
    """Declare a sub-module field that may also be passed positionally, in declaration order
    (``SparseGP(kernel, likelihood, inducing=Z)``); every other field is keyword-only."""
    return dataclasses.field(default=default, kw_only=False)


def module(cls):
    """Make ``cls`` a frozen dataclass, keyword-only except for :func:`positional` fields,
    registered as a pytree.

    Applied automatically to every subclass of :class:`Module`, so a user's subclass
    needs no decorator.  Parameter and sub-module fields are pytree children; static
    fields are auxiliary data (hashable, so jitted functions can be cached on them).
    """
    cls = dataclasses.dataclass(frozen=True, eq=False, repr=False, kw_only=True)(cls)
    fields = dataclasses.fields(cls)
    data = [f.name for f in fields if not f.metadata.get("static", False)]
    meta = [f.name for f in fields if f.metadata.get("static", False)]
    # Not jax.tree_util.register_dataclass: its treedefs of two different classes with the
    # same field layout compare equal (jax 0.10), so jit caches keyed on them can run one
    # class's compiled code for another (e.g. RBF vs Matern52, Poisson vs Exponential).
    # Custom nodes compare their type; the static values travel in the aux data.
    def flatten_with_keys(obj):
        return ([(jax.tree_util.GetAttrKey(n), getattr(obj, n)) for n in data],
                tuple(getattr(obj, n) for n in meta))

    def flatten(obj):
        return [getattr(obj, n) for n in data], tuple(getattr(obj, n) for n in meta)

    def unflatten(aux, children):
        return cls(**dict(zip(data, children)), **dict(zip(meta, aux)))

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls


class Module:
    """Base class of every parameterised component (see module docstring)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        module(cls)

    def replace(self, **changes):
        """Return a copy with some fields replaced (the object itself is immutable)."""
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            if isinstance(val, (jax.Array, np.ndarray)):
                arr = np.asarray(val)
                val = float(arr) if arr.ndim == 0 else np.array2string(arr, precision=4)
            parts.append(f"{f.name}={val!r}" if not isinstance(val, str) or f.metadata.get("static") else f"{f.name}={val}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def parameters(self, prefix: str = "") -> dict[str, jax.Array]:
        """All parameters (constrained values) by dotted path, sub-modules included."""
        out: dict[str, jax.Array] = {}
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            path = f"{prefix}{f.name}"
            if isinstance(val, Module):
                out.update(val.parameters(path + "."))
            elif isinstance(val, (tuple, list)) and val and all(isinstance(v, Module) for v in val):
                for k, v in enumerate(val):
                    out.update(v.parameters(f"{path}.{k}."))
            elif "transform" in f.metadata and val is not None:
                out[path] = jnp.asarray(val)
        return out

    def transforms(self, prefix: str = "") -> dict[str, str]:
        """Transform name of every parameter, keyed like :meth:`parameters`."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            path = f"{prefix}{f.name}"
            if isinstance(val, Module):
                out.update(val.transforms(path + "."))
            elif isinstance(val, (tuple, list)) and val and all(isinstance(v, Module) for v in val):
                for k, v in enumerate(val):
                    out.update(v.transforms(f"{path}.{k}."))
            elif "transform" in f.metadata and val is not None:
                out[path] = f.metadata["transform"]
        return out

    def with_parameters(self, values: dict[str, Any]):
        """Return a copy with the parameters at the given dotted paths replaced."""
        own: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for path, val in values.items():
            head, _, rest = path.partition(".")
            if rest:
                nested.setdefault(head, {})[rest] = val
            else:
                own[head] = val
        changes = dict(own)
        for head, sub in nested.items():
            child = getattr(self, head)
            if isinstance(child, (tuple, list)):
                per: dict[int, dict[str, Any]] = {}
                for p, v in sub.items():
                    idx, _, r = p.partition(".")
                    per.setdefault(int(idx), {})[r] = v
                changes[head] = type(child)(c.with_parameters(per.get(k, {})) for k, c in enumerate(child))
            else:
                changes[head] = child.with_parameters(sub)
        return self.replace(**changes) if changes else self


def _to_unconstrained(x, transform):
    x = jnp.asarray(x)
    if transform == "positive":
        return jnp.log(x)
    if transform == "ordered":
        return jnp.concatenate([x[:1], jnp.log(jnp.diff(x))])
    return x


def _to_constrained(u, transform):
    if transform == "positive":
        return jnp.exp(u)
    if transform == "ordered":
        return jnp.concatenate([u[:1], u[:1] + jnp.cumsum(jnp.exp(u[1:]))])
    return u


def flatten_params(obj: Module, names: list[str]) -> dict[str, jax.Array]:
    """Unconstrained values of the named parameters of ``obj``."""
    params, trans = obj.parameters(), obj.transforms()
    return {n: _to_unconstrained(params[n], trans[n]) for n in names}


def unflatten_params(obj: Module, unconstrained: dict[str, jax.Array]) -> Module:
    """Inverse of :func:`flatten_params`: a copy of ``obj`` with those parameters set."""
    trans = obj.transforms()
    return obj.with_parameters({n: _to_constrained(u, trans[n]) for n, u in unconstrained.items()})
