#!/usr/bin/env python
"""Record reference values of the distributions from torch.distributions and TorchRL.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_distributions.py

It writes ``specs/distribution_cases.json``, which ``tests/distributions.rs`` replays (Rust
never runs Python). The output is deterministic: every parameter and value is written out
literally below, nothing is sampled.

Which Python class stands for each Rust distribution:

=====================  ============================================================
Rust                   Python
=====================  ============================================================
``Normal``             ``torch.distributions.Normal``
``TanhNormal``         ``torchrl.modules.TanhNormal(loc, scale, low=, high=)``
                       (default ``event_dims = min(1, loc.ndim)``, ``safe_tanh=True``)
``Categorical``        ``torch.distributions.Categorical``; with a mask,
                       ``torchrl.modules.MaskedCategorical(logits|probs, mask=)``
``OneHotCategorical``  ``torchrl.modules.OneHotCategorical`` (``mean``:
                       ``torch.distributions.OneHotCategorical(...).mean``, the probs)
``Delta``              ``torchrl.modules.distributions.Delta``
=====================  ============================================================

Case layout (one per line)::

    {"name": ..., "op": "<Rust distribution>", "args": {param: tensor, ...},
     "expect": {"batch_shape": [..], "event_shape": [..],
                "log_prob": [{"value": tensor, "out": tensor,
                              "grads": {param: tensor} | null}, ...],
                "entropy": {"out": tensor, "grads": {param: tensor} | null} | null,
                "mean": {...} | null, "mode": {...} | null}}

``grads`` are the gradients of ``out.sum()`` w.r.t. the float parameters (leaf tensors with
``requires_grad``); ``null`` when ``out`` is not finite everywhere (the gradient of an
infinite sum is not a meaningful reference) or when ``out`` does not depend on the parameters
(Delta's ``log_prob``, the one-hot ``mode``). A ``null`` ``entropy``/``mean``/``mode`` means the
Rust port returns an ``Err`` there (see ``"notes"`` in the file for why); for ``TanhNormal``,
``mode`` holds TorchRL's ``deterministic_sample`` (``mode`` itself raises in TorchRL).

Tensors are ``{"shape", "dtype", "data"}`` (row-major; float32 values written as the exact
double of the float; ``"inf"``, ``"-inf"`` and ``"nan"`` as strings, which JSON lacks).
"""

import json
import math
import os
import platform
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

import torch  # noqa: E402
import torchrl  # noqa: E402
from torch import distributions as D  # noqa: E402
from torchrl.modules import MaskedCategorical, OneHotCategorical, TanhNormal  # noqa: E402
from torchrl.modules.distributions import Delta  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "distribution_cases.json")
GENERATOR = "specs/record_distributions.py"

DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.bool: "bool",
}

NOTES = {
    "Categorical.mean": "torch returns NaN (classes are unordered); the Rust port returns Err",
    "TanhNormal.mean": "TorchRL raises NotImplementedError (no closed form); Rust returns Err "
    "and offers TanhNormal::mean_estimate (Monte Carlo)",
    "TanhNormal.entropy": "no closed form; TorchRL raises NotImplementedError, Rust returns Err "
    "and offers TanhNormal::entropy_estimate (Monte Carlo)",
    "TanhNormal.mode": "TorchRL's mode raises; recorded here is deterministic_sample, the image "
    "of the Normal's mode through tanh and the affine map, which Rust's mode() returns",
    "Delta.entropy": "TorchRL's Delta has no entropy (NotImplementedError); Rust returns Err",
    "categorical_masked_probs.grads": "TorchRL's MaskedCategorical(probs=, mask=) has NaN "
    "gradients (ln of the masked zeros); recorded are torch Categorical(probs=masked probs)'s, "
    "which the port reproduces",
    "OneHotCategorical.mean": "TorchRL's OneHotCategorical subclasses D.Categorical (mean NaN); "
    "the Rust port follows torch.distributions.OneHotCategorical (mean = probs)",
}


