#!/usr/bin/env python
"""Record reference cases from the Python tensordict / torchrl libraries.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record.py

It writes ``specs/tensordict_cases.json`` and ``specs/spec_cases.json``.
The Rust test-suite replays these files; it never runs Python.

How it works
------------
Every case is declared as ``(name, op, args, expect_error, facts)`` where
``args`` holds *Python* objects (tensors, TensorDicts, specs, ...).  The
recorder

1. encodes ``args`` to JSON,
2. decodes that JSON back into fresh Python objects (so the recorded
   arguments are exactly what was run, and mutating ops cannot leak between
   cases),
3. runs the op through a small interpreter (``run_td_op`` / ``run_spec_op``)
   that uses the same op vocabulary the Rust replayer implements,
4. encodes the result, or the raised exception, as ``expect``.

A case whose outcome (success / error) differs from what its declaration
says aborts the script, as does an error fact that is not a substring of the
(normalised) Python message.  See specs/README.md for the file format.
"""

import json
import os
import re
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

import numpy  # noqa: E402
import tensordict  # noqa: E402
import torch  # noqa: E402
import torchrl  # noqa: E402
from tensordict import TensorDict, TensorDictBase  # noqa: E402
from torchrl.data import (  # noqa: E402
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    Unbounded,
)

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATOR = "specs/record.py"

# --------------------------------------------------------------------------
# encoding / decoding
# --------------------------------------------------------------------------

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_name(dt):
    if dt not in DTYPE_NAMES:
        raise TypeError(f"unsupported dtype {dt}")
    return DTYPE_NAMES[dt]


def enc_tensor(t):
    t = t.detach().cpu().contiguous()
    return {
        "shape": list(t.shape),
        "dtype": dtype_name(t.dtype),
        "data": t.reshape(-1).tolist(),
    }


def dec_tensor(d):
    dt = DTYPES[d["dtype"]]
    return torch.tensor(d["data"], dtype=dt).reshape(d["shape"])


def is_enc_tensor(d):
    return isinstance(d, dict) and "data" in d and "dtype" in d and "shape" in d


def is_enc_td(d):
    return isinstance(d, dict) and "batch_size" in d and "entries" in d


def enc_td(td):
    if type(td) is not TensorDict:
        raise TypeError(f"only plain TensorDict can be encoded, got {type(td)}")
    entries = {}
    for k, v in td.items():
        if isinstance(v, torch.Tensor):
            entries[k] = enc_tensor(v)
        elif isinstance(v, TensorDictBase):
            entries[k] = enc_td(v)
        else:
            raise TypeError(f"cannot encode entry {k!r} of type {type(v)}")
    return {"batch_size": list(td.batch_size), "entries": entries}


def dec_td(d):
    src = {}
    for k, v in d["entries"].items():
        src[k] = dec_td(v) if is_enc_td(v) else dec_tensor(v)
    return TensorDict(src, batch_size=d["batch_size"])


def enc_key(k):
    if isinstance(k, str):
        return [k]
    return list(k)


def dec_key(k):
    assert isinstance(k, list) and all(isinstance(s, str) for s in k), k
    return k[0] if len(k) == 1 else tuple(k)


def enc_index(idx):
    """idx: a tuple of python index items."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    out = []
    for it in idx:
        if it is Ellipsis:
            out.append({"ellipsis": True})
        elif it is None:
            out.append({"none": True})
        elif isinstance(it, bool):
            raise TypeError("bool index items are not supported")
        elif isinstance(it, int):
            out.append({"int": it})
        elif isinstance(it, slice):
            out.append({"slice": [it.start, it.stop, it.step]})
        elif isinstance(it, torch.Tensor) and it.dtype == torch.bool:
            out.append({"mask": enc_tensor(it)})
        elif isinstance(it, torch.Tensor) and it.dtype == torch.int64:
            out.append({"tensor": enc_tensor(it)})
        else:
            raise TypeError(f"unsupported index item {it!r}")
    return out


def dec_index(items):
    out = []
    for it in items:
        ((kind, v),) = it.items()
        if kind == "int":
            out.append(v)
        elif kind == "slice":
            out.append(slice(*v))
        elif kind == "ellipsis":
            out.append(Ellipsis)
        elif kind == "none":
            out.append(None)
        elif kind in ("mask", "tensor"):
            out.append(dec_tensor(v))
        else:
            raise ValueError(kind)
    # a single item is passed bare (spec[t] and spec[(t,)] differ for tensors)
    return out[0] if len(out) == 1 else tuple(out)


def spec_class(s):
    # order matters: Binary < Categorical, MultiOneHot < OneHot
    for name, cls in (
        ("Composite", Composite),
        ("MultiOneHot", MultiOneHot),
        ("OneHot", OneHot),
        ("MultiCategorical", MultiCategorical),
        ("Binary", Binary),
        ("Categorical", Categorical),
        ("Bounded", Bounded),
        ("Unbounded", Unbounded),
    ):
        if isinstance(s, cls):
            if "Stacked" in type(s).__name__:
                break
            return name
    raise TypeError(f"cannot encode spec of type {type(s).__name__}")


def enc_mask(m):
    return None if m is None else enc_tensor(m)


def enc_spec(s):
    if s is None:
        return None
    cls = spec_class(s)
    out = {"class": cls, "shape": list(s.shape)}
    if cls == "Composite":
        out["dtype"] = None
        out["entries"] = {k: enc_spec(v) for k, v in s.items()}
        return out
    out["dtype"] = dtype_name(s.dtype)
    if cls == "Bounded":
        out["low"] = enc_tensor(s.space.low)
        out["high"] = enc_tensor(s.space.high)
    elif cls in ("Categorical", "OneHot"):
        out["n"] = int(s.n)
        out["mask"] = enc_mask(s.mask)
    elif cls == "Binary":
        # python stores n == 2 (the box cardinality); record the ctor argument,
        # i.e. the size of the last dim.
        out["n"] = int(s.shape[-1])
        out["mask"] = enc_mask(s.mask)
    elif cls == "MultiCategorical":
        nvec = s.nvec
        out["nvec"] = nvec.tolist() if isinstance(nvec, torch.Tensor) else list(nvec)
        out["mask"] = enc_mask(s.mask)
    elif cls == "MultiOneHot":
        nvec = s.nvec
        out["nvec"] = nvec.tolist() if isinstance(nvec, torch.Tensor) else list(nvec)
        out["mask"] = enc_mask(s.mask)
    return out


def dec_mask(m):
    return None if m is None else dec_tensor(m)


def dec_spec(d):
    if d is None:
        return None
    cls = d["class"]
    shape = tuple(d["shape"])
    if cls == "Composite":
        return Composite(
            {k: dec_spec(v) for k, v in d["entries"].items()}, shape=shape
        )
    dt = DTYPES[d["dtype"]]
    if cls == "Unbounded":
        return Unbounded(shape=shape, dtype=dt)
    if cls == "Bounded":
        return Bounded(
            low=dec_tensor(d["low"]), high=dec_tensor(d["high"]), shape=shape, dtype=dt
        )
    if cls == "Categorical":
        return Categorical(d["n"], shape=shape, dtype=dt, mask=dec_mask(d["mask"]))
    if cls == "OneHot":
        return OneHot(d["n"], shape=shape, dtype=dt, mask=dec_mask(d["mask"]))
    if cls == "Binary":
        return Binary(d["n"], shape=shape, dtype=dt)
    if cls == "MultiCategorical":
        nvec = d["nvec"]
        if nvec and isinstance(nvec[0], list):
            nvec = torch.tensor(nvec)
        return MultiCategorical(nvec, shape=shape, dtype=dt, mask=dec_mask(d["mask"]))
    if cls == "MultiOneHot":
        return MultiOneHot(d["nvec"], shape=shape, dtype=dt, mask=dec_mask(d["mask"]))
    raise ValueError(cls)


def enc_any(v):
    """Encode a python value found in args or results."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.Tensor):
        return enc_tensor(v)
    if isinstance(v, TensorDictBase):
        return enc_td(v)
    if isinstance(v, torch.Size):
        return list(v)
    if isinstance(v, (list, tuple)):
        return [enc_any(x) for x in v]
    if isinstance(v, torch.dtype):
        return dtype_name(v)
    if hasattr(v, "shape") and hasattr(v, "device") and type(v).__module__.startswith(
        "torchrl"
    ):
        return enc_spec(v)
    if isinstance(v, dict):
        return {k: enc_any(x) for k, x in v.items()}
    raise TypeError(f"cannot encode {type(v)}")


