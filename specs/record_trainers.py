#!/usr/bin/env python
"""Record reference cases for the trainers' optimizer and schedule.

Run from the repository root:

    ~/.cache/torchrl-rs/venv/bin/python specs/record_trainers.py

It writes ``specs/trainers_cases.json``, replayed by ``tests/trainers_api.rs``.

Each case runs ``torch.optim.AdamW(foreach=False)`` with
``torch.optim.lr_scheduler.CosineAnnealingLR`` on fixed float32 parameters for a few steps:
per step, every parameter listed in that step's ``grads`` gets that gradient (the others keep
no gradient at all, ``p.grad is None``), then ``opt.step()``, ``scheduler.step()``. After each
step the case stores every parameter and the scheduler's ``get_last_lr()[0]``. The step order
is trlX's (``opt.step(); opt.zero_grad(); scheduler.step()``).
"""

import json
import os

import torch


def f32_list(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


def run_case(name, shapes, steps, grads_for, lr, betas, eps, weight_decay, t_max, eta_min, seed):
    g = torch.Generator().manual_seed(seed)
    params = {n: torch.randn(s, generator=g, dtype=torch.float32) for n, s in shapes.items()}
    init = {n: {"shape": list(p.shape), "values": f32_list(p)} for n, p in params.items()}
    leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
    opt = torch.optim.AdamW(
        list(leaves.values()), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False
    )
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t_max, eta_min=eta_min)
    records = []
    for step in range(steps):
        grads = {}
        for n in grads_for(step):
            grad = torch.randn(shapes[n], generator=g, dtype=torch.float32)
            leaves[n].grad = grad.clone()
            grads[n] = f32_list(grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        records.append(
            {
                "grads": grads,
                "params": {n: f32_list(p) for n, p in leaves.items()},
                "lr": sched.get_last_lr()[0],
            }
        )
    return {
        "name": name,
        "lr": lr,
        "betas": list(betas),
        "eps": eps,
        "weight_decay": weight_decay,
        "T_max": t_max,
        "eta_min": eta_min,
        "init": init,
        "steps": records,
    }


def main():
    cases = [
        # Every parameter has a gradient at every step; the schedule goes past T_max (8 > 5),
        # so the rate falls to eta_min and rises again.
        run_case(
            "two_params_past_t_max",
            {"w": [3, 4], "b": [5]},
            8,
            lambda step: ["w", "b"],
            lr=1e-2,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=1e-2,
            t_max=5,
            eta_min=1e-3,
            seed=0,
        ),
        # trlX HEAD's default_ppo_config optimizer and schedule.
        run_case(
            "trlx_defaults",
            {"w": [2, 3]},
            4,
            lambda step: ["w"],
            lr=3e-5,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=1e-6,
            t_max=1e12,
            eta_min=3e-5,
            seed=1,
        ),
        # "frozen" never gets a gradient and must stay as it was (no weight decay either).
        run_case(
            "param_without_grad",
            {"w": [4], "frozen": [2, 2]},
            5,
            lambda step: ["w"],
            lr=0.1,
            betas=(0.8, 0.99),
            eps=1e-6,
            weight_decay=0.1,
            t_max=3,
            eta_min=0.0,
            seed=2,
        ),
        # Large eps and no weight decay: eps sits outside the square root.
        run_case(
            "large_eps_no_decay",
            {"w": [6]},
            3,
            lambda step: ["w"],
            lr=0.05,
            betas=(0.5, 0.9),
            eps=0.1,
            weight_decay=0.0,
            t_max=10,
            eta_min=0.01,
            seed=3,
        ),
    ]
    out = {
        "torch": torch.__version__,
        "note": "torch.optim.AdamW(foreach=False) + CosineAnnealingLR; see specs/record_trainers.py",
        "cases": cases,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainers_cases.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
