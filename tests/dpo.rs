//! DPO loss: rlhf.md §5.7 exactly, hand-derived hinge / IPO / label-smoothing / robust cases
//! (TRL 1.16 `DPOTrainer._compute_loss` formulas), the loss module, and errors.

use tch::{nn::VarStore, Device, Kind, Tensor};
use torchrl::modules::llm::{Gpt2Config, Gpt2Model, ScoreFn};
use torchrl::objectives::llm::{dpo_loss, sequence_log_probs, DpoConfig, DpoLoss, DpoLossType};
use torchrl::objectives::{LossModule, LossOutput};
use torchrl::{Error, TensorDict};

fn t(v: &[f64]) -> Tensor {
    Tensor::from_slice(v)
}

fn vec(x: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(x.to_kind(Kind::Double).view([-1])).expect("f64 vec")
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

/// rlhf.md §5.7's inputs: Δ = [2, 0].
fn case() -> (Tensor, Tensor, Tensor, Tensor) {
    (
        t(&[-10.0, -5.0]),
        t(&[-12.0, -4.0]),
        t(&[-11.0, -5.5]),
        t(&[-11.0, -4.5]),
    )
}

fn run(
    cfg: &DpoConfig,
    lengths: Option<(&Tensor, &Tensor)>,
) -> torchrl::Result<torchrl::objectives::llm::DpoLossOutput> {
    let (pc, pr, rc, rr) = case();
    dpo_loss(&pc, &pr, &rc, &rr, lengths, cfg)
}

#[test]
fn sigmoid_matches_rlhf_5_7() -> torchrl::Result<()> {
    let out = run(&DpoConfig::new(), None)?;
    close(
        &vec(&out.per_pair_loss),
        &[0.5981388694, std::f64::consts::LN_2],
        1e-9,
    );
    close(&vec(&out.loss_dpo), &[0.6456430250], 1e-9);
    close(&vec(&out.chosen_rewards), &[0.1, 0.05], 1e-12);
    close(&vec(&out.rejected_rewards), &[-0.1, 0.05], 1e-12);
    close(&vec(&out.accuracy), &[0.5], 0.0); // the tie counts as wrong
    close(&vec(&out.margin), &[0.1], 1e-12);
    close(&vec(&out.rewards_chosen), &[0.075], 1e-12);
    close(&vec(&out.rewards_rejected), &[-0.025], 1e-12);
    let names: Vec<_> = out.metrics().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "rewards/chosen",
            "rewards/rejected",
            "rewards/accuracies",
            "rewards/margins"
        ]
    );
    Ok(())
}

#[test]
fn sigmoid_gradient_flows_to_policy_only() -> torchrl::Result<()> {
    let (pc, pr, rc, rr) = case();
    let pc = pc.set_requires_grad(true);
    let rc = rc.set_requires_grad(true);
    let out = dpo_loss(&pc, &pr, &rc, &rr, None, &DpoConfig::new())?;
    out.total_loss()?.backward();
    // d/dπ_c mean(-logσ(βΔ)) = -β σ(-βΔ) / B
    let g = vec(&pc.grad());
    let s = |x: f64| 1.0 / (1.0 + (-x).exp());
    close(&g, &[-0.1 * s(-0.2) / 2.0, -0.1 * 0.5 / 2.0], 1e-12);
    assert!(!rc.grad().defined()); // the reference is detached
    assert!(!out.chosen_rewards.requires_grad());
    Ok(())
}

#[test]
fn hinge() -> torchrl::Result<()> {
    let out = run(&DpoConfig::new().with_loss_type(DpoLossType::Hinge), None)?;
    close(&vec(&out.per_pair_loss), &[0.8, 1.0], 1e-12);
    close(&vec(&out.loss_dpo), &[0.9], 1e-12);
    // β = 1: relu(1 − [2, 0]) = [0, 1]
    let out = run(
        &DpoConfig::new()
            .with_beta(1.0)
            .with_loss_type(DpoLossType::Hinge),
        None,
    )?;
    close(&vec(&out.per_pair_loss), &[0.0, 1.0], 1e-12);
    Ok(())
}

#[test]
fn ipo_is_length_normalised() -> torchrl::Result<()> {
    let cfg = DpoConfig::new().with_loss_type(DpoLossType::Ipo);
    // Δ_c = [1, 0.5], Δ_r = [−1, 0.5]; / [2, 1] and / [4, 5] → [0.5, 0.5] − [−0.25, 0.1]
    let (lc, lr) = (t(&[2.0, 1.0]), t(&[4.0, 5.0]));
    let out = run(&cfg, Some((&lc, &lr)))?;
    close(&vec(&out.per_pair_loss), &[18.0625, 21.16], 1e-9);
    close(&vec(&out.loss_dpo), &[19.61125], 1e-9);
    // lengths clamped to >= 1 (TRL's clamp(min=1)): 0 acts as 1
    let (lc0, lr1) = (t(&[0.0, 1.0]), t(&[1.0, 1.0]));
    let out = run(&cfg, Some((&lc0, &lr1)))?;
    // Δ_c − Δ_r = [2, 0]: (2 − 5)², (0 − 5)²
    close(&vec(&out.per_pair_loss), &[9.0, 25.0], 1e-9);
    // without lengths: an error
    assert!(matches!(run(&cfg, None), Err(Error::InvalidValue { .. })));
    Ok(())
}