def dec_value(d):
    """Decode a tensor / tensordict / plain JSON value."""
    if is_enc_td(d):
        return dec_td(d)
    if is_enc_tensor(d):
        return dec_tensor(d)
    return d


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------


def exc_message(e):
    if isinstance(e, KeyError) and len(e.args) == 1 and isinstance(e.args[0], str):
        return e.args[0]
    return str(e)


def normalise(msg):
    """torch.Size([3, 4]) -> [3, 4]; torch.float32 -> float32."""
    msg = re.sub(r"torch\.Size\((\[[^\]]*\])\)", r"\1", msg)
    msg = re.sub(r"torch\.(float32|float64|int64|int32|bool|uint8|int8)\b", r"\1", msg)
    return msg


# --------------------------------------------------------------------------
# the op interpreters (same vocabulary as the Rust replayer)
# --------------------------------------------------------------------------


def run_td_op(op, a):
    if op == "construct":
        return dec_td(a["td"])
    if op == "stack":
        return torch.stack([dec_td(t) for t in a["tds"]], a["dim"])
    if op == "cat":
        return torch.cat([dec_td(t) for t in a["tds"]], a["dim"])
    td = dec_td(a["td"])
    if op == "get":
        return td.get(dec_key(a["key"]))
    if op == "set":
        return td.set(dec_key(a["key"]), dec_value(a["value"]))
    if op == "set_":
        return td.set_(dec_key(a["key"]), dec_value(a["value"]))
    if op == "pop":
        v = td.pop(dec_key(a["key"]))
        return {"value": v, "td": td}
    if op == "del":
        del td[dec_key(a["key"])]
        return td
    if op == "update":
        return td.update(dec_td(a["other"]))
    if op == "select":
        return td.select(*[dec_key(k) for k in a["keys"]], strict=a["strict"])
    if op == "exclude":
        return td.exclude(*[dec_key(k) for k in a["keys"]])
    if op == "rename_key":
        return td.rename_key_(dec_key(a["old"]), dec_key(a["new"]), safe=a["safe"])
    if op == "keys":
        return [
            enc_key(k) for k in td.keys(a["include_nested"], a["leaves_only"])
        ]
    if op == "is_empty":
        return bool(td.is_empty())
    if op == "flatten_keys":
        return td.flatten_keys(a["sep"])
    if op == "index":
        return td[dec_index(a["index"])]
    if op == "expand":
        return td.expand(*a["shape"])
    if op == "reshape":
        return td.reshape(*a["shape"])
    if op == "view":
        return td.view(*a["shape"])
    if op == "unsqueeze":
        return td.unsqueeze(a["dim"])
    if op == "squeeze":
        return td.squeeze() if a["dim"] is None else td.squeeze(a["dim"])
    if op == "permute":
        return td.permute(*a["dims"])
    if op == "unbind":
        return list(td.unbind(a["dim"]))
    if op == "split":
        return list(td.split(a["sizes"], a["dim"]))
    if op == "eq":
        return td == dec_td(a["other"])
    if op == "setitem_index":
        td[dec_index(a["index"])] = dec_td(a["value"])
        return td
    if op == "apply_add":
        return td + a["scalar"]
    if op == "zero_":
        return td.zero_()
    raise ValueError(f"unknown td op {op}")


def dec_ctor(c):
    c = dict(c)
    cls = {
        "Unbounded": Unbounded,
        "Bounded": Bounded,
        "Categorical": Categorical,
        "OneHot": OneHot,
        "Binary": Binary,
        "MultiCategorical": MultiCategorical,
        "MultiOneHot": MultiOneHot,
        "Composite": Composite,
    }[c.pop("class")]
    kw = {}
    for k, v in c.items():
        if k == "entries":
            # Composite children are given as encoded specs
            kw.update({n: dec_spec(s) for n, s in v.items()})
        elif k == "dtype":
            kw[k] = DTYPES[v]
        elif k == "shape" and isinstance(v, list):
            kw[k] = tuple(v)
        else:
            kw[k] = dec_value(v)
    return cls(**kw)


def skeleton(v):
    """shape / dtype description of a sample (tensor or tensordict)."""
    if isinstance(v, torch.Tensor):
        return {"shape": list(v.shape), "dtype": dtype_name(v.dtype)}
    return {
        "batch_size": list(v.batch_size),
        "entries": {k: skeleton(x) for k, x in v.items()},
    }