# ---------------------------------------------------------------- encoding


def enc_number(x, dtype):
    if dtype == torch.bool:
        return bool(x)
    if dtype in (torch.int64,):
        return int(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def enc(t):
    t = t.detach()
    if t.dtype not in DTYPES:
        raise TypeError(f"cannot encode dtype {t.dtype}")
    flat = t.reshape(-1).tolist()
    return {
        "shape": list(t.shape),
        "dtype": DTYPES[t.dtype],
        "data": [enc_number(x, t.dtype) for x in flat],
    }


def dec(v):
    """Decodes an encoded tensor (round-trip check of the encoder)."""
    dtype = {name: dt for dt, name in DTYPES.items()}[v["dtype"]]
    data = [float(x) if isinstance(x, str) else x for x in v["data"]]
    return torch.tensor(data, dtype=dtype).reshape(v["shape"])


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        torch.nan_to_num(a.double(), nan=1234.5), torch.nan_to_num(b.double(), nan=1234.5)
    )


# ---------------------------------------------------------------- recording

CASES = []


def leaves(args):
    """Fresh leaf copies of the arguments; float ones require grad."""
    out = {}
    for k, v in args.items():
        t = dec(enc(v))
        assert same(t, v), k
        if t.is_floating_point() and k not in ("low", "high"):
            t.requires_grad_(True)
        out[k] = t
    return out


def grads_of(out, params):
    """Gradients of out.sum() w.r.t. the params that require grad, or None."""
    if not out.requires_grad or not torch.isfinite(out).all():
        return None
    diff = {k: p for k, p in params.items() if p.requires_grad}
    gs = torch.autograd.grad(out.sum(), list(diff.values()), allow_unused=True)
    res = {}
    for (k, p), g in zip(diff.items(), gs):
        res[k] = enc(torch.zeros_like(p) if g is None else g)
    return res


def record(
    name, op, make, args, values, *, entropy=True, mean=True, mode=True, grad_make=None
):
    """make(params) -> distribution; values: list of tensors given to log_prob.

    grad_make: an equivalent construction used for the gradients only (its values are
    checked against make's), for a reference whose own gradients are NaN.
    """
    args = {k: v for k, v in args.items() if v is not None}
    p = leaves(args)
    d = make(p)
    expect = {
        "batch_shape": list(d.batch_shape),
        "event_shape": list(d.event_shape),
        "log_prob": [],
    }
    if op == "OneHotCategorical":
        # TorchRL's OneHotCategorical subclasses D.Categorical (event_shape ()); the port
        # uses torch.distributions.OneHotCategorical's shapes: event_shape [n].
        expect["event_shape"] = [d.logits.shape[-1]]
    for v in values:
        p = leaves(args)
        d = make(p)
        v = dec(enc(v))
        out = d.log_prob(v)
        grads = grads_of(out, p)
        if grad_make is not None:
            gp = leaves(args)
            gout = grad_make(gp).log_prob(v)
            grads = grads_of(gout, gp) if torch.isfinite(out).all() else None
            if grads is not None:
                assert torch.allclose(gout, out, atol=1e-6), (name, gout, out)
        expect["log_prob"].append({"value": enc(v), "out": enc(out), "grads": grads})
    for what, flag in (("entropy", entropy), ("mean", mean), ("mode", mode)):
        if not flag:
            expect[what] = None
            continue
        p = leaves(args)
        d = make(p)
        out = flag(d) if callable(flag) else getattr(d, what)
        if callable(out):
            out = out()
        grads = grads_of(out, p)
        if grad_make is not None and what == "entropy":
            gp = leaves(args)
            gout = grad_make(gp).entropy()
            assert torch.allclose(gout, out, atol=1e-6), (name, gout, out)
            grads = grads_of(gout, gp)
        expect[what] = {"out": enc(out), "grads": grads}
    CASES.append(
        {"name": name, "op": op, "args": {k: enc(v) for k, v in args.items()}, "expect": expect}
    )