#[test]
fn label_smoothing_cdpo_and_robust() -> torchrl::Result<()> {
    // cDPO: −0.9·logσ(0.2) − 0.1·logσ(−0.2); the tie stays ln 2
    let cfg = DpoConfig::new().with_label_smoothing(0.1);
    let out = run(&cfg, None)?;
    close(
        &vec(&out.per_pair_loss),
        &[0.6181388694, std::f64::consts::LN_2],
        1e-9,
    );
    close(&vec(&out.loss_dpo), &[0.6556430250], 1e-9);
    // TRL's robust: (−0.9·logσ(0.2) + 0.1·logσ(−0.2)) / 0.8
    let cfg = DpoConfig::new()
        .with_loss_type(DpoLossType::Robust)
        .with_label_smoothing(0.1);
    let out = run(&cfg, None)?;
    close(
        &vec(&out.per_pair_loss),
        &[0.5731388694, std::f64::consts::LN_2],
        1e-9,
    );
    // at ε = 0 both are the plain sigmoid loss
    let robust0 = run(&DpoConfig::new().with_loss_type(DpoLossType::Robust), None)?;
    close(
        &vec(&robust0.per_pair_loss),
        &[0.5981388694, std::f64::consts::LN_2],
        1e-9,
    );
    // label smoothing does not enter hinge
    let h = run(
        &DpoConfig::new()
            .with_loss_type(DpoLossType::Hinge)
            .with_label_smoothing(0.3),
        None,
    )?;
    close(&vec(&h.loss_dpo), &[0.9], 1e-12);
    Ok(())
}

#[test]
fn float32_inputs() -> torchrl::Result<()> {
    let f = |v: &[f32]| Tensor::from_slice(v);
    let out = dpo_loss(
        &f(&[-10.0, -5.0]),
        &f(&[-12.0, -4.0]),
        &f(&[-11.0, -5.5]),
        &f(&[-11.0, -4.5]),
        None,
        &DpoConfig::new(),
    )?;
    assert_eq!(out.loss_dpo.kind(), Kind::Float);
    close(&vec(&out.loss_dpo), &[0.6456430250], 1e-6);
    Ok(())
}

#[test]
fn config_and_input_errors() {
    for cfg in [
        DpoConfig::new().with_beta(0.0),
        DpoConfig::new().with_beta(f64::NAN),
        DpoConfig::new().with_beta(f64::INFINITY),
        DpoConfig::new().with_label_smoothing(-0.1),
        DpoConfig::new().with_label_smoothing(0.6),
        DpoConfig::new()
            .with_loss_type(DpoLossType::Robust)
            .with_label_smoothing(0.5),
    ] {
        let err = run(&cfg, None).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    }
    assert!(DpoConfig::new()
        .with_label_smoothing(0.5)
        .validate()
        .is_ok());
    let (pc, pr, rc, rr) = case();
    let cfg = DpoConfig::new();
    // shape mismatch ([B] vs [B, 1] would broadcast)
    let err = dpo_loss(&pc, &pr.unsqueeze(-1), &rc, &rr, None, &cfg).unwrap_err();
    assert!(err.to_string().contains("policy_rejected"), "{err}");
    // not [B]
    assert!(dpo_loss(&pc.view([1, 2]), &pr, &rc, &rr, None, &cfg).is_err());
    // integer log-probs
    let ints = Tensor::from_slice(&[1i64, 2]);
    assert!(dpo_loss(&pc, &pr, &ints, &rr, None, &cfg).is_err());
    assert!("simpo".parse::<DpoLossType>().is_err());
    assert_eq!(
        "hinge".parse::<DpoLossType>().ok(),
        Some(DpoLossType::Hinge)
    );
}

#[test]
fn sequence_log_probs_sums_completion() -> torchrl::Result<()> {
    let lp = t(&[0.0, -1.0, -2.0, -3.0, 0.0, -0.5, -0.25, 0.0]).view([2, 4]);
    let mask =
        Tensor::from_slice(&[false, false, true, true, false, true, true, false]).view([2, 4]);
    let (seq, len) = sequence_log_probs(&lp, &mask)?;
    close(&vec(&seq), &[-5.0, -0.75], 1e-12);
    close(&vec(&len), &[2.0, 2.0], 0.0);
    assert!(sequence_log_probs(&lp, &mask.view([4, 2])).is_err());
    assert!(sequence_log_probs(&lp.view([-1]), &mask.view([-1])).is_err());
    Ok(())
}

fn side(tokens: &[i64], completion: &[i64], ref_lp: f64) -> torchrl::Result<TensorDict> {
    let n = tokens.len() as i64;
    TensorDict::new([1])?
        .with("input_ids", Tensor::from_slice(tokens).view([1, n]))?
        .with(
            "attention_mask",
            Tensor::ones([1, n], (Kind::Int64, Device::Cpu)),
        )?
        .with(
            "completion_mask",
            Tensor::from_slice(completion).view([1, n]),
        )?
        .with("ref_log_probs", Tensor::from_slice(&[ref_lp]))
}

