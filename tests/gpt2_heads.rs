//! The heads on the GPT trunk: value (trlX's `make_head`), hydra reference branch, ILQL heads
//! with Polyak sync (rlhf.md §5.12), and the sequence-score reward model (scores recorded from
//! `transformers`' `GPT2ForSequenceClassification`, `specs/record_gpt2.py`).

mod common;

use std::path::PathBuf;

use common::{load_cases, tensor_from_json};
use tch::nn::{self, OptimizerConfig, VarStore};
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    batched_index_select, CausalLm, CausalLmWithHydraValueHead, CausalLmWithIlqlHeads,
    CausalLmWithScoreHead, CausalLmWithValueHead, Gpt2Config, Gpt2Model, IlqlHeads, LlmKeys,
    LmInput,
};
use torchrl::modules::TensorDictModule;
use torchrl::objectives::{LossModule, RewardModelLoss};
use torchrl::TensorDict;

fn cfg() -> Gpt2Config {
    Gpt2Config::new(37)
        .with_n_layer(4)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(16)
}

fn ids() -> (Tensor, Tensor) {
    let ids = Tensor::from_slice(&[0i64, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]).view([2, 6]);
    let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 6]);
    (ids, mask)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn value_head_is_make_head_on_the_last_hidden_state() {
    tch::manual_seed(1);
    let vs = VarStore::new(Device::Cpu);
    let policy = CausalLmWithValueHead::new(&vs.root(), &cfg()).unwrap();
    let vars = vs.variables();
    assert_eq!(vars["v_head.0.weight"].size(), vec![32, 16]);
    assert_eq!(vars["v_head.2.weight"].size(), vec![1, 32]);
    // PyTorch's nn.Linear init: |w| <= 1/sqrt(fan_in)
    assert!(vars["v_head.2.weight"].abs().max().double_value(&[]) <= 1.0 / 32f64.sqrt());
    let (ids, mask) = ids();
    let out = policy
        .forward(&LmInput::new(&ids).with_attention_mask(&mask))
        .unwrap();
    assert_eq!(out.values.size(), vec![2, 6]);
    // values by hand: relu(h W1ᵀ + b1) W2ᵀ + b2 on the last hidden state
    let h = &out.last_hidden;
    let hid = (h.matmul(&vars["v_head.0.weight"].tr()) + &vars["v_head.0.bias"]).relu();
    let v = (hid.matmul(&vars["v_head.2.weight"].tr()) + &vars["v_head.2.bias"]).squeeze_dim(-1);
    assert!(max_abs_diff(&v, &out.values) < 1e-6);
    // and the logits are the plain model's
    let plain = policy
        .model()
        .forward(&LmInput::new(&ids).with_attention_mask(&mask), None)
        .unwrap()
        .logits()
        .unwrap();
    assert!(plain.equal(&out.logits));
}