def t32(x):
    return torch.tensor(x, dtype=torch.float32)


def t64(x):
    return torch.tensor(x, dtype=torch.float64)


def i64(x):
    return torch.tensor(x, dtype=torch.int64)


def b(x):
    return torch.tensor(x, dtype=torch.bool)


# ---------------------------------------------------------------- Normal

normal = lambda p: D.Normal(p["loc"], p["scale"])  # noqa: E731

record(
    "normal_scalar",
    "Normal",
    normal,
    {"loc": t32(0.3), "scale": t32(1.7)},
    [t32(0.5), t32([-1.0, 0.0, 2.5, 10.0])],
)
record(
    "normal_batched",
    "Normal",
    normal,
    {"loc": t32([-1.0, 0.0, 2.0]), "scale": t32([0.5, 1.0, 3.0])},
    [t32([-1.2, 0.7, 5.0]), t32([[0.0, 0.0, 0.0], [1.0, -2.0, 3.0]])],
)
record(
    "normal_broadcast_params",
    "Normal",
    normal,
    {"loc": t32([[0.1, 0.2, 0.3], [-0.4, -0.5, -0.6]]), "scale": t32([0.2, 1.5, 4.0])},
    [t32([[0.0, 1.0, -1.0], [2.0, 0.5, 0.25]]), t32([0.3, -0.3, 3.0]), t32(1.0)],
)
record(
    "normal_column_scale",
    "Normal",
    normal,
    {"loc": t32([1.0, 2.0, 3.0, 4.0]), "scale": t32([[0.5], [2.0]])},
    [t32([[1.5, 2.5, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0]])],
)
record(
    "normal_small_scale",
    "Normal",
    normal,
    {"loc": t32([0.0, 1.0]), "scale": t32([1e-3, 1e-2])},
    [t32([1e-3, 1.01])],
)
record(
    "normal_float64",
    "Normal",
    normal,
    {"loc": t64([[0.5, -0.5], [1.5, 2.5]]), "scale": t64([[1.0, 0.1], [2.0, 0.7]])},
    [t64([[0.25, -0.45], [0.0, 3.0]])],
)

# ---------------------------------------------------------------- TanhNormal


def tanh_normal(p):
    return TanhNormal(p["loc"], p["scale"], low=p["low"], high=p["high"])


def tanh_mode(d):
    return d.deterministic_sample