def run_spec_op(op, a):
    if op == "construct":
        return dec_ctor(a["ctor"])
    if op == "stack":
        return torch.stack([dec_spec(s) for s in a["specs"]], a["dim"])
    spec = dec_spec(a["spec"])
    if op == "is_in":
        return bool(spec.is_in(dec_value(a["value"])))
    if op == "project":
        return spec.project(dec_value(a["value"]))
    if op == "zero":
        return spec.zero(tuple(a["shape"]))
    if op == "one":
        return spec.one(tuple(a["shape"]))
    if op == "expand":
        return spec.expand(*a["shape"])
    if op == "index":
        return spec[dec_index(a["index"])]
    if op == "squeeze":
        return spec.squeeze() if a["dim"] is None else spec.squeeze(a["dim"])
    if op == "unsqueeze":
        return spec.unsqueeze(a["dim"])
    if op == "encode":
        return spec.encode(a["value"])
    if op == "to_one_hot":
        return spec.to_one_hot(dec_value(a["value"]))
    if op == "to_categorical":
        return spec.to_categorical(dec_value(a["value"]))
    if op == "eq":
        return bool(spec == dec_spec(a["other"]))
    if op == "keys":
        return [enc_key(k) for k in spec.keys(a["include_nested"], a["leaves_only"])]
    if op == "is_empty":
        return bool(spec.is_empty(recurse=a["recurse"]))
    if op == "rand_is_in":
        torch.manual_seed(0)
        sample = spec.rand(tuple(a["shape"]))
        out = {"is_in": bool(spec.is_in(sample))}
        out.update(skeleton(sample))
        return out
    raise ValueError(f"unknown spec op {op}")


# --------------------------------------------------------------------------
# case recording
# --------------------------------------------------------------------------


class Recorder:
    def __init__(self, runner):
        self.runner = runner
        self.cases = []
        self.names = set()

    def case(self, name, op, args, error=False, facts=()):
        assert re.fullmatch(r"[a-z0-9_]+", name), name
        assert name not in self.names, f"duplicate case {name}"
        self.names.add(name)
        enc_args = {
            k: enc_index(v) if k == "index" else enc_any(v) for k, v in args.items()
        }
        # the args must survive a JSON round trip unchanged
        enc_args = json.loads(json.dumps(enc_args, allow_nan=False))
        torch.manual_seed(0)
        try:
            result = self.runner(op, json.loads(json.dumps(enc_args)))
        except Exception as e:  # noqa: BLE001
            if not error:
                raise AssertionError(f"case {name}: unexpected {type(e).__name__}: {e}")
            msg = exc_message(e)
            norm = normalise(msg)
            for f in facts:
                if f not in norm:
                    raise AssertionError(
                        f"case {name}: fact {f!r} not in message {norm!r}"
                    )
            expect = {
                "error": {
                    "class": type(e).__name__,
                    "message": msg,
                    "facts": list(facts),
                }
            }
        else:
            if error:
                raise AssertionError(f"case {name}: expected an error, got {result!r}")
            expect = enc_any(result)
        self.cases.append({"name": name, "op": op, "args": enc_args, "expect": expect})


# --------------------------------------------------------------------------
# fixtures (deterministic)
# --------------------------------------------------------------------------


def ar(*shape, dtype=torch.float32, start=0):
    n = 1
    for s in shape:
        n *= s
    return torch.arange(start, start + n).to(dtype).reshape(shape)


def td_flat():
    """batch [3]: float32 [3,4], int64 [3], bool [3]."""
    return TensorDict(
        {
            "a": ar(3, 4),
            "b": ar(3, dtype=torch.int64),
            "c": torch.tensor([True, False, True]),
        },
        batch_size=[3],
    )


def td_nested():
    """batch [3] with a child of batch [3, 2] (extends the parent)."""
    return TensorDict(
        {
            "a": ar(3, 4),
            "n": TensorDict(
                {
                    "x": ar(3, 2, dtype=torch.int64),
                    "y": ar(3, 2, 2, dtype=torch.float64),
                },
                batch_size=[3, 2],
            ),
        },
        batch_size=[3],
    )


def td_2d():
    """batch [3, 4]: float32 [3,4,5], int32 [3,4], child s [3,4] with uint8."""
    return TensorDict(
        {
            "a": ar(3, 4, 5),
            "m": ar(3, 4, dtype=torch.int32),
            "s": TensorDict({"u": ar(3, 4, 1, dtype=torch.uint8)}, batch_size=[3, 4]),
        },
        batch_size=[3, 4],
    )


def td_scalar():
    """batch []: float32 scalar, int8 [2], nested {"q": {"r": float32 [1]}}."""
    return TensorDict(
        {
            "x": torch.tensor(1.5),
            "y": torch.tensor([-1, 2], dtype=torch.int8),
            "q": TensorDict({"r": torch.tensor([7.0])}, batch_size=[]),
        },
        batch_size=[],
    )


def td_small(val=0.0, batch=(2,), feat=(2,), key="a"):
    return TensorDict({key: ar(*batch, *feat) + val}, batch_size=list(batch))


# --------------------------------------------------------------------------
# TensorDict cases
# --------------------------------------------------------------------------


