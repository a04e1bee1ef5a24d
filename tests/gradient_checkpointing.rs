//! Gradient checkpointing per block (`modules::llm::nn::checkpoint`) gives the gradients of the
//! plain backward: on GPT-2 and a Qwen3-shaped model, with LoRA adapters, through a hydra
//! head that captures a block's input, and through a whole trainer run.

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::lora::inject_adapter;
use torchrl::modules::llm::models::llama::LlamaConfig;
use torchrl::modules::llm::nn::checkpoint::{backward_pending, pending};
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{
    ByteTokenizer, CausalLm, CausalLmConfig, CausalLmWithHydraValueHead, Gpt2Config, LmInput,
    LoraConfig,
};
use torchrl::trainers::api::Callbacks;
use torchrl::trainers::config::ModelConfig;
use torchrl::trainers::grpo::{GrpoTrainer, GrpoTrlConfig};
use torchrl::trainers::policy::hydra_policy;
use torchrl::Generator;

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{byte_qwen3_with, gen_kwargs, lowercase_env_on};

/// The byte-tokenizer Qwen3-shaped model with 3 blocks.
fn qwen3() -> LlamaConfig {
    byte_qwen3_with(3, 0.1)
}

fn gpt2() -> Gpt2Config {
    Gpt2Config::new(40)
        .with_n_layer(3)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(16)
}

fn ids_and_mask() -> (Tensor, Tensor) {
    let ids = Tensor::from_slice(&[0i64, 0, 5, 7, 9, 3, 1, 2, 4, 6, 8, 10]).view([2, 6]);
    let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 6]);
    (ids, mask)
}

/// Every parameter's gradient (adapters included) after `loss(model)`'s backward, then zeroed.
fn grads(model: &dyn CausalLm, loss: impl Fn(&dyn CausalLm) -> Tensor) -> Vec<(String, Tensor)> {
    loss(model).backward();
    backward_pending().unwrap();
    assert_eq!(pending(), 0);
    let mut out = Vec::new();
    for (n, p) in model
        .named_parameters()
        .into_iter()
        .chain(model.adapter_parameters())
    {
        if p.requires_grad() {
            let g = p.grad();
            assert!(g.defined(), "{n} got no gradient");
            out.push((n, g.copy()));
            let _ = g.shallow_clone().zero_();
        }
    }
    out
}

fn assert_same(a: &[(String, Tensor)], b: &[(String, Tensor)]) {
    assert_eq!(a.len(), b.len());
    for ((n, x), (_, y)) in a.iter().zip(b) {
        let d = (x - y).abs().max().double_value(&[]);
        let scale = x.abs().max().double_value(&[]).max(1e-12);
        assert!(d <= 1e-5 * scale.max(1.0), "{n}: {d} (scale {scale})");
        assert!(
            scale > 0.0 || n.contains("lora_A"),
            "{n} has a zero gradient"
        );
    }
}

fn logits_loss(model: &dyn CausalLm) -> Tensor {
    let (ids, mask) = ids_and_mask();
    let logits = model
        .forward(&LmInput::new(&ids).with_attention_mask(&mask), None)
        .unwrap()
        .logits()
        .unwrap();
    logits
        .log_softmax(-1, Kind::Float)
        .select(2, 3)
        .mean(Kind::Float)
        + logits.pow_tensor_scalar(2).mean(Kind::Float)
}

#[test]
fn checkpointed_gradients_equal_the_plain_ones() {
    for which in ["gpt2", "qwen3"] {
        let vs = VarStore::new(Device::Cpu);
        let mut model: Box<dyn CausalLm> = with_init_seed(1, || match which {
            "gpt2" => gpt2().build(&vs.root()),
            _ => qwen3().build(&vs.root()),
        })
        .unwrap();
        let plain = grads(model.as_ref(), logits_loss);
        model.gradient_checkpointing_enable();
        // the forward kept a segment; the loss's own backward reaches no block parameter
        // until the second phase runs
        let loss = logits_loss(model.as_ref());
        assert_eq!(pending(), 1, "{which}");
        loss.backward();
        let block_param = model.decoder().blocks()[1].named_parameters()[0].1.grad();
        assert!(
            !block_param.defined() || block_param.abs().sum(Kind::Double).double_value(&[]) == 0.0
        );
        torchrl::modules::llm::nn::checkpoint::clear_pending();
        for (_, p) in model.named_parameters() {
            let g = p.grad();
            if g.defined() {
                let _ = g.shallow_clone().zero_();
            }
        }
        let ckpt = grads(model.as_ref(), logits_loss);
        assert_same(&plain, &ckpt);
        // without grad nothing is kept
        let _ = tch::no_grad(|| logits_loss(model.as_ref()));
        assert_eq!(pending(), 0, "{which}");
    }
}