record(
    "tanh_normal_unit_bounds",
    "TanhNormal",
    tanh_normal,
    {"loc": t32([0.0, 0.5, -1.0]), "scale": t32([1.0, 0.3, 2.0]), "low": t32(-1.0), "high": t32(1.0)},
    [
        t32([0.1, 0.4, -0.7]),
        t32([[0.999, -0.999, 0.0], [1.0, -1.0, 0.5]]),  # exactly at the bounds: clamped
    ],
    entropy=False,
    mean=False,
    mode=tanh_mode,
)
record(
    "tanh_normal_scalar_bounds_batched",
    "TanhNormal",
    tanh_normal,
    {
        "loc": t32([[0.0, 0.3], [-0.2, 1.0], [2.0, -3.0], [0.7, 0.1]]),
        "scale": t32([[1.0, 0.5], [0.2, 0.8], [1.5, 0.4], [0.05, 2.5]]),
        "low": t32(-2.0),
        "high": t32(3.0),
    },
    [
        t32([[0.5, 0.5], [-1.0, 2.0], [2.9, -1.9], [0.5, 0.0]]),
        t32([[3.0, -2.0], [2.999, -1.999], [3.5, -2.5], [0.0, 0.0]]),  # at / beyond bounds
    ],
    entropy=False,
    mean=False,
    mode=tanh_mode,
)
record(
    "tanh_normal_tensor_bounds",
    "TanhNormal",
    tanh_normal,
    {
        "loc": t32([[0.2, -0.1], [1.0, 0.4], [-0.5, 2.0]]),
        "scale": t32([[0.5, 1.0], [0.3, 0.6], [1.2, 0.9]]),
        "low": t32([-1.0, 0.0]),
        "high": t32([1.0, 10.0]),
    },
    [t32([[0.1, 5.0], [0.8, 9.5], [-0.9, 0.5]])],
    entropy=False,
    mean=False,
    mode=tanh_mode,
)
record(
    "tanh_normal_scalar_event_dims_0",
    "TanhNormal",
    tanh_normal,
    {"loc": t32(0.4), "scale": t32(0.6), "low": t32(0.0), "high": t32(1.0)},
    [t32(0.25), t32([0.1, 0.5, 0.9, 0.999999])],
    entropy=False,
    mean=False,
    mode=tanh_mode,
)
record(
    "tanh_normal_saturated_loc",
    "TanhNormal",
    tanh_normal,
    {"loc": t32([5.0, -8.0, 20.0]), "scale": t32([0.1, 0.5, 0.1]), "low": t32(-1.0), "high": t32(1.0)},
    [t32([0.9999, -0.99999, 0.999999])],
    entropy=False,
    mean=False,
    mode=tanh_mode,
)
record(
    "tanh_normal_float64",
    "TanhNormal",
    tanh_normal,
    {
        "loc": t64([[0.1, -0.3], [0.6, 1.2]]),
        "scale": t64([[0.9, 0.4], [1.1, 0.2]]),
        "low": t64(-3.0),
        "high": t64(1.0),
    },
    [t64([[-1.0, 0.5], [0.99, -2.99]])],
    entropy=False,
    mean=False,
    mode=tanh_mode,
)

# ---------------------------------------------------------------- Categorical


def categorical(p):
    # use_cross_entropy=False: same values, and unlike the cross-entropy path it accepts
    # values with leading sample dims.
    if "mask" in p:
        if "probs" in p:
            return MaskedCategorical(probs=p["probs"], mask=p["mask"], use_cross_entropy=False)
        return MaskedCategorical(logits=p["logits"], mask=p["mask"], use_cross_entropy=False)
    if "probs" in p:
        return D.Categorical(probs=p["probs"])
    return D.Categorical(logits=p["logits"])


record(
    "categorical_logits_unbatched",
    "Categorical",
    categorical,
    {"logits": t32([0.5, -1.0, 2.0, 0.0, 1.0])},
    [i64(2), i64([0, 4, 1, 2])],
    mean=False,
)
record(
    "categorical_logits_batched",
    "Categorical",
    categorical,
    {"logits": t32([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, 0.0, 1.0], [10.0, -10.0, 0.5, 0.5]])},
    [i64([3, 0, 2]), i64([[0, 1, 2], [3, 3, 3]])],
    mean=False,
)
record(
    "categorical_probs_with_zero",
    "Categorical",
    categorical,
    {"probs": t32([[0.2, 0.0, 0.8], [0.5, 0.25, 0.25]])},
    [i64([0, 2]), i64([1, 1])],  # class 1 of row 0 has probability 0: log(eps)
    mean=False,
)
record(
    "categorical_probs_unnormalised",
    "Categorical",
    categorical,
    {"probs": t32([1.0, 0.5, 0.5])},
    [i64([0, 1, 2])],
    mean=False,
)
record(
    "categorical_masked_logits",
    "Categorical",
    categorical,
    {
        "logits": t32([[1.0, 2.0, 3.0, 4.0], [0.5, -0.5, 1.5, 0.0], [2.0, 2.0, 2.0, 2.0]]),
        "mask": b([[True, False, True, False], [True, True, True, True], [False, False, False, True]]),
    },
    [i64([0, 3, 3]), i64([2, 1, 3]), i64([1, 0, 3])],  # the last one hits a masked class: -inf
    mean=False,
)
record(
    "categorical_masked_broadcast_mask",
    "Categorical",
    categorical,
    {"logits": t32([[0.3, 0.1, -0.2], [1.0, 0.0, -1.0]]), "mask": b([True, False, True])},
    [i64([0, 2]), i64([[2, 0], [0, 0]])],
    mean=False,
    # TorchRL's MaskedCategorical.entropy cannot broadcast a mask from the left
    # (expand_as_right); same distribution with the mask expanded beforehand.
    entropy=lambda d: MaskedCategorical(
        logits=d.logits, mask=d.mask.expand(d.logits.shape), use_cross_entropy=False
    ).entropy(),
)
record(
    "categorical_masked_probs",
    "Categorical",
    categorical,
    {"probs": t32([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]]), "mask": b([[True, True, False, True], [False, True, True, False]])},
    [i64([3, 1]), i64([0, 2])],
    mean=False,
    # MaskedCategorical takes ln(probs) of the masked zeros, so its gradients are NaN
    # everywhere; the reference gradients come from torch's Categorical on the masked probs
    # (same values on allowed classes, finite gradients), which the port reproduces.
    grad_make=lambda p: D.Categorical(probs=p["probs"].masked_fill(~p["mask"], 0.0)),
)
record(
    "categorical_float64",
    "Categorical",
    categorical,
    {"logits": t64([[0.1, 0.2, 0.7], [3.0, -1.0, 0.0]])},
    [i64([2, 0])],
    mean=False,
)