#[test]
fn hydra_reference_equals_policy_at_init_and_stays_the_reference_while_training() {
    for k in [1i64, 2, 0, -1] {
        tch::manual_seed(2);
        let vs = VarStore::new(Device::Cpu);
        let hydra = CausalLmWithHydraValueHead::new(&vs.root(), &cfg(), k).unwrap();
        let (ids, mask) = ids();
        let input = LmInput::new(&ids).with_attention_mask(&mask);
        let out = hydra.forward(&input).unwrap();
        assert!(
            out.logits.equal(&out.ref_logits),
            "k={k}: reference differs at init"
        );
        assert!(hydra.forward_hydra(&input).unwrap().equal(&out.ref_logits));
        // the reference is frozen as a whole
        for (name, t) in hydra.reference_store().variables() {
            assert!(!t.requires_grad(), "k={k}: reference {name} trains");
        }
        // frozen policy parts: embeddings and blocks below L-k (k>0), all blocks (k=0)
        let vars = vs.variables();
        let frozen_blocks = match k {
            -1 => 0,
            0 => 4,
            k => 4 - k,
        };
        for i in 0..4 {
            let t = &vars[&format!("transformer.h.{i}.attn.c_attn.weight")];
            assert_eq!(t.requires_grad(), i >= frozen_blocks, "k={k} block {i}");
        }
        assert_eq!(vars["transformer.wte.weight"].requires_grad(), k == -1);
        assert!(vars["transformer.ln_f.weight"].requires_grad());
        // memory: a branch holds k of 4 blocks (plus ln_f and the LM head)
        let (r, full) = (
            hydra.reference_parameter_bytes(),
            hydra.full_copy_parameter_bytes(),
        );
        if k > 0 {
            // per block: 2 norms (64) + c_attn (816) + attn c_proj (272) + c_fc (1088) + mlp
            // c_proj (1040) = 3280 parameters; plus ln_f (32); the LM head is the shared,
            // frozen embedding
            assert_eq!(r, (3280 * k + 32) * 4, "k={k}");
            assert!(r < full, "k={k}: {r} vs {full}");
        } else {
            assert_eq!(r, full);
        }
        // a few training steps move the policy but not the reference, and the reference still
        // equals a full frozen copy of the model taken at init
        // (a copy of the parameters, not a re-seeded init: tests share torch's global RNG)
        let vs_copy = VarStore::new(Device::Cpu);
        let snapshot = Gpt2Model::new(&vs_copy.root(), &cfg()).unwrap();
        tch::no_grad(|| {
            for ((_, dst), (_, src)) in snapshot
                .named_parameters()
                .into_iter()
                .zip(hydra.policy().model().named_parameters())
            {
                dst.shallow_clone().copy_(src);
            }
        });
        let snap_logits = snapshot.forward(&input, None).unwrap().logits().unwrap();
        assert!(snap_logits.equal(&out.ref_logits));
        let mut opt = nn::Adam::default().build(&vs, 1e-2).unwrap();
        for _ in 0..3 {
            let o = hydra.forward(&input).unwrap();
            let loss = o
                .logits
                .log_softmax(-1, Kind::Float)
                .select(2, 5)
                .mean(Kind::Float)
                .neg()
                + o.values.square().mean(Kind::Float);
            opt.backward_step(&loss);
        }
        let after = hydra.forward(&input).unwrap();
        assert!(
            max_abs_diff(&after.logits, &out.logits) > 1e-4,
            "k={k}: policy did not move"
        );
        assert!(
            max_abs_diff(&after.ref_logits, &snap_logits) < 1e-5,
            "k={k}: reference drifted by {}",
            max_abs_diff(&after.ref_logits, &snap_logits)
        );
        // trainable parameters are exactly the ones with requires_grad
        assert!(hydra
            .trainable_parameters()
            .iter()
            .all(|p| p.requires_grad()));
    }
    // bad num_layers_unfrozen names the range
    let vs = VarStore::new(Device::Cpu);
    let err = CausalLmWithHydraValueHead::new(&vs.root(), &cfg(), 5).unwrap_err();
    assert!(err.to_string().contains("num_layers_unfrozen"), "{err}");
}

#[test]
fn hydra_as_a_tensordict_module_writes_aligned_log_probs() {
    tch::manual_seed(3);
    let vs = VarStore::new(Device::Cpu);
    let hydra = CausalLmWithHydraValueHead::new(&vs.root(), &cfg(), 2).unwrap();
    let (ids, mask) = ids();
    let td = TensorDict::new([2])
        .unwrap()
        .with(("tokens", "full"), ids.shallow_clone())
        .unwrap()
        .with(("masks", "all_attention_mask"), mask.shallow_clone())
        .unwrap();
    let td = TensorDictModule::forward(&hydra, td).unwrap();
    let lp = td.get_or_err(("log_probs", "full")).unwrap();
    let ref_lp = td.get_or_err(("ref_log_probs", "full")).unwrap();
    assert_eq!(lp.size(), vec![2, 6]);
    assert!(lp.equal(ref_lp));
    // log_probs[t] = log softmax(logits[t-1])[token t]; position 0 and pads are 0
    let logits = td.get_or_err("logits").unwrap();
    let tok = ids.int64_value(&[1, 4]);
    let want = logits
        .get(1)
        .get(3)
        .log_softmax(-1, Kind::Float)
        .double_value(&[tok]);
    assert!((lp.double_value(&[1, 4]) - want).abs() < 1e-6);
    assert_eq!(lp.double_value(&[0, 0]), 0.0);
    assert_eq!(
        lp.double_value(&[0, 1]),
        0.0,
        "the first real token follows a pad"
    );
    assert!(lp.double_value(&[0, 2]) < 0.0);
    assert_eq!(
        hydra.out_keys().len(),
        4,
        "logits, log_probs, values, ref_log_probs"
    );
    // a missing mask key is named
    let td = TensorDict::new([2])
        .unwrap()
        .with(("tokens", "full"), ids)
        .unwrap();
    let err = TensorDictModule::forward(&hydra, td)
        .unwrap_err()
        .to_string();
    assert!(err.contains("all_attention_mask"), "{err}");
}