def tensordict_cases():
    r = Recorder(run_td_op)
    c = r.case
    T = torch.tensor

    # construct
    c("construct_flat_batch3", "construct", {"td": td_flat()})
    c("construct_nested_child_longer_batch", "construct", {"td": td_nested()})
    c("construct_batch_2d", "construct", {"td": td_2d()})
    c("construct_scalar_batch", "construct", {"td": td_scalar()})
    c(
        "construct_error_batch_mismatch",
        "construct",
        {"td": {"batch_size": [4], "entries": {"a": enc_tensor(ar(3, 4))}}},
        error=True,
        facts=["[4]", "[3, 4]"],
    )
    c(
        "construct_error_child_incompatible",
        "construct",
        {
            "td": {
                "batch_size": [3, 4],
                "entries": {
                    "n": {"batch_size": [3, 2], "entries": {"x": enc_tensor(ar(3, 2))}}
                },
            }
        },
        error=True,
        facts=["x", "[3, 2]", "[3, 4]"],
    )
    c(
        "construct_error_child_batch_shorter",
        "construct",
        {
            "td": {
                "batch_size": [3, 4],
                "entries": {
                    "n": {"batch_size": [3], "entries": {"x": enc_tensor(ar(3))}}
                },
            }
        },
        error=True,
        facts=["x", "[3]", "[3, 4]"],
    )

    # get
    c("get_leaf", "get", {"td": td_flat(), "key": ["a"]})
    c("get_nested_leaf", "get", {"td": td_nested(), "key": ["n", "x"]})
    c("get_subtd", "get", {"td": td_nested(), "key": ["n"]})
    c("get_missing_returns_none", "get", {"td": td_flat(), "key": ["zz"]})
    c("get_nested_missing_returns_none", "get", {"td": td_nested(), "key": ["n", "zz"]})
    c(
        "get_error_through_leaf",
        "get",
        {"td": td_flat(), "key": ["a", "b"]},
        error=True,
        facts=["a"],
    )

    # set
    c("set_new_key", "set", {"td": td_flat(), "key": ["d"], "value": ar(3, 2, dtype=torch.float64)})
    c(
        "set_nested_creates_subtd",
        "set",
        {"td": td_flat(), "key": ["m", "z"], "value": ar(3, dtype=torch.int32)},
    )
    c(
        "set_overwrite_changes_dtype_and_shape",
        "set",
        {"td": td_flat(), "key": ["a"], "value": ar(3, dtype=torch.int64)},
    )
    c(
        "set_into_child_with_longer_batch",
        "set",
        {"td": td_nested(), "key": ["n", "z"], "value": ar(3, 2, dtype=torch.bool)},
    )
    c(
        "set_error_batch_mismatch",
        "set",
        {"td": td_flat(), "key": ["d"], "value": ar(4)},
        error=True,
        facts=["[3]", "[4]"],
    )
    c(
        "set_error_scalar_into_batched",
        "set",
        {"td": td_flat(), "key": ["d"], "value": T(1.0)},
        error=True,
        facts=["[3]", "[]"],
    )
    c(
        "set_error_nested_child_batch",
        "set",
        {"td": td_nested(), "key": ["n", "z"], "value": ar(3, 3)},
        error=True,
        facts=["[3, 2]", "[3, 3]"],
    )

    # set_
    c("set__inplace_existing", "set_", {"td": td_flat(), "key": ["a"], "value": ar(3, 4, start=100)})
    c(
        "set__casts_to_existing_dtype",
        "set_",
        {"td": td_flat(), "key": ["b"], "value": T([1.7, -2.2, 3.9])},
    )
    c(
        "set__error_missing_key",
        "set_",
        {"td": td_flat(), "key": ["zz"], "value": ar(3)},
        error=True,
        facts=["zz"],
    )
    c(
        "set__error_shape_mismatch",
        "set_",
        {"td": td_flat(), "key": ["a"], "value": ar(3, 5)},
        error=True,
        facts=["a"],
    )

    # pop / del
    c("pop_leaf", "pop", {"td": td_flat(), "key": ["b"]})
    c("pop_nested_leaf", "pop", {"td": td_nested(), "key": ["n", "y"]})
    c("pop_error_missing", "pop", {"td": td_flat(), "key": ["zz"]}, error=True, facts=["zz"])
    c("del_leaf", "del", {"td": td_flat(), "key": ["a"]})
    c("del_nested_leaves_empty_subtd", "del", {"td": td_scalar(), "key": ["q", "r"]})
    c("del_error_missing", "del", {"td": td_flat(), "key": ["zz"]}, error=True, facts=["zz"])

    # update
    c(
        "update_merges_nested",
        "update",
        {
            "td": td_nested(),
            "other": TensorDict(
                {
                    "a": ar(3, 4, start=-12),
                    "n": TensorDict({"w": ar(3, 2, dtype=torch.int8)}, [3, 2]),
                    "new": ar(3, dtype=torch.bool),
                },
                [3],
            ),
        },
    )

    # select / exclude
    c("select_nested_keeps_parent", "select", {"td": td_nested(), "keys": [["n", "x"]], "strict": True})
    c("select_order_follows_td", "select", {"td": td_flat(), "keys": [["c"], ["a"]], "strict": True})
    c(
        "select_error_missing_strict",
        "select",
        {"td": td_flat(), "keys": [["a"], ["zz"]], "strict": True},
        error=True,
        facts=["zz"],
    )
    c("select_missing_nonstrict", "select", {"td": td_flat(), "keys": [["a"], ["zz"]], "strict": False})
    c("exclude_nested_leaves_empty_subtd", "exclude", {"td": td_scalar(), "keys": [["q", "r"]]})
    c("exclude_subtree", "exclude", {"td": td_nested(), "keys": [["n"]]})
    c("exclude_missing_ignored", "exclude", {"td": td_flat(), "keys": [["zz"], ["b"]]})

    # rename_key
    c("rename_key_simple", "rename_key", {"td": td_flat(), "old": ["a"], "new": ["z"], "safe": False})
    c(
        "rename_key_nested_to_root",
        "rename_key",
        {"td": td_nested(), "old": ["n", "x"], "new": ["x"], "safe": True},
    )
    c(
        "rename_key_overwrite_unsafe",
        "rename_key",
        {"td": td_flat(), "old": ["a"], "new": ["b"], "safe": False},
    )
    c(
        "rename_key_error_missing",
        "rename_key",
        {"td": td_flat(), "old": ["zz"], "new": ["q"], "safe": False},
        error=True,
        facts=["zz"],
    )
    c(
        "rename_key_error_safe_exists",
        "rename_key",
        {"td": td_flat(), "old": ["a"], "new": ["b"], "safe": True},
        error=True,
        facts=["b"],
    )

    # keys
    c("keys_top", "keys", {"td": td_nested(), "include_nested": False, "leaves_only": False})
    c("keys_nested", "keys", {"td": td_nested(), "include_nested": True, "leaves_only": False})
    c("keys_nested_leaves", "keys", {"td": td_nested(), "include_nested": True, "leaves_only": True})
    c("keys_top_leaves_only", "keys", {"td": td_scalar(), "include_nested": False, "leaves_only": True})

    # is_empty / flatten_keys
    c(
        "is_empty_true_with_empty_subtds",
        "is_empty",
        {"td": TensorDict({"a": TensorDict({"b": TensorDict({}, [])}, [])}, [])},
    )
    c("is_empty_false", "is_empty", {"td": td_scalar()})
    c("flatten_keys_nested", "flatten_keys", {"td": td_nested(), "sep": "."})
    c(
        "flatten_keys_drops_empty_subtd",
        "flatten_keys",
        {"td": TensorDict({"e": TensorDict({}, []), "q": td_scalar()}, []), "sep": "."},
    )

    # index
    c("index_int", "index", {"td": td_2d(), "index": (0,)})
    c("index_negative_int", "index", {"td": td_2d(), "index": (-1,)})
    c("index_slice_2d", "index", {"td": td_2d(), "index": (slice(None), slice(1, 3))})
    c("index_slice_step", "index", {"td": td_2d(), "index": (slice(None, None, 2),)})
    c("index_mask", "index", {"td": td_2d(), "index": (T([True, False, True]),)})
    c("index_ellipsis_last", "index", {"td": td_2d(), "index": (Ellipsis, 0)})
    c("index_none_prepends", "index", {"td": td_2d(), "index": (None,)})
    c("index_tensor", "index", {"td": td_2d(), "index": (T([2, 0, 2]),)})
    c("index_child_longer_batch", "index", {"td": td_nested(), "index": (1,)})
    # surprising: indices past the batch dims go into the leaves' feature dims
    c(
        "index_past_batch_dims_into_features",
        "index",
        {"td": TensorDict({"a": ar(3, 4, 5)}, [3, 4]), "index": (0, 0, 1)},
    )
    c(
        "index_error_too_many",
        "index",
        {"td": td_2d(), "index": (0, 0, 0)},
        error=True,
        facts=["too many indices"],
    )
    c(
        "index_error_mask_shape",
        "index",
        {"td": td_2d(), "index": (T([True, False]),)},
        error=True,
        facts=["[2]", "[3, 4, 5]"],
    )
    c(
        "index_error_out_of_bounds",
        "index",
        {"td": td_2d(), "index": (5,)},
        error=True,
        facts=["5", "3"],
    )

    # shape ops
    c("expand_prepend", "expand", {"td": td_2d(), "shape": [2, 3, 4]})
    c("expand_nested_child_longer_batch", "expand", {"td": td_nested(), "shape": [2, 3]})
    c(
        "expand_error_incompatible",
        "expand",
        {"td": td_2d(), "shape": [2, 3]},
        error=True,
        facts=["[3, 4]"],
    )
    c(
        "expand_error_too_few_dims",
        "expand",
        {"td": td_2d(), "shape": [3]},
        error=True,
        facts=["(1)", "(2)"],
    )
    c("reshape_flatten", "reshape", {"td": td_2d(), "shape": [12]})
    c("reshape_minus1", "reshape", {"td": td_2d(), "shape": [-1, 2]})
    c("view_2_6", "view", {"td": td_2d(), "shape": [2, 6]})
    c(
        "view_error_numel",
        "view",
        {"td": td_2d(), "shape": [5, 3]},
        error=True,
        facts=["60"],
    )
    c("unsqueeze_neg", "unsqueeze", {"td": td_2d(), "dim": -1})
    c("unsqueeze_front_nested", "unsqueeze", {"td": td_nested(), "dim": 0})
    c(
        "unsqueeze_error_dim",
        "unsqueeze",
        {"td": td_2d(), "dim": 3},
        error=True,
        facts=["3", "[3, 4]"],
    )
    c(
        "squeeze_dim_size1",
        "squeeze",
        {"td": TensorDict({"a": ar(3, 1, 2)}, [3, 1]), "dim": -1},
    )
    c("squeeze_noop_non_singleton", "squeeze", {"td": td_2d(), "dim": 0})
    c(
        "squeeze_all",
        "squeeze",
        {"td": TensorDict({"a": ar(1, 3, 1, 2)}, [1, 3, 1]), "dim": None},
    )
    c(
        "squeeze_error_dim",
        "squeeze",
        {"td": td_2d(), "dim": 5},
        error=True,
        facts=["5", "[3, 4]"],
    )
    c("permute_swap", "permute", {"td": td_2d(), "dims": [1, 0]})
    c("permute_negative", "permute", {"td": td_2d(), "dims": [-1, 0]})
    c(
        "permute_error_repeated",
        "permute",
        {"td": td_2d(), "dims": [0, 0]},
        error=True,
        facts=["[0, 0]", "[0, 1]"],
    )
    c(
        "permute_error_wrong_len",
        "permute",
        {"td": td_2d(), "dims": [0, 1, 2]},
        error=True,
        facts=["permutation"],
    )
    c("unbind_dim1", "unbind", {"td": td_2d(), "dim": 1})
    c("unbind_neg_nested", "unbind", {"td": td_nested(), "dim": -1})
    c(
        "unbind_error_dim",
        "unbind",
        {"td": td_2d(), "dim": 5},
        error=True,
        facts=["5", "[3, 4]"],
    )
    c("split_list", "split", {"td": td_2d(), "sizes": [1, 2], "dim": 0})
    c("split_int_uneven", "split", {"td": td_2d(), "sizes": 3, "dim": -1})
    c(
        "split_error_sizes",
        "split",
        {"td": td_2d(), "sizes": [1, 1], "dim": 0},
        error=True,
        facts=["3", "[1, 1]"],
    )

    # stack / cat
    tdA, tdB = td_small(0.0), td_small(10.0)
    c("stack_dim0", "stack", {"tds": [tdA, tdB], "dim": 0})
    c("stack_dim1", "stack", {"tds": [tdA, tdB], "dim": 1})
    c("stack_neg_dim", "stack", {"tds": [tdA, tdB], "dim": -1})
    c("stack_nested", "stack", {"tds": [td_nested(), td_nested()], "dim": 0})
    c(
        "stack_error_batch",
        "stack",
        {"tds": [td_small(batch=(2,)), td_small(batch=(3,))], "dim": 0},
        error=True,
        facts=["[2]", "[3]"],
    )
    c(
        "stack_error_exclusive_keys",
        "stack",
        {"tds": [td_small(key="a"), td_small(key="b")], "dim": 0},
        error=True,
        facts=["keys"],
    )
    c(
        "stack_error_leaf_shapes",
        "stack",
        {"tds": [td_small(feat=(2,)), td_small(feat=(3,))], "dim": 0},
        error=True,
        facts=["[2, 3]", "[2, 2]", "a"],
    )
    c("cat_dim0", "cat", {"tds": [tdA, td_small(5.0, batch=(3,))], "dim": 0})
    c(
        "cat_dim1",
        "cat",
        {"tds": [td_small(batch=(2, 1), feat=()), td_small(1.0, batch=(2, 3), feat=())], "dim": 1},
    )
    c(
        "cat_error_keys",
        "cat",
        {"tds": [td_small(key="a"), td_small(key="b")], "dim": 0},
        error=True,
        facts=["a", "b"],
    )
    c(
        "cat_error_other_dim",
        "cat",
        {"tds": [td_small(batch=(2, 1), feat=()), td_small(batch=(3, 2), feat=())], "dim": 0},
        error=True,
        facts=["1", "2"],
    )

    # eq
    c("eq_same", "eq", {"td": td_nested(), "other": td_nested()})
    c(
        "eq_partial",
        "eq",
        {"td": td_flat(), "other": td_flat().set("b", T([0, 0, 2]))},
    )
    c(
        "eq_error_key_mismatch",
        "eq",
        {"td": td_small(key="a"), "other": td_small(key="b")},
        error=True,
        facts=["'a'", "'b'"],
    )

    # setitem_index
    c(
        "setitem_index_row",
        "setitem_index",
        {
            "td": td_2d(),
            "index": (1,),
            "value": TensorDict(
                {
                    "a": -ar(4, 5),
                    "m": ar(4, dtype=torch.int32) + 100,
                    "s": TensorDict({"u": torch.full((4, 1), 255, dtype=torch.uint8)}, [4]),
                },
                [4],
            ),
        },
    )
    c(
        "setitem_index_slice_subset_keys",
        "setitem_index",
        {
            "td": td_flat(),
            "index": (slice(0, 2),),
            "value": TensorDict({"b": T([-5, -6])}, [2]),
        },
    )
    c(
        "setitem_index_mask",
        "setitem_index",
        {
            "td": td_flat(),
            "index": (T([True, False, True]),),
            "value": TensorDict(
                {"a": -ar(2, 4), "b": T([7, 8]), "c": T([False, False])}, [2]
            ),
        },
    )
    c(
        "setitem_index_new_key_added",
        "setitem_index",
        {
            "td": td_flat(),
            "index": (0,),
            "value": TensorDict({"d": T([1.0, 2.0])}, []),
        },
    )
    c(
        "setitem_index_error_batch",
        "setitem_index",
        {
            "td": td_2d(),
            "index": (0,),
            "value": TensorDict({"a": ar(3, 5)}, [3]),
        },
        error=True,
        facts=["[4]", "[3]"],
    )

    # apply_add / zero_
    c("apply_add_int", "apply_add", {"td": td_nested(), "scalar": 1})
    c("apply_add_float_promotes_ints", "apply_add", {"td": td_flat(), "scalar": 0.5})
    c("apply_add_scalar_batch", "apply_add", {"td": td_scalar(), "scalar": -2})
    c("zero_all_dtypes", "zero_", {"td": td_flat()})
    c("zero_nested", "zero_", {"td": td_2d()})

    return r.cases