#[test]
fn module_with_closure_policy_reproduces_5_7_and_keys() -> torchrl::Result<()> {
    // log-probs = −token id, so a side's sequence log-prob is −Σ completion ids
    let policy = ScoreFn(|t: &Tensor, _m: &Tensor| Ok((t.to_kind(Kind::Double).neg(), None)));
    let mut loss = DpoLoss::new(policy);
    // two rows are two tensordicts of batch 1 here: do row 0 of §5.7 (π_c = −10, π_r = −12)
    let td = TensorDict::new([1])?
        .with("chosen", side(&[1, 4, 6], &[0, 1, 1], -11.0)?)?
        .with("rejected", side(&[9, 5, 7], &[0, 1, 1], -11.0)?)?;
    let out = loss.forward(&td)?;
    close(&vec(&out.loss_dpo), &[0.5981388694], 1e-9);
    close(&vec(&out.chosen_rewards), &[0.1], 1e-12);
    assert_eq!(loss.in_keys().len(), 8);
    assert!(loss
        .in_keys()
        .contains(&torchrl::NestedKey::from(("chosen", "ref_log_probs"))));
    // IPO in the module uses the completion lengths (2 each): ((1 + 1)/2 − 5)² = 16
    let ipo = DpoLoss::new(ScoreFn(|t: &Tensor, _m: &Tensor| {
        Ok((t.to_kind(Kind::Double).neg(), None))
    }))
    .with_config(DpoConfig::new().with_loss_type(DpoLossType::Ipo))?;
    close(&vec(&ipo.forward(&td)?.loss_dpo), &[16.0], 1e-9);
    // keys: rename the sides
    loss.set_keys(&[
        ("chosen", Some("good".into())),
        ("rejected", Some("bad".into())),
    ])?;
    let err = loss.forward(&td).unwrap_err();
    assert!(err.to_string().contains("good"), "{err}");
    let td2 = TensorDict::new([1])?
        .with("good", side(&[1, 4, 6], &[0, 1, 1], -11.0)?)?
        .with("bad", side(&[9, 5, 7], &[0, 1, 1], -11.0)?)?;
    close(&vec(&loss.forward(&td2)?.loss_dpo), &[0.5981388694], 1e-9);
    // unknown key name
    assert!(loss.set_keys(&[("nope", None)]).is_err());
    // a missing entry inside a side names the full key
    loss.set_keys(&[
        ("chosen", None),
        ("rejected", None),
        ("completion_mask", Some("cm".into())),
    ])?;
    let err = loss.forward(&td).unwrap_err();
    assert!(err.to_string().contains("cm"), "{err}");
    // a side that is a tensor
    let bad = TensorDict::new([1])?.with("chosen", t(&[0.0]))?;
    assert!(matches!(
        DpoLoss::new(ScoreFn(|t: &Tensor, _m: &Tensor| Ok((
            t.to_kind(Kind::Double),
            None
        ))))
        .forward(&bad),
        Err(Error::WrongEntryKind { .. })
    ));
    // a bad config is refused
    assert!(DpoLoss::new(ScoreFn(|t: &Tensor, _m: &Tensor| Ok((
        t.to_kind(Kind::Double),
        None
    ))))
    .with_config(DpoConfig::new().with_beta(-1.0))
    .is_err());
    Ok(())
}

#[test]
fn module_trains_gpt2() -> torchrl::Result<()> {
    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let cfg = Gpt2Config::new(16)
        .with_n_layer(1)
        .with_n_embd(8)
        .with_n_head(2)
        .with_n_positions(8);
    let model = Gpt2Model::new(&vs.root(), &cfg)?;
    let mk = |ids: &[i64]| -> torchrl::Result<TensorDict> {
        TensorDict::new([2])?
            .with("input_ids", Tensor::from_slice(ids).view([2, 4]))?
            .with(
                "attention_mask",
                Tensor::ones([2, 4], (Kind::Int64, Device::Cpu)),
            )?
            .with(
                "completion_mask",
                Tensor::from_slice(&[0i64, 0, 1, 1, 0, 0, 1, 1]).view([2, 4]),
            )?
            .with(
                "ref_log_probs",
                Tensor::zeros([2], (Kind::Float, Device::Cpu)),
            )
    };
    let td = TensorDict::new([2])?
        .with("chosen", mk(&[1, 2, 3, 4, 5, 6, 7, 8])?)?
        .with("rejected", mk(&[1, 2, 9, 10, 5, 6, 11, 12])?)?;
    let loss = DpoLoss::new(&model);
    let out = loss.forward(&td)?;
    assert_eq!(out.per_pair_loss.size(), vec![2]);
    out.total_loss()?.backward();
    let any_grad = vs
        .trainable_variables()
        .iter()
        .any(|v| v.grad().defined() && v.grad().abs().sum(Kind::Float).double_value(&[]) > 0.0);
    assert!(any_grad, "the policy must receive gradient");
    Ok(())
}
