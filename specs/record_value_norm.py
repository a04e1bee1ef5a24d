#!/usr/bin/env python
"""Record reference cases for TorchRL 0.14.1's value normalisers
(``torchrl/modules/value_norm.py``: ``PopArtValueNorm``, ``RunningValueNorm``,
``PercentileValueNorm``).

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_value_norm.py

It writes ``specs/value_norm_cases.json`` (Rust never runs Python). Everything is float64
(``torch.set_default_dtype(torch.float64)``, so the buffers are float64 too) and
deterministic: every input is drawn from ``torch.Generator().manual_seed(seed)`` and written
out literally. Tensors are ``{"shape", "dtype", "data"}`` (row-major; ``record_offpolicy.t2j``).

Ops (``"op"`` of each case):

- ``"sequence"``: build ``<class>(**kwargs)``; record the fresh state (``"initial"``), then run
  four ``update(value_target)`` calls and record the state after each (``"steps"``). A state
  is::

      {"buffers": {name: tensor},            # the module's state_dict (persistent buffers)
       "normalize": {"input": x, "output": normalize(x)},
       "denormalize": {"input": y, "output": denormalize(y)},
       "scale": scale()}

  with ``x`` / ``y`` of shape ``[5, *shape]`` (fresh draws per state). Each step is the state
  plus ``"update": value_target`` (the tensor passed to ``update``). The update inputs have
  shapes ``[6, *shape]``, ``[2, 3, *shape]``, ``shape`` itself (no leading dim: nothing to
  reduce) and ``[4, *shape]``. ``"update_errors"``: ``[{"input", "error"}]`` -- ``update`` on
  each input raises ``ValueError`` whose message contains ``error`` (wrong trailing shape;
  a 0-d input; for a 2-d shape, an input with too few dims); the state is unchanged.
- ``"ctor_error"``: ``<class>(**kwargs)`` raises ``ValueError`` containing ``error``.

Case layout: ``{"name", "op", "class", "kwargs", "shape": list (the normalised per-element
shape), "initial"?, "steps"?, "update_errors"?, "error"?}``. ``kwargs`` are exactly the
constructor keyword arguments (``quantiles`` as a 2-list); absent ones take the defaults
(PopArt: shape 1, beta 0.99999, epsilon 1e-5; Running: shape 1, epsilon 1e-5;
Percentile: shape 1, quantiles (0.05, 0.95), rate 0.01, min_scale 1.0, center False,
epsilon 1e-5 -- unused).

Semantics (``reduce`` = every leading dim of the input in front of ``shape``; none when the
input's shape is ``shape``; ``m = mean over reduce``):

- PopArt buffers ``running_mean [shape]``, ``running_mean_sq [shape]``, ``debiasing_term []``,
  all zero at start. update: ``rm = beta*rm + (1-beta)*m(v)``, ``rms = beta*rms +
  (1-beta)*m(v^2)``, ``d = beta*d + (1-beta)``. Stats: ``debias = max(d, eps)``,
  ``mean = rm/debias``, ``var = max(rms/debias - mean^2, eps)``. normalize ``(x-mean)/sqrt(var)``,
  denormalize ``y*sqrt(var)+mean``, scale ``sqrt(var)``.
- Running buffers ``mean [shape]``, ``m2 [shape]``, ``count []`` (float). update (Chan):
  ``n_b = prod(reduce sizes)`` (1 when nothing is reduced), ``mu_b = m(v)``,
  ``var_b = population variance over reduce`` (0 when nothing is reduced),
  ``delta = mu_b - mean``, ``tot = count + n_b``, ``mean += delta*n_b/tot``,
  ``m2 += var_b*n_b + delta^2*count*n_b/tot``, ``count = tot``.
  ``var = max(m2/max(count, 1), eps)``; normalize / denormalize / scale as PopArt.
- Percentile buffers ``low [shape]``, ``high [shape]`` (zero at start). update: flatten the
  input to ``[N, *shape]``, take ``torch.quantile`` (linear interpolation) of ``quantiles``
  along dim 0, ``low += rate*(q_low - low)``, ``high += rate*(q_high - high)`` (``lerp_``).
  ``scale = max(high - low, min_scale)``; normalize ``x/scale`` (``(x-low)/scale`` when
  ``center``), denormalize ``y*scale`` (``y*scale+low`` when ``center``).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import tensordict  # noqa: E402
import torchrl  # noqa: E402
from torchrl.modules.value_norm import PercentileValueNorm, PopArtValueNorm, RunningValueNorm  # noqa: E402

from record_offpolicy import t2j  # noqa: E402  (sets the float64 default dtype too)

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "value_norm_cases.json")

CLASSES = {
    "PopArtValueNorm": PopArtValueNorm,
    "RunningValueNorm": RunningValueNorm,
    "PercentileValueNorm": PercentileValueNorm,
}


def norm_shape(kwargs):
    s = kwargs.get("shape", 1)
    return [s] if isinstance(s, int) else list(s)


def ctor_kwargs(kwargs):
    k = dict(kwargs)
    if "quantiles" in k:
        k["quantiles"] = tuple(k["quantiles"])
    if isinstance(k.get("shape"), list):
        k["shape"] = tuple(k["shape"])
    return k


def state(vn, g, shape):
    x = torch.randn(5, *shape, generator=g) * 3.0 + 1.0
    y = torch.randn(5, *shape, generator=g)
    return {
        "buffers": {k: t2j(v.to(torch.float64)) for k, v in vn.state_dict().items()},
        "normalize": {"input": t2j(x), "output": t2j(vn.normalize(x))},
        "denormalize": {"input": t2j(y), "output": t2j(vn.denormalize(y))},
        "scale": t2j(vn.scale()),
    }


def bad_inputs(shape, g):
    """Inputs whose trailing shape does not match, with a substring of the message."""
    cls_shape = tuple(shape)
    out = []
    wrong = list(shape[:-1]) + [shape[-1] + 1]
    out.append((torch.randn(4, *wrong, generator=g),
                f"was initialised with shape={cls_shape} but got a value_target with trailing shape {tuple(wrong)}"))
    out.append((torch.tensor(0.5), f"was initialised with shape={cls_shape} but got a value_target with trailing shape ()"))
    if len(shape) > 1:
        out.append((torch.randn(shape[-1], generator=g),
                    f"was initialised with shape={cls_shape} but got a value_target with trailing shape ({shape[-1]},)"))
    return out


def record_sequence(name, cls_name, kwargs, seed, loc=1.5, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    shape = norm_shape(kwargs)
    vn = CLASSES[cls_name](**ctor_kwargs(kwargs))
    initial = state(vn, g, shape)
    steps = []
    for lead in ([6], [2, 3], [], [4]):
        v = torch.randn(*lead, *shape, generator=g) * spread + loc
        vn.update(v)
        st = state(vn, g, shape)
        st = {"update": t2j(v), **st}
        steps.append(st)
        loc, spread = loc - 0.7, spread * 0.6  # drift, so that the statistics move
    errors = []
    before = {k: v.clone() for k, v in vn.state_dict().items()}
    for inp, msg in bad_inputs(shape, g):
        try:
            vn.update(inp)
        except ValueError as e:
            assert msg in str(e), (str(e), msg)
            errors.append({"input": t2j(inp), "error": msg})
        else:
            raise AssertionError(f"{name}: update({list(inp.shape)}) did not raise")
    for k, v in vn.state_dict().items():
        assert torch.equal(v, before[k]), f"{name}: failed update changed {k}"
    return {"name": name, "op": "sequence", "class": cls_name, "kwargs": kwargs, "shape": shape,
            "initial": initial, "steps": steps, "update_errors": errors}


def record_ctor_error(name, cls_name, kwargs, msg):
    try:
        CLASSES[cls_name](**ctor_kwargs(kwargs))
    except ValueError as e:
        assert msg in str(e), (str(e), msg)
    else:
        raise AssertionError(f"{name}: no error")
    return {"name": name, "op": "ctor_error", "class": cls_name, "kwargs": kwargs,
            "shape": norm_shape(kwargs), "error": msg}


SEQUENCES = [
    ("popart_defaults", "PopArtValueNorm", {}, 100),
    ("popart_beta_0.9", "PopArtValueNorm", {"beta": 0.9}, 101),
    ("popart_beta_0.5_eps_0.3", "PopArtValueNorm", {"beta": 0.5, "epsilon": 0.3}, 102),
    ("popart_beta_0.9_eps_0.2", "PopArtValueNorm", {"beta": 0.9, "epsilon": 0.2}, 105),  # debias floor at step 1
    ("popart_shape_3", "PopArtValueNorm", {"shape": 3, "beta": 0.8}, 103),
    ("popart_shape_2x2", "PopArtValueNorm", {"shape": [2, 2], "beta": 0.7}, 104),
    ("running_defaults", "RunningValueNorm", {}, 110),
    ("running_eps_0.5", "RunningValueNorm", {"epsilon": 0.5}, 111),
    ("running_eps_5.3", "RunningValueNorm", {"epsilon": 5.3}, 113),  # variance floor after updates
    ("running_shape_3", "RunningValueNorm", {"shape": 3}, 112),
    ("percentile_defaults", "PercentileValueNorm", {}, 120),
    ("percentile_quantiles_rate", "PercentileValueNorm", {"quantiles": [0.25, 0.8], "rate": 0.5}, 121),
    ("percentile_min_scale_0.1_rate_1", "PercentileValueNorm", {"min_scale": 0.1, "rate": 1.0}, 122),
    ("percentile_center", "PercentileValueNorm", {"center": True, "rate": 0.3, "min_scale": 0.5}, 123),
    ("percentile_shape_3_eps", "PercentileValueNorm",
     {"shape": 3, "rate": 0.6, "quantiles": [0.0, 1.0], "epsilon": 0.5}, 124),
]

CTOR_ERRORS = [
    ("percentile_quantiles_reversed", "PercentileValueNorm", {"quantiles": [0.9, 0.1]},
     "quantiles must satisfy 0 <= low < high <= 1, got (0.9, 0.1)."),
    ("percentile_quantiles_equal", "PercentileValueNorm", {"quantiles": [0.5, 0.5]},
     "quantiles must satisfy 0 <= low < high <= 1"),
    ("percentile_quantile_above_1", "PercentileValueNorm", {"quantiles": [0.1, 1.5]},
     "quantiles must satisfy 0 <= low < high <= 1"),
    ("percentile_rate_above_1", "PercentileValueNorm", {"rate": 1.5}, "rate must be in [0, 1], got 1.5."),
    ("percentile_rate_negative", "PercentileValueNorm", {"rate": -0.1}, "rate must be in [0, 1], got -0.1."),
    ("percentile_min_scale_zero", "PercentileValueNorm", {"min_scale": 0.0}, "min_scale must be positive, got 0.0."),
]


def main():
    cases = [record_sequence(*c) for c in SEQUENCES] + [record_ctor_error(*c) for c in CTOR_ERRORS]
    doc = {
        "generator": "specs/record_value_norm.py",
        "versions": {"torch": torch.__version__, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__},
    }
    with open(OUT, "w") as f:
        f.write("{\n")
        f.write(f'"generator": {json.dumps(doc["generator"])},\n')
        f.write(f'"versions": {json.dumps(doc["versions"])},\n')
        f.write('"cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]\n}\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