# --------------------------------------------------------------------------
# spec cases
# --------------------------------------------------------------------------


def spec_cases():
    r = Recorder(run_spec_op)
    c = r.case
    T = torch.tensor

    def ctor(cls, **kw):
        d = {"class": cls}
        d.update(kw)
        return d

    # construct
    c("construct_unbounded_default", "construct", {"ctor": ctor("Unbounded")})
    c("construct_unbounded_int_shape", "construct", {"ctor": ctor("Unbounded", shape=3)})
    c(
        "construct_unbounded_int_dtype",
        "construct",
        {"ctor": ctor("Unbounded", shape=[2], dtype="int64")},
    )
    c("construct_categorical_default", "construct", {"ctor": ctor("Categorical", n=3)})
    c(
        "construct_categorical_mask",
        "construct",
        {"ctor": ctor("Categorical", n=3, mask=T([True, False, True]))},
    )
    c("construct_onehot_default", "construct", {"ctor": ctor("OneHot", n=4)})
    c("construct_binary_n", "construct", {"ctor": ctor("Binary", n=3)})
    c("construct_binary_shape_only", "construct", {"ctor": ctor("Binary", shape=[2, 3])})
    c(
        "construct_bounded_scalar_bounds",
        "construct",
        {"ctor": ctor("Bounded", low=-1, high=1, shape=[2])},
    )
    c(
        "construct_bounded_tensor_bounds_infer_shape",
        "construct",
        {"ctor": ctor("Bounded", low=T([0.0, -1.0]), high=T([1.0, 2.0]))},
    )
    c(
        "construct_bounded_int_dtype",
        "construct",
        {"ctor": ctor("Bounded", low=0, high=5, shape=[3], dtype="int64")},
    )
    c("construct_multicategorical", "construct", {"ctor": ctor("MultiCategorical", nvec=[3, 4])})
    c("construct_multionehot", "construct", {"ctor": ctor("MultiOneHot", nvec=[2, 3])})
    c(
        "construct_composite_nested",
        "construct",
        {
            "ctor": ctor(
                "Composite",
                shape=[3],
                entries={
                    "obs": Bounded(-1, 1, (3, 2)),
                    "none": None,
                    "sub": Composite(act=Categorical(4, (3,)), shape=(3,)),
                },
            )
        },
    )
    c(
        "construct_error_bounded_no_shape",
        "construct",
        {"ctor": ctor("Bounded", low=-1, high=1)},
        error=True,
        facts=["shape"],
    )
    c(
        "construct_error_bounded_maximum_removed",
        "construct",
        {"ctor": ctor("Bounded", low=-1, high=1, shape=[1], maximum=3)},
        error=True,
        facts=["maximum", "high"],
    )
    c(
        "construct_error_onehot_last_dim",
        "construct",
        {"ctor": ctor("OneHot", n=4, shape=[3])},
        error=True,
        facts=["n=4", "[3]"],
    )
    c(
        "construct_error_binary_last_dim",
        "construct",
        {"ctor": ctor("Binary", n=3, shape=[4])},
        error=True,
        facts=["n=3", "[4]"],
    )
    c(
        "construct_error_composite_child_shape",
        "construct",
        {"ctor": ctor("Composite", shape=[3], entries={"a": Unbounded((2,))})},
        error=True,
        facts=["[2]", "[3]"],
    )

    # is_in
    b = Bounded(-1.0, 1.0, (2,))
    c("is_in_bounded_true", "is_in", {"spec": b, "value": T([-1.0, 0.5])})
    c("is_in_bounded_out_of_range", "is_in", {"spec": b, "value": T([-1.0, 1.5])})
    c("is_in_bounded_wrong_dtype", "is_in", {"spec": b, "value": T([0.0, 0.0], dtype=torch.float64)})
    c("is_in_bounded_batched_value", "is_in", {"spec": b, "value": torch.zeros(4, 2)})
    c("is_in_categorical_true", "is_in", {"spec": Categorical(3), "value": T(2)})
    c("is_in_categorical_out_of_range", "is_in", {"spec": Categorical(3), "value": T(3)})
    c(
        "is_in_categorical_int32_false",
        "is_in",
        {"spec": Categorical(3), "value": T(1, dtype=torch.int32)},
    )
    c("is_in_onehot_true", "is_in", {"spec": OneHot(3), "value": T([False, True, False])})
    c("is_in_onehot_two_hot_false", "is_in", {"spec": OneHot(3), "value": T([True, True, False])})
    c(
        "is_in_binary_value_2_false",
        "is_in",
        {"spec": Binary(3), "value": T([0, 1, 2], dtype=torch.int8)},
    )
    c("is_in_multicategorical_true", "is_in", {"spec": MultiCategorical([3, 4]), "value": T([2, 3])})
    c("is_in_multicategorical_false", "is_in", {"spec": MultiCategorical([3, 4]), "value": T([3, 3])})
    c(
        "is_in_multionehot_false",
        "is_in",
        {"spec": MultiOneHot([2, 3]), "value": T([True, True, False, True, False])},
    )
    c("is_in_unbounded_broadcast_true", "is_in", {"spec": Unbounded(1), "value": torch.zeros(3)})
    c(
        "is_in_unbounded_wrong_dtype",
        "is_in",
        {"spec": Unbounded(2), "value": torch.zeros(2, dtype=torch.float64)},
    )
    c(
        "is_in_error_unbounded_not_broadcastable",
        "is_in",
        {"spec": Unbounded(2), "value": torch.zeros(3)},
        error=True,
        facts=["3", "[2]"],
    )
    comp = Composite(a=Bounded(0.0, 1.0, (3,)), b=Categorical(2, (3, 2)), shape=(3,))
    c(
        "is_in_composite_true_extra_key_ignored",
        "is_in",
        {
            "spec": comp,
            "value": TensorDict(
                {"a": T([0.0, 0.5, 1.0]), "b": torch.zeros(3, 2, dtype=torch.int64), "extra": ar(3)},
                [3],
            ),
        },
    )
    c(
        "is_in_composite_false",
        "is_in",
        {
            "spec": comp,
            "value": TensorDict(
                {"a": T([0.0, 0.5, 2.0]), "b": torch.zeros(3, 2, dtype=torch.int64)}, [3]
            ),
        },
    )
    c(
        "is_in_error_composite_missing_key",
        "is_in",
        {"spec": comp, "value": TensorDict({"a": T([0.0, 0.5, 1.0])}, [3])},
        error=True,
        facts=["b"],
    )

    # project
    c("project_bounded_clamp", "project", {"spec": b, "value": T([-3.0, 2.0])})
    c("project_bounded_batched", "project", {"spec": b, "value": T([[-3.0, 0.5], [2.0, 0.25]])})
    c(
        "project_categorical_round_clamp",
        "project",
        {"spec": Categorical(3, (3,)), "value": T([5, -1, 1])},
    )
    c(
        "project_categorical_float_value_into_int_spec",
        "project",
        {"spec": Categorical(3, (2,)), "value": T([1.6, 5.0])},
    )
    c(
        "project_categorical_float_dtype_keeps_value",
        "project",
        {"spec": Categorical(3, dtype=torch.float32), "value": T(1.6)},
    )
    c(
        "project_composite_only_leaves_not_in",
        "project",
        {
            "spec": Composite(a=Bounded(0.0, 1.0, (2,)), b=Bounded(0.0, 1.0, (2,))),
            "value": TensorDict({"a": T([0.25, 0.75]), "b": T([-1.0, 3.0])}, []),
        },
    )

    # zero / one
    c("zero_unbounded_with_shape", "zero", {"spec": Unbounded(2), "shape": [3]})
    c("zero_bounded_ignores_bounds", "zero", {"spec": Bounded(2.0, 3.0, (2,)), "shape": []})
    c(
        "one_bounded_int",
        "one",
        {"spec": Bounded(2, 5, (2,), dtype=torch.int64), "shape": []},
    )
    c("one_categorical_shape", "one", {"spec": Categorical(3), "shape": [2]})
    c("one_onehot_is_all_true", "one", {"spec": OneHot(3), "shape": []})
    c("zero_onehot", "zero", {"spec": OneHot(3), "shape": [2]})
    c("one_binary", "one", {"spec": Binary(3), "shape": []})
    c("zero_composite_with_shape_skips_none", "zero", {
        "spec": Composite(
            a=Bounded(0.0, 1.0, (2, 3)),
            skip=None,
            n=Composite(x=OneHot(4, (2, 4)), shape=(2,)),
            shape=(2,),
        ),
        "shape": [5],
    })
    c("one_composite", "one", {"spec": comp, "shape": []})

    # expand
    c("expand_bounded_prepend", "expand", {"spec": Bounded(0.0, 1.0, (2,)), "shape": [3, 2]})
    c("expand_bounded_singleton", "expand", {"spec": Bounded(0.0, 1.0, (1, 2)), "shape": [3, 2]})
    c("expand_onehot", "expand", {"spec": OneHot(4, (3, 4)), "shape": [2, 3, 4]})
    c(
        "expand_error_unbounded_trailing",
        "expand",
        {"spec": Unbounded((2,)), "shape": [3, 4]},
        error=True,
        facts=["(3, 4)"],
    )
    comp5 = Composite(
        a=Bounded(0.0, 1.0, (5, 10)),
        b=Categorical(3, (5,)),
        n=Composite(x=OneHot(4, (5, 4)), shape=(5,)),
        shape=(5,),
    )
    c("expand_composite", "expand", {"spec": comp5, "shape": [4, 5]})
    c(
        "expand_error_composite",
        "expand",
        {"spec": comp5, "shape": [4, 6]},
        error=True,
        facts=["(4, 6)"],
    )

    # index (spec[idx])
    c("index_composite_int", "index", {"spec": comp5, "index": (0,)})
    c("index_composite_slice", "index", {"spec": comp5, "index": (slice(1, 3),)})
    c("index_onehot_keeps_last_dim", "index", {"spec": OneHot(4, (5, 4)), "index": (0,)})
    c("index_categorical_tensor", "index", {"spec": Categorical(3, (5,)), "index": (T([0, 2]),)})
    c(
        "index_categorical_mask",
        "index",
        {"spec": Categorical(3, (5,)), "index": (T([True, False, True, False, True]),)},
    )
    c("index_categorical_none", "index", {"spec": Categorical(3, (5,)), "index": (None,)})
    c(
        "index_bounded_tensor_bounds",
        "index",
        {"spec": Bounded(ar(2, 3), ar(2, 3, start=10)), "index": (1,)},
    )
    c(
        "index_multicategorical_row",
        "index",
        {"spec": MultiCategorical([3, 4], (5, 2)), "index": (0,)},
    )
    c(
        "index_error_onehot_last_dim",
        "index",
        {"spec": OneHot(4, (5, 4)), "index": (0, 1)},
        error=True,
        facts=[],
    )
    c(
        "index_error_onehot_unbatched",
        "index",
        {"spec": OneHot(4), "index": (0,)},
        error=True,
        facts=["0"],
    )

    # squeeze / unsqueeze
    c("squeeze_all", "squeeze", {"spec": Bounded(0.0, 1.0, (2, 1)), "dim": None})
    c("squeeze_neg_dim", "squeeze", {"spec": Bounded(0.0, 1.0, (1, 2, 1)), "dim": -1})
    c("squeeze_noop_non_singleton", "squeeze", {"spec": Bounded(0.0, 1.0, (2, 1)), "dim": 0})
    c("unsqueeze_front", "unsqueeze", {"spec": OneHot(4), "dim": 0})
    c("unsqueeze_neg", "unsqueeze", {"spec": Categorical(3, (2,)), "dim": -1})
    c("unsqueeze_composite_neg", "unsqueeze", {"spec": comp5, "dim": -1})
    c(
        "unsqueeze_error_onehot_last",
        "unsqueeze",
        {"spec": OneHot(4), "dim": -1},
        error=True,
        facts=["OneHot"],
    )

    # encode
    c("encode_onehot_int", "encode", {"spec": OneHot(4), "value": 2})
    c("encode_onehot_list", "encode", {"spec": OneHot(3, (2, 3)), "value": [2, 0]})
    c("encode_categorical", "encode", {"spec": Categorical(3), "value": 2})
    c("encode_bounded_no_range_check", "encode", {"spec": b, "value": [3.0, 0.0]})
    c(
        "encode_error_categorical_shape",
        "encode",
        {"spec": Categorical(3), "value": [1, 2]},
        error=True,
        facts=["[2]", "[]"],
    )

    # to_one_hot / to_categorical
    c("to_one_hot", "to_one_hot", {"spec": Categorical(3, (2,)), "value": T([0, 2])})
    c(
        "to_categorical",
        "to_categorical",
        {"spec": OneHot(3, (2, 3)), "value": T([[True, False, False], [False, False, True]])},
    )

    # eq
    c("eq_equal", "eq", {"spec": Unbounded((2,)), "other": Unbounded((2,))})
    c("eq_dtype_differs", "eq", {"spec": Unbounded((2,)), "other": Unbounded((2,), dtype=torch.float64)})
    c("eq_shape_differs", "eq", {"spec": Unbounded((2,)), "other": Unbounded((3,))})
    c("eq_class_differs", "eq", {"spec": Unbounded((2,)), "other": Bounded(-1.0, 1.0, (2,))})
    c("eq_bounds_differ", "eq", {"spec": b, "other": Bounded(-1.0, 2.0, (2,))})
    c("eq_categorical_n_differs", "eq", {"spec": Categorical(3), "other": Categorical(4)})
    c("eq_composite_equal", "eq", {"spec": comp5, "other": comp5})
    c(
        "eq_composite_keys_differ",
        "eq",
        {"spec": Composite(a=Unbounded(1)), "other": Composite(b=Unbounded(1))},
    )
    c(
        "eq_composite_shape_differs",
        "eq",
        {
            "spec": Composite(a=Unbounded((3, 2)), shape=(3,)),
            "other": Composite(a=Unbounded((3, 2))),
        },
    )

    # stack
    c("stack_identical_dense", "stack", {"specs": [b, b], "dim": 0})
    c("stack_identical_last_dim", "stack", {"specs": [b, b], "dim": -1})
    c("stack_composite_dense", "stack", {"specs": [comp, comp], "dim": 0})
    c(
        "stack_error_dtypes_differ",
        "stack",
        {"specs": [Unbounded((2,)), Unbounded((2,), dtype=torch.float64)], "dim": 0},
        error=True,
        facts=["Dtypes differ", "float32", "float64"],
    )
    c(
        "stack_error_classes_differ",
        "stack",
        {"specs": [Unbounded((2,)), Bounded(0.0, 1.0, (2,))], "dim": 0},
        error=True,
        facts=[],
    )
    c(
        "stack_error_ndims_differ",
        "stack",
        {"specs": [Unbounded((2,)), Unbounded((2, 3))], "dim": 0},
        error=True,
        facts=["Ndims differ", "1", "2"],
    )

    # keys / is_empty
    c("keys_top", "keys", {"spec": comp5, "include_nested": False, "leaves_only": False})
    c("keys_nested", "keys", {"spec": comp5, "include_nested": True, "leaves_only": False})
    c("keys_nested_leaves", "keys", {"spec": comp5, "include_nested": True, "leaves_only": True})
    c("is_empty_nested_empty_not_recursive", "is_empty", {"spec": Composite(a=Composite()), "recurse": False})
    c("is_empty_nested_empty_recursive", "is_empty", {"spec": Composite(a=Composite()), "recurse": True})
    # documented to be True with recurse=True, but 0.14.1 falls through to
    # len(self._specs) == 0 and returns False
    c("is_empty_only_none_recursive", "is_empty", {"spec": Composite(a=None), "recurse": True})
    c("is_empty_true", "is_empty", {"spec": Composite(), "recurse": False})
    c("is_empty_true_recursive", "is_empty", {"spec": Composite(), "recurse": True})
    c("is_empty_false", "is_empty", {"spec": comp, "recurse": True})

    # rand_is_in
    c("rand_is_in_bounded", "rand_is_in", {"spec": b, "shape": [4]})
    c("rand_is_in_bounded_int", "rand_is_in", {"spec": Bounded(2, 5, (3,), dtype=torch.int64), "shape": []})
    c("rand_is_in_categorical", "rand_is_in", {"spec": Categorical(3, (2,)), "shape": [5]})
    c("rand_is_in_onehot", "rand_is_in", {"spec": OneHot(4), "shape": [2, 3]})
    c("rand_is_in_binary", "rand_is_in", {"spec": Binary(3), "shape": []})
    c("rand_is_in_multionehot", "rand_is_in", {"spec": MultiOneHot([2, 3]), "shape": [2]})
    c("rand_is_in_composite", "rand_is_in", {"spec": comp5, "shape": [2]})

    return r.cases