#[test]
fn ilql_heads_gather_and_polyak_sync() {
    tch::manual_seed(4);
    let vs = VarStore::new(Device::Cpu);
    let heads = IlqlHeads::new(&vs.root(), 8, 11, true, 0.001).unwrap();
    assert_eq!(heads.n_qs(), 2);
    let hs = Tensor::randn([2, 5, 8], (Kind::Float, Device::Cpu));
    let actions = Tensor::from_slice(&[0i64, 1, 2, 1, 2, 3]).view([2, 3]);
    let states = Tensor::from_slice(&[0i64, 1, 2, 3, 1, 2, 3, 4]).view([2, 4]);
    let out = heads.forward(&hs, Some(&states), Some(&actions)).unwrap();
    assert_eq!(out.qs[0].size(), vec![2, 3, 11]);
    assert_eq!(out.vs.size(), vec![2, 4, 1]);
    // gathered rows are the heads applied at those positions
    let all = heads.q_heads()[1].forward(&hs).unwrap();
    assert!(max_abs_diff(&out.qs[1].get(1).get(2), &all.get(1).get(3)) < 1e-6);
    // targets start equal and frozen
    assert!(out.qs[0].equal(&out.target_qs[0]));
    assert!(heads
        .target_store()
        .variables()
        .values()
        .all(|t| !t.requires_grad()));
    // rlhf.md §5.12: q = 1, target = 0, α = 0.001 → 0.001, then 0.001999
    tch::no_grad(|| {
        for (q, t) in heads.q_heads().iter().zip(heads.target_q_heads()) {
            for p in q.parameters() {
                let _ = p.shallow_clone().fill_(1.0);
            }
            for p in t.parameters() {
                let _ = p.shallow_clone().fill_(0.0);
            }
        }
    });
    heads.sync_target_q_heads().unwrap();
    let t = heads.target_q_heads()[0].parameters()[0].double_value(&[0, 0]);
    assert!((t - 0.001).abs() < 1e-9, "{t}");
    heads.sync_target_q_heads().unwrap();
    let t = heads.target_q_heads()[1].parameters()[3].double_value(&[0]);
    assert!((t - 0.001999).abs() < 1e-9, "{t}");
    assert!(IlqlHeads::new(&vs.root(), 8, 11, false, 1.5).is_err());
    // batched_index_select checks the index shape
    assert!(batched_index_select(&hs, &Tensor::from_slice(&[0i64])).is_err());
}

#[test]
fn ilql_model_runs_one_trunk_pass_and_writes_its_keys() {
    tch::manual_seed(5);
    let vs = VarStore::new(Device::Cpu);
    let model = Gpt2Model::new(&vs.root(), &cfg()).unwrap();
    let ilql = CausalLmWithIlqlHeads::from_model(&vs.root(), model, false, 0.005).unwrap();
    let (ids, mask) = ids();
    let td = TensorDict::new([2])
        .unwrap()
        .with(("tokens", "full"), ids)
        .unwrap()
        .with(("masks", "all_attention_mask"), mask)
        .unwrap()
        .with(
            "actions_ixs",
            Tensor::from_slice(&[2i64, 3, 4, 0, 1, 2]).view([2, 3]),
        )
        .unwrap()
        .with(
            "states_ixs",
            Tensor::from_slice(&[2i64, 3, 4, 5, 0, 1, 2, 5]).view([2, 4]),
        )
        .unwrap();
    let td = TensorDictModule::forward(&ilql, td).unwrap();
    assert_eq!(td.get_or_err("qs").unwrap().size(), vec![2, 3, 1, 37]);
    assert_eq!(td.get_or_err("vs").unwrap().size(), vec![2, 4, 1]);
    assert_eq!(td.get_or_err("logits").unwrap().size(), vec![2, 6, 37]);
    assert!(vs.variables().contains_key("ilql_heads.q_heads.0.2.weight"));
}

