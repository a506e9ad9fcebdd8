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

Values are checked where they are set: building a component (``RBF(lengthscale=-1)``,
``.replace(...)``) raises a ``ValueError`` that names the parameter and its allowed range
(each parameter's *domain*: positive, ordered, real; a *shape*: scalar, vector or either),
and Python lists and tuples become float64 arrays.  Only concrete values are checked:
tracers (a component rebuilt inside ``jit`` or ``grad``) pass through untouched, pytree
unflattening rebuilds objects without running any check (JAX fills them with placeholder
leaves), and :func:`unflatten_params` sets the optimiser's trial values unchecked, since a
trial point that overflows must give a non-finite bound, not an exception.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["module", "param", "static", "positional", "Module", "flatten_params", "unflatten_params",
           "check_value", "is_tracer"]


_DOMAINS = ("positive", "ordered", "real", None)
_SHAPES = ("scalar", "vector", "scalar_or_vector", None)
_DEFAULT_DOMAIN = {"positive": "positive", "ordered": "ordered", "real": "real", "fixed": "real"}
_DEFAULT_SHAPE = {"positive": "scalar_or_vector", "ordered": "vector", "real": None, "fixed": None}


def param(transform: str = "real", default: Any = dataclasses.MISSING, *, domain: Any = "auto",
          shape: Any = "auto"):
    """Declare a dataclass field holding a parameter with the given transform.

    ``domain`` (``"positive"``, ``"ordered"``, ``"real"`` or None for no check; by default
    the transform's, ``"real"`` for ``"fixed"``) and ``shape`` (``"scalar"``, ``"vector"``,
    ``"scalar_or_vector"`` or None) are checked on every concrete value at construction.  A
    ``None`` value is accepted only when the default is None (e.g. a value set later).
    """
    if transform not in ("positive", "ordered", "real", "fixed"):
        raise ValueError(f"unknown transform {transform!r}")
    domain = _DEFAULT_DOMAIN[transform] if domain == "auto" else domain
    shape = _DEFAULT_SHAPE[transform] if shape == "auto" else shape
    if domain not in _DOMAINS or shape not in _SHAPES:
        raise ValueError(f"unknown domain {domain!r} or shape {shape!r}")
    kw = {} if default is dataclasses.MISSING else {"default": default}
    return dataclasses.field(metadata={"transform": transform, "domain": domain, "shape": shape}, **kw)


def static(default: Any = dataclasses.MISSING, *, check=None):
    """Declare a static (non-array, never learned) dataclass field.

    ``check(owner, name, value)`` (optional) validates a value at construction and returns
    it (possibly normalised); it raises ``ValueError`` naming ``name`` and its allowed range.
    """
    kw = {} if default is dataclasses.MISSING else {"default": default}
    return dataclasses.field(metadata={"static": True, "check": check}, **kw)


def positional(default: Any = None, *, kind: type | None = None):
    """Declare a sub-module field that may also be passed positionally, in declaration order
    (``SparseGP(kernel, likelihood, inducing=Z)``); every other field is keyword-only.

    With ``kind``, a value that is neither None nor an instance of ``kind`` is rejected.
    """
    return dataclasses.field(default=default, kw_only=False, metadata={"kind": kind})


def is_tracer(x) -> bool:
    """Whether ``x`` is (or, for a list or tuple, holds) an abstract JAX value."""
    if isinstance(x, (list, tuple)):
        return any(is_tracer(v) for v in x)
    return isinstance(x, jax.core.Tracer)


def _as_array(val):
    """``val`` as a JAX array.  A host value (a number or a NumPy array) is transferred with
    ``jax.device_put``: ``jnp.asarray`` of one compiles a small program per shape (jax 0.10), a
    few tens of milliseconds each in a fresh process."""
    if isinstance(val, jax.Array) or is_tracer(val):
        return jnp.asarray(val)
    return jax.device_put(np.asarray(val))


def _show(val) -> str:
    try:
        arr = np.asarray(val)
    except Exception:  # noqa: BLE001 - only for the message
        return repr(val)
    if arr.dtype.kind in "biuf" and arr.size > 6:
        return f"an array of shape {arr.shape}"
    return repr(val) if not isinstance(val, (np.ndarray, jax.Array)) else np.array2string(arr, precision=6)


def _describe(domain, shape) -> str:
    """The allowed values of a parameter, in words."""
    finite = "finite " if domain is not None else ""
    cond = " > 0" if domain == "positive" else ""
    if domain == "ordered":
        return "a non-empty, strictly increasing 1-D array of finite numbers"
    if shape == "scalar":
        return f"a {finite}number{cond}"
    if shape == "vector":
        return f"a non-empty 1-D array of {finite}numbers{cond}"
    if shape == "scalar_or_vector":
        return f"a {finite}number{cond} or a non-empty 1-D array of them"
    return "finite and > 0" if domain == "positive" else "finite" if domain == "real" else "numeric"


def check_value(owner: str, name: str, val, domain: str | None, shape: str | None):
    """``val`` checked against ``domain`` and ``shape`` (see :func:`param`); lists and tuples
    are returned as float64 arrays, other values unchanged.  Tracers pass unchecked."""
    if is_tracer(val):
        return jnp.asarray(val) if isinstance(val, (list, tuple)) else val
    if domain is None and shape is None:
        return val
    what = _describe(domain, shape)

    def bad(detail=""):
        return ValueError(f"{owner}: {name} must be {what}, got {_show(val)}{detail}")

    if isinstance(val, (bool, np.bool_, str, bytes)):
        raise bad()
    try:
        arr = np.asarray(val)
    except Exception:  # noqa: BLE001 - ragged lists, arbitrary objects
        raise bad() from None
    if arr.dtype.kind not in "iuf":
        raise bad()
    if isinstance(val, (list, tuple)):
        val = arr = arr.astype(np.float64)
    if shape == "scalar" and arr.ndim != 0 or shape == "vector" and (arr.ndim != 1 or arr.size == 0) \
            or shape == "scalar_or_vector" and (arr.ndim > 1 or arr.ndim == 1 and arr.size == 0):
        raise bad(f" (shape {arr.shape})")
    a = arr.astype(np.float64)
    if domain is not None and not np.all(np.isfinite(a)):
        raise bad()
    if domain == "positive" and not np.all(a > 0):
        raise bad()
    if domain == "ordered" and not (a.ndim == 1 and a.size >= 1 and np.all(np.diff(a) > 0)):
        raise bad()
    return val


def _check_fields(obj):
    """Validate (and normalise) every field of a freshly built component; see :func:`param`."""
    owner = type(obj).__name__
    for f in dataclasses.fields(obj):
        val = getattr(obj, f.name)
        md = f.metadata
        new = val
        if "transform" in md:
            if val is None:
                if f.default is not None:
                    raise ValueError(f"{owner}: {f.name} must be {_describe(md['domain'], md['shape'])}, got None")
                continue
            new = check_value(owner, f.name, val, md["domain"], md["shape"])
        elif md.get("check") is not None:
            new = md["check"](owner, f.name, val)
        elif md.get("kind") is not None and val is not None and not isinstance(val, md["kind"]):
            raise ValueError(f"{owner}: {f.name} must be a gpvi {md['kind'].__name__}, got {_show(val)} "
                             f"(of type {type(val).__name__})")
        if new is not val:
            object.__setattr__(obj, f.name, new)


def module(cls):
    """Make ``cls`` a frozen dataclass, keyword-only except for :func:`positional` fields,
    registered as a pytree.

    Applied automatically to every subclass of :class:`Module`, so a user's subclass
    needs no decorator.  Parameter and sub-module fields are pytree children; static
    fields are auxiliary data (hashable, so jitted functions can be cached on them).
    A ``__post_init__`` of the class runs after the field checks of :func:`param`, whether
    or not it calls ``super().__post_init__()``.
    """
    own = cls.__dict__.get("__post_init__")
    if own is not None and not getattr(own, "_gpvi_checks_fields", False):
        def __post_init__(self, _own=own):
            _check_fields(self)
            _own(self)

        __post_init__._gpvi_checks_fields = True
        __post_init__.__doc__ = own.__doc__
        cls.__post_init__ = __post_init__
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
        # Not cls(...): JAX unflattens with tracers and with placeholder leaves (None,
        # object(), shapes), which must neither be checked nor converted.
        return _build_unchecked(cls, {**dict(zip(data, children)), **dict(zip(meta, aux))})

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls


def _build_unchecked(cls, values: dict):
    obj = object.__new__(cls)
    for name, val in values.items():
        object.__setattr__(obj, name, val)
    return obj


class Module:
    """Base class of every parameterised component (see module docstring)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        module(cls)

    def __post_init__(self):
        _check_fields(self)

    def replace(self, **changes):
        """Return a copy with some fields replaced (the object itself is immutable); the new
        values are checked as at construction."""
        return dataclasses.replace(self, **changes)

    def _replace_unchecked(self, **changes):
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values.update(changes)
        return _build_unchecked(type(self), values)

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
                out[path] = _as_array(val)
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

    def with_parameters(self, values: dict[str, Any], check: bool = True):
        """Return a copy with the parameters at the given dotted paths replaced (checked as at
        construction unless ``check=False``)."""
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
                changes[head] = type(child)(c.with_parameters(per.get(k, {}), check)
                                            for k, c in enumerate(child))
            else:
                changes[head] = child.with_parameters(sub, check)
        if not changes:
            return self
        return self.replace(**changes) if check else self._replace_unchecked(**changes)


def _xp(x):
    """``jax.numpy`` for a traced value, NumPy for a concrete one: the hyperparameter search maps
    a few numbers per evaluation, and each eager JAX operation on a new shape is one more
    compiled program (40–90 ms each in a fresh process, even from the disk cache)."""
    return jnp if isinstance(x, jax.core.Tracer) else np


def _to_unconstrained(x, transform):
    xp = _xp(x)
    x = xp.asarray(x)
    with np.errstate(all="ignore"):  # log 0 = −inf silently, as in JAX
        if transform == "positive":
            x = xp.log(x)
        elif transform == "ordered":
            x = xp.concatenate([x[:1], xp.log(xp.diff(x))])
    return xp.asarray(x)  # (NumPy's ufuncs turn a 0-d array into a scalar)


def _to_constrained(u, transform):
    xp = _xp(u)
    with np.errstate(all="ignore"):  # a trial point's exp(800) = inf silently, as in JAX
        if transform == "positive":
            u = xp.exp(u)
        elif transform == "ordered":
            u = xp.concatenate([u[:1], u[:1] + xp.cumsum(xp.exp(u[1:]))])
    return xp.asarray(u)


def ravel_values(values: dict) -> np.ndarray:
    """The values of a dict of (concrete) arrays as one flat NumPy vector, keys in sorted order —
    the order ``jax.flatten_util.ravel_pytree`` gives a dict, without its eager JAX programs."""
    return np.concatenate([np.ravel(np.asarray(values[k], np.float64)) for k in sorted(values)] or [np.zeros(0)])


def ravel_params(values: dict):
    """``(flat, unravel)``: :func:`ravel_values` of ``values`` and its inverse, which gives a dict of
    NumPy arrays of the same keys and shapes from a flat vector."""
    keys = sorted(values)
    shapes = [np.shape(values[k]) for k in keys]
    sizes = [int(np.prod(s)) for s in shapes]
    ends = np.cumsum(sizes)

    def unravel(flat):
        flat = np.asarray(flat, np.float64)
        return {k: flat[e - n:e].reshape(shp) for k, shp, n, e in zip(keys, shapes, sizes, ends)}

    return ravel_values(values), unravel


#: Suffix of a learned name whose array's elements all share one value (``"kernel.lengthscale[*]"``:
#: one lengthscale for every feature, kept in the ARD kernel's shape).
ELEMENTS = "[*]"


def shares_elements(name: str) -> bool:
    """Whether ``name`` ends in :data:`ELEMENTS` (one value for all elements of the array)."""
    return name.endswith(ELEMENTS)


def untied_name(name: str) -> str:
    """``name`` without a trailing :data:`ELEMENTS` (the name of the whole array)."""
    return name[:-len(ELEMENTS)] if shares_elements(name) else name


def parameter_value(obj: Module, path: str):
    """The value a dotted parameter ``path`` of ``obj`` holds, as stored (not converted:
    :meth:`Module.parameters` makes a new JAX array per path, an eager program per new shape)."""
    for part in path.split("."):
        obj = obj[int(part)] if isinstance(obj, (tuple, list)) else getattr(obj, part)
    return obj


def matching_parameters(obj: Module, name: str) -> list[str]:
    """The dotted parameter paths of ``obj`` that ``name`` stands for: itself, or, where a path
    segment is ``*`` (e.g. ``latents.*.kernel.lengthscale``), every path that matches it with any
    one segment there — one *tied* parameter shared by all of them.  A trailing :data:`ELEMENTS`
    (``kernel.lengthscale[*]``) names the same paths; it ties the elements of each array too."""
    trans = obj.transforms()
    name = untied_name(name)
    if "*" not in name.split("."):
        return [name] if name in trans else []
    want = name.split(".")
    return [p for p in trans if len(p.split(".")) == len(want)
            and all(w in ("*", q) for w, q in zip(want, p.split(".")))]


def unknown_parameters(obj: Module, names) -> list[str]:
    """The names (plain or with ``*`` segments) that match no parameter of ``obj``."""
    return sorted(n for n in names if not matching_parameters(obj, n))


def flatten_params(obj: Module, names: list[str]) -> dict[str, jax.Array]:
    """Unconstrained values of the named parameters of ``obj``; a name with a ``*`` segment is one
    tied parameter (:func:`matching_parameters`), started at the mean of its matches'
    unconstrained values; a name ending in :data:`ELEMENTS` is one scalar, started at the mean
    of its array's unconstrained elements."""
    params, trans = obj.parameters(), obj.transforms()
    out = {}
    for n in names:
        paths = matching_parameters(obj, n)
        if not paths:
            raise ValueError(f"{n!r} names no parameter of {type(obj).__name__}; known: {sorted(trans)}")
        vals = [_to_unconstrained(params[p], trans[p]) for p in paths]
        if shares_elements(n):  # one scalar: the mean of the elements
            vals = [_xp(v).asarray(_xp(v).mean(v)) for v in vals]
        if len({np.shape(v) for v in vals}) != 1 or len({trans[p] for p in paths}) != 1:
            raise ValueError(f"{n!r} ties parameters of different shapes or transforms: {paths}")
        out[n] = vals[0] if len(vals) == 1 else sum(vals) / len(vals)
    return out


def unflatten_params(obj: Module, unconstrained: dict[str, jax.Array]) -> Module:
    """Inverse of :func:`flatten_params`: a copy of ``obj`` with those parameters set.

    The values are not range-checked: an optimiser's trial point may overflow (a lengthscale
    ``exp(800) = inf``) and must then give a non-finite bound that the line search backs off
    from, not an exception.
    """
    trans = obj.transforms()
    values = {}
    for n, u in unconstrained.items():
        paths = matching_parameters(obj, n) if ("*" in n.split(".") or shares_elements(n)) else [n]
        value = _to_constrained(u, trans[paths[0]])  # tied: one array for every match (the same transform)
        # with a trailing [*], one value for every element, in each array's own shape (one array
        # per shape, so that tied matches still hold one object)
        spread = {}
        for p in paths:
            if shares_elements(n):
                shape = np.shape(parameter_value(obj, p))
                values[p] = spread.setdefault(shape, _xp(value).broadcast_to(value, shape))
            else:
                values[p] = value
    return obj.with_parameters(values, check=False)