# ---------------------------------------------------------------- OneHotCategorical


def one_hot(p):
    if "probs" in p:
        return OneHotCategorical(probs=p["probs"])
    return OneHotCategorical(logits=p["logits"])


def one_hot_mean(d):
    # torch.distributions.OneHotCategorical's mean is its probs.
    return d.probs


def oh(idx, n):
    return torch.nn.functional.one_hot(i64(idx), n)


record(
    "one_hot_logits_batched",
    "OneHotCategorical",
    one_hot,
    {"logits": t32([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.0, 1.0], [0.0, 0.0, 5.0, 0.0]])},
    [oh([3, 0, 2], 4), oh([[0, 1, 2], [3, 3, 3]], 4).to(torch.float32)],
    mean=one_hot_mean,
)
record(
    "one_hot_probs_unbatched",
    "OneHotCategorical",
    one_hot,
    {"probs": t32([0.1, 0.6, 0.3])},
    [oh(1, 3), oh([0, 2, 1], 3)],
    mean=one_hot_mean,
)

# ---------------------------------------------------------------- Delta

delta = lambda p: Delta(p["param"])  # noqa: E731

record(
    "delta_batched",
    "Delta",
    delta,
    {"param": t32([[1.0, 2.0, 3.0], [-1.0, 0.0, 0.5]])},
    [
        t32([[1.0, 2.0, 3.0], [-1.0, 0.0, 0.6]]),
        t32([[1.0000001, 2.0, 3.0], [-1.0, 1e-7, 0.5]]),  # within atol + rtol * |param|
        t32([[[1.0, 2.0, 3.0], [-1.0, 0.0, 0.5]], [[0.0, 0.0, 0.0], [-1.0, 0.0, 0.5]]]),
    ],
    entropy=False,
)
record(
    "delta_vector",
    "Delta",
    delta,
    {"param": t32([0.25, -4.0])},
    [t32([0.25, -4.0]), t32([0.25, -4.1])],
    entropy=False,
)


def main():
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    versions = {
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "python": platform.python_version(),
    }
    lines = [
        "{",
        f'"generator": {json.dumps(GENERATOR)},',
        f'"versions": {json.dumps(versions)},',
        f'"notes": {json.dumps(NOTES)},',
        '"cases": [',
    ]
    body = [json.dumps(c, allow_nan=False) for c in CASES]
    lines.append(",\n".join(body))
    lines.append("]}")
    text = "\n".join(lines) + "\n"
    json.loads(text)
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {len(CASES)} cases to {os.path.relpath(OUT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
