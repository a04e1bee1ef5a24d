//! `modules::llm::nn::with_init_seed`: the layer kit's random initial weights drawn from a
//! seeded generator of the building thread. The same seed builds bitwise the same models on
//! four threads at once while a fifth reseeds and draws from libtorch's global generator; a
//! different seed builds other weights; a nested scope leaves the outer generator where it
//! was (on return and on unwind); and the scope is seen only inside it, on its own thread.
//!
//! No test here relies on libtorch's global generator, so the noise thread needs no lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::nn::{init_is_seeded, with_init_seed};
use torchrl::modules::llm::{
    CausalLmConfig, CausalLmWithHydraValueHead, CausalLmWithIlqlHeads, CausalLmWithScoreHead,
    Gpt2Config, Gpt2Model, LoraConfig,
};
use torchrl::trainers::config::ModelConfig;
use torchrl::trainers::policy::hydra_policy;

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{byte_gpt2, byte_qwen3};

/// Named tensors, sorted by name.
type Named = Vec<(String, Tensor)>;

/// Each model's label and its parameters (every store it owns).
type Models = Vec<(&'static str, Named)>;

/// Copies of `stores`' variables, each name prefixed with its store's label, sorted by name.
fn named(stores: &[(&str, &VarStore)]) -> Named {
    let mut out: Named = stores
        .iter()
        .flat_map(|(label, vs)| {
            vs.variables()
                .into_iter()
                .map(move |(n, t)| (format!("{label}/{n}"), t.detach().copy()))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// One of each: a GPT-2 hydra policy (value head, a one-block reference branch), a
/// Qwen3-shaped model, GPT-2 with ILQL heads (and their target copies), a Qwen3-shaped score
/// model, and a Qwen3-shaped hydra policy with LoRA adapters on every linear layer. Built
/// under `with_init_seed(seed)`, one scope for all of them.
fn build_all(seed: u64) -> Models {
    with_init_seed(seed, || {
        assert!(init_is_seeded());
        let mut out = Models::new();

        let vs = VarStore::new(Device::Cpu);
        let m = CausalLmWithHydraValueHead::new(&vs.root(), &byte_gpt2(), 1).unwrap();
        out.push((
            "gpt2 hydra",
            named(&[("policy", &vs), ("reference", m.reference_store())]),
        ));

        let vs = VarStore::new(Device::Cpu);
        let _m = byte_qwen3().build(&vs.root()).unwrap();
        out.push(("qwen3", named(&[("model", &vs)])));

        let vs = VarStore::new(Device::Cpu);
        let m = CausalLmWithIlqlHeads::from_model(
            &vs.root(),
            Gpt2Model::new(&vs.root(), &byte_gpt2()).unwrap(),
            true,
            0.5,
        )
        .unwrap();
        out.push((
            "gpt2 ilql",
            named(&[("model", &vs), ("target", m.heads().target_store())]),
        ));

        let vs = VarStore::new(Device::Cpu);
        let _m = CausalLmWithScoreHead::new(&vs.root(), &byte_qwen3()).unwrap();
        out.push(("qwen3 score", named(&[("model", &vs)])));

        let vs = VarStore::new(Device::Cpu);
        let config = ModelConfig {
            peft_config: Some(LoraConfig::new(4).with_lora_alpha(16.0).with_all_linear()),
            ..ModelConfig::default()
        };
        let m = hydra_policy(&vs.root(), byte_qwen3().build(&vs.root()).unwrap(), &config).unwrap();
        assert!(m.reference_is_adapters_off());
        out.push(("qwen3 lora", named(&[("policy", &vs)])));
        out
    })
}

/// The tensor's bits (integers of its width), so that equality is bitwise.
fn bits(t: &Tensor) -> Tensor {
    match t.kind() {
        Kind::Float => t.view_dtype(Kind::Int),
        Kind::Double => t.view_dtype(Kind::Int64),
        Kind::BFloat16 | Kind::Half => t.view_dtype(Kind::Int16),
        _ => t.shallow_clone(),
    }
}

fn bitwise_equal(a: &Tensor, b: &Tensor) -> bool {
    a.kind() == b.kind() && a.size() == b.size() && bits(a).equal(&bits(b))
}

fn assert_same(a: &Named, b: &Named, what: &str) {
    let names = |n: &Named| n.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(a), names(b), "{what}: parameter names");
    for ((n, x), (_, y)) in a.iter().zip(b) {
        assert!(bitwise_equal(x, y), "{what}: {n} differs");
    }
}

/// Whether a parameter was drawn: the kit's constant inits are all zeros (linear biases, LoRA
/// `B`) or all ones (norm weights); the MLP heads draw their biases too.
fn is_drawn(t: &Tensor) -> bool {
    let all = |v: f64| t.eq(v).all().int64_value(&[]) == 1;
    !all(0.0) && !all(1.0)
}

/// Every drawn parameter of `a` differs from `b`'s, and there is one whose name contains
/// each of `needles`; the constant ones (biases, norms, LoRA `B`) are equal.
fn assert_drawn_differ(a: &Named, b: &Named, what: &str, needles: &[&str]) {
    assert_eq!(a.len(), b.len(), "{what}");
    let mut drawn = Vec::new();
    for ((n, x), (m, y)) in a.iter().zip(b) {
        assert_eq!(n, m, "{what}");
        if is_drawn(x) {
            assert!(!x.equal(y), "{what}: {n} is the same under another seed");
            drawn.push(n.as_str());
        } else {
            assert!(bitwise_equal(x, y), "{what}: constant {n} differs");
        }
    }
    for needle in needles {
        assert!(
            drawn.iter().any(|n| n.contains(needle)),
            "{what}: no drawn parameter named *{needle}*: {drawn:?}"
        );
    }
}

#[test]
fn the_same_seed_builds_the_same_models_on_four_threads_beside_the_global_generator() {
    assert!(!init_is_seeded());
    // the fifth thread: reseeds libtorch's global generator and draws from it until told to
    // stop, so that a build still drawing from it would see other values on each thread
    let stop = Arc::new(AtomicBool::new(false));
    let draws = Arc::new(AtomicU64::new(0));
    let noise = {
        let (stop, draws) = (stop.clone(), draws.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let n = draws.fetch_add(1, Ordering::Relaxed);
                if n % 16 == 0 {
                    tch::manual_seed(n as i64);
                }
                let _ = Tensor::randn([64, 64], (Kind::Float, Device::Cpu));
            }
        })
    };
    while draws.load(Ordering::Relaxed) == 0 {
        std::thread::yield_now();
    }
    let start = Arc::new(Barrier::new(4));
    let before = draws.load(Ordering::Relaxed);
    let builders: Vec<_> = (0..4)
        .map(|i| {
            let start = start.clone();
            std::thread::spawn(move || {
                assert!(!init_is_seeded());
                start.wait();
                // half the threads build seed 8 first: the order does not matter
                let (seven, eight) = if i % 2 == 0 {
                    let seven = build_all(7);
                    (seven, build_all(8))
                } else {
                    let eight = build_all(8);
                    (build_all(7), eight)
                };
                assert!(!init_is_seeded());
                (seven, eight)
            })
        })
        .collect();
    let built: Vec<(Models, Models)> = builders.into_iter().map(|h| h.join().unwrap()).collect();
    let during = draws.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    noise.join().unwrap();
    assert!(
        during > 0,
        "the global generator was not drawn from meanwhile"
    );

    // and once more on this thread, alone
    let (seven, eight) = (build_all(7), build_all(8));
    assert_eq!(seven.len(), 5);
    for (t, (s7, s8)) in built.iter().enumerate() {
        for (((label, a), (_, b)), (_, c)) in seven.iter().zip(s7).zip(s8) {
            assert!(!a.is_empty(), "{label}");
            assert_same(a, b, &format!("{label}, seed 7, thread {t}"));
            let (_, e) = eight.iter().find(|(l, _)| l == label).unwrap();
            assert_same(e, c, &format!("{label}, seed 8, thread {t}"));
        }
    }
    // another seed: every drawn weight is another, the value / score / ILQL heads and the
    // LoRA A matrices included
    let needles: [(&str, &[&str]); 5] = [
        ("gpt2 hydra", &["wte", "v_head", "reference/"]),
        ("qwen3", &["embed_tokens", "lm_head"]),
        ("gpt2 ilql", &["v_head", "q_heads", "target/"]),
        ("qwen3 score", &["score"]),
        ("qwen3 lora", &["lora_A", "v_head"]),
    ];
    for ((label, a), (needle_label, needles)) in seven.iter().zip(needles) {
        assert_eq!(*label, needle_label);
        let (_, b) = eight.iter().find(|(l, _)| l == label).unwrap();
        assert_drawn_differ(a, b, label, needles);
    }
}

/// A small GPT-2 trunk's parameters, drawn under whatever scope is active.
fn small() -> Named {
    let cfg = Gpt2Config::new(32)
        .with_n_positions(8)
        .with_n_embd(8)
        .with_n_layer(1)
        .with_n_head(2);
    let vs = VarStore::new(Device::Cpu);
    let _m = Gpt2Model::new(&vs.root(), &cfg).unwrap();
    named(&[("model", &vs)])
}

#[test]
fn a_nested_scope_restores_the_outer_generator() {
    // the outer scope builds A, then B; a nested scope between them draws from its own
    // generator, and B is the B of the same scope without the nested build
    let (a, nested, b) = with_init_seed(7, || {
        let a = small();
        let nested = with_init_seed(99, || {
            assert!(init_is_seeded());
            small()
        });
        assert!(init_is_seeded(), "the outer scope is still on");
        (a, nested, small())
    });
    assert!(!init_is_seeded());
    let (a2, b2) = with_init_seed(7, || (small(), small()));
    assert_same(&a, &a2, "A");
    assert_same(&b, &b2, "B after a nested scope");
    // B is not A drawn again (the outer generator moved on, it was not restarted) nor the
    // nested generator's continuation
    assert_drawn_differ(&a, &b, "A vs B", &["wte"]);
    // the nested scope drew what a scope of its seed draws first
    assert_same(&nested, &with_init_seed(99, small), "nested");
    assert_drawn_differ(&nested, &b, "nested vs B", &["wte"]);

    // the same when the nested scope unwinds halfway
    let (a3, b3) = with_init_seed(7, || {
        let a = small();
        let caught = std::panic::catch_unwind(|| {
            with_init_seed::<()>(99, || {
                let _ = small();
                panic!("a build fails inside the nested scope (expected by the test)");
            })
        });
        assert!(caught.is_err());
        assert!(
            init_is_seeded(),
            "the outer scope is still on after the unwind"
        );
        (a, small())
    });
    assert_same(&a3, &a2, "A (unwind)");
    assert_same(&b3, &b2, "B after a nested scope unwound");
    assert!(!init_is_seeded());
}

#[test]
fn init_is_seeded_only_inside_a_scope_and_on_its_thread() {
    assert!(!init_is_seeded());
    with_init_seed(3, || {
        assert!(init_is_seeded());
        // another thread has no scope
        let other = std::thread::spawn(init_is_seeded).join().unwrap();
        assert!(!other);
        assert!(init_is_seeded());
    });
    assert!(!init_is_seeded());
    // a scope left by unwinding is off too
    let caught = std::panic::catch_unwind(|| {
        with_init_seed::<()>(3, || {
            panic!("unwinding out of a scope (expected by the test)")
        })
    });
    assert!(caught.is_err());
    assert!(!init_is_seeded());
}