fn score_dir() -> PathBuf {
    [env!("CARGO_MANIFEST_DIR"), "specs", "gpt2", "score_v90"]
        .iter()
        .collect()
}

#[test]
fn score_model_matches_transformers_sequence_classification() {
    let vs = VarStore::new(Device::Cpu);
    let rm = CausalLmWithScoreHead::from_pretrained(&vs.root(), score_dir()).unwrap();
    let file = load_cases("gpt2_cases.json");
    let mut n = 0;
    for case in file.cases.iter().filter(|c| c.op == "score") {
        let ids = tensor_from_json(case.arg("input_ids").unwrap()).unwrap();
        let mask = tensor_from_json(case.arg("attention_mask").unwrap()).unwrap();
        let want = tensor_from_json(case.expect.get("scores").unwrap()).unwrap();
        let got = rm
            .forward(&LmInput::new(&ids).with_attention_mask(&mask))
            .unwrap();
        assert!(
            max_abs_diff(&got, &want) < 1e-4,
            "{}: {got} vs {want}",
            case.name
        );
        n += 1;
    }
    assert_eq!(n, 2);
    // save / load round trip
    let dir = std::env::temp_dir().join(format!("torchrl-score-{}", std::process::id()));
    rm.save_pretrained(&dir).unwrap();
    let vs2 = VarStore::new(Device::Cpu);
    let again = CausalLmWithScoreHead::from_pretrained(&vs2.root(), &dir).unwrap();
    for ((a, x), (b, y)) in rm.named_parameters().iter().zip(again.named_parameters()) {
        assert_eq!(a, &b);
        assert!(x.equal(y));
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn score_model_trains_as_the_reward_model_loss_score_network() {
    // Bradley-Terry on the GPT score head: chosen responses end with token 5, rejected with
    // token 6; a few Adam steps must raise the accuracy to 1 and lower the loss.
    tch::manual_seed(6);
    let vs = VarStore::new(Device::Cpu);
    let c = Gpt2Config::new(12)
        .with_n_layer(2)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(8);
    let keys = LlmKeys {
        input_ids: "input_ids".into(),
        attention_mask: "attention_mask".into(),
        ..LlmKeys::default()
    };
    let rm = CausalLmWithScoreHead::new(&vs.root(), &c)
        .unwrap()
        .with_keys(keys);
    let loss = RewardModelLoss::new().with_score_network(rm);
    let prompts = Tensor::from_slice(&[1i64, 2, 3, 4, 2, 3, 4, 1, 3, 4, 1, 2]).view([4, 3]);
    let side = |last: i64| {
        let ids = Tensor::cat(
            &[
                prompts.shallow_clone(),
                Tensor::full([4, 1], last, (Kind::Int64, Device::Cpu)),
            ],
            1,
        );
        TensorDict::new([4])
            .unwrap()
            .with("input_ids", ids)
            .unwrap()
            .with(
                "attention_mask",
                Tensor::ones([4, 4], (Kind::Int64, Device::Cpu)),
            )
            .unwrap()
    };
    let td = TensorDict::new([4])
        .unwrap()
        .with("chosen", side(5))
        .unwrap()
        .with("rejected", side(6))
        .unwrap();
    let first = loss.forward(&td).unwrap();
    let mut opt = nn::Adam::default().build(&vs, 3e-3).unwrap();
    for _ in 0..30 {
        let out = loss.forward(&td).unwrap();
        opt.backward_step(&out.loss_reward_model);
    }
    let last = loss.forward(&td).unwrap();
    assert!(last.loss_reward_model.double_value(&[]) < first.loss_reward_model.double_value(&[]));
    assert_eq!(last.accuracy.double_value(&[]), 1.0);
}