# --------------------------------------------------------------------------


def write(path, cases):
    versions = {
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "tensordict": tensordict.__version__,
        "numpy": numpy.__version__,
        "python": "%d.%d.%d" % sys.version_info[:3],
    }
    head = json.dumps({"generator": GENERATOR, "versions": versions})
    assert head.endswith("}")
    lines = [head[:-1] + ', "cases": [']
    for i, case in enumerate(cases):
        sep = "," if i + 1 < len(cases) else ""
        lines.append(json.dumps(case, allow_nan=False, separators=(",", ":")) + sep)
    lines.append("]}")
    text = "\n".join(lines) + "\n"
    json.loads(text)  # sanity
    with open(path, "w") as f:
        f.write(text)
    nerr = sum("error" in case["expect"] for case in cases if isinstance(case["expect"], dict))
    print(f"wrote {path}: {len(cases)} cases ({nerr} errors)")


def self_check():
    """Encoders and decoders must be inverse of each other."""
    for td in (td_flat(), td_nested(), td_2d(), td_scalar()):
        e = enc_td(td)
        assert enc_td(dec_td(e)) == e
    for s in (
        Unbounded(2),
        Bounded(-1, 1, (2,)),
        Bounded(0, 5, (3,), dtype=torch.int64),
        Categorical(3, mask=torch.tensor([True, False, True])),
        OneHot(4, (2, 4)),
        Binary(3, (2, 3)),
        MultiCategorical([3, 4], (5, 2)),
        MultiOneHot([2, 3]),
        Composite(a=Unbounded((3, 1)), b=None, c=Composite(d=OneHot(2, (3, 2)), shape=(3,)), shape=(3,)),
    ):
        e = enc_spec(s)
        d = dec_spec(e)
        assert enc_spec(d) == e, e
        assert bool(d == s), (d, s)


def main():
    self_check()
    write(os.path.join(HERE, "tensordict_cases.json"), tensordict_cases())
    write(os.path.join(HERE, "spec_cases.json"), spec_cases())


if __name__ == "__main__":
    main()