#[test]
fn checkpointed_lora_gradients_equal_the_plain_ones() {
    let vs = VarStore::new(Device::Cpu);
    let mut model = with_init_seed(2, || {
        let mut model = qwen3().build(&vs.root())?;
        inject_adapter(
            model.as_mut(),
            &(vs.root() / "lora"),
            &LoraConfig::new(2).with_all_linear(),
        )?;
        Ok::<_, torchrl::Error>(model)
    })
    .unwrap();
    // B = 0 at init would leave A without gradient: move B first (normal values of a seeded
    // generator of this test, not libtorch's global one)
    let mut rng = Generator::new(2);
    for (n, b) in model.adapter_parameters() {
        if n.ends_with("lora_B.weight") {
            let noise = rng
                .normal(&b.size(), 0.0, 0.1, b.kind(), b.device())
                .unwrap();
            tch::no_grad(|| {
                b.shallow_clone().copy_(&noise);
            });
        }
    }
    let plain = grads(model.as_ref(), logits_loss);
    assert_eq!(plain.len(), 3 * 7 * 2);
    model.gradient_checkpointing_enable();
    assert_same(&plain, &grads(model.as_ref(), logits_loss));
}

#[test]
fn checkpointed_hydra_forward_matches_with_a_captured_block() {
    let vs = VarStore::new(Device::Cpu);
    let hydra = with_init_seed(3, || {
        CausalLmWithHydraValueHead::from_model(&vs.root(), qwen3().build(&vs.root())?, 2)
    })
    .unwrap();
    let (ids, mask) = ids_and_mask();
    let loss = |h: &CausalLmWithHydraValueHead| -> Tensor {
        let out = h
            .forward(&LmInput::new(&ids).with_attention_mask(&mask))
            .unwrap();
        (out.logits.log_softmax(-1, Kind::Float) - out.ref_logits.log_softmax(-1, Kind::Float))
            .pow_tensor_scalar(2)
            .mean(Kind::Float)
            + out.values.pow_tensor_scalar(2).mean(Kind::Float)
    };
    let collect = |h: &CausalLmWithHydraValueHead| -> Vec<(String, Tensor)> {
        h.policy()
            .named_parameters()
            .into_iter()
            .filter(|(_, p)| p.requires_grad())
            .map(|(n, p)| {
                let g = p.grad().copy();
                let _ = p.grad().zero_();
                (n, g)
            })
            .collect()
    };
    // the policy moves away from the reference first, so the KL-like term has a gradient
    // (normal steps from a seeded generator of this test, not libtorch's global one)
    let mut rng = Generator::new(3);
    for p in hydra.trainable_parameters() {
        let step = rng
            .normal(&p.size(), 0.0, 0.05, p.kind(), p.device())
            .unwrap();
        tch::no_grad(|| {
            let _ = p.shallow_clone().f_add_(&step).unwrap();
        });
    }
    loss(&hydra).backward();
    backward_pending().unwrap();
    let plain = collect(&hydra);
    // the same head with checkpointing (a second head, its model switched on before it is
    // wrapped, given the first head's values)
    let vs2 = VarStore::new(Device::Cpu);
    let hydra2 = with_init_seed(3, || {
        let mut m2 = qwen3().build(&vs2.root())?;
        m2.gradient_checkpointing_enable();
        CausalLmWithHydraValueHead::from_model(&vs2.root(), m2, 2)
    })
    .unwrap();
    // same values as the first head (trainable parts moved above, frozen ones equal by seed)
    tch::no_grad(|| {
        for ((_, a), (_, b)) in hydra
            .policy()
            .named_parameters()
            .into_iter()
            .zip(hydra2.policy().named_parameters())
        {
            b.shallow_clone().copy_(a);
        }
    });
    loss(&hydra2).backward();
    assert!(pending() > 0);
    backward_pending().unwrap();
    assert_same(&plain, &collect(&hydra2));
}

fn grpo(dir: &std::path::Path, checkpointing: bool) -> Vec<Tensor> {
    let mut c = GrpoTrlConfig::default();
    c.train.batch_size = 8;
    c.train.checkpoint_interval = 1000;
    c.train.checkpoint_dir = dir.display().to_string();
    c.train.seed = 3;
    c.model = ModelConfig {
        num_layers_unfrozen: -1,
        gradient_checkpointing: checkpointing,
        ..ModelConfig::default()
    };
    c.optimizer.kwargs.lr = 1e-2;
    c.method.num_generations = 4;
    c.method.num_rollouts = 8;
    c.method.chunk_size = 8;
    c.method.gen_kwargs = gen_kwargs(4);
    let vs = VarStore::new(Device::Cpu);
    let model = with_init_seed(5, || {
        hydra_policy(&vs.root(), qwen3().build(&vs.root())?, &c.model)
    })
    .unwrap();
    let env = lowercase_env_on(&qwen3(), 4, &["ab", "cd"]);
    let mut t = GrpoTrainer::new(c, model, env, Box::new(ByteTokenizer::new())).unwrap();
    let mut cb = Callbacks::new();
    for _ in 0..3 {
        t.iteration(&mut cb).unwrap();
    }
    assert_eq!(pending(), 0);
    t.model()
        .policy()
        .named_parameters()
        .into_iter()
        .map(|(_, p)| p.detach().copy())
        .collect()
}

#[test]
fn a_grpo_run_with_checkpointing_trains_as_without() {
    let dir = std::env::temp_dir().join(format!("torchrl-gc-{}", std::process::id()));
    let a = grpo(&dir, false);
    let b = grpo(&dir, true);
    let d = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    assert!(d < 1e-5, "{d}");
    let _ = std::fs::remove_dir_all(&dir);
}
