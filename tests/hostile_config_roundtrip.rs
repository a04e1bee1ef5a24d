//! Every trainer config round-trips (issue 29): for generated configs that validate,
//! `from_toml(to_toml(c)) == c` and `from_json(to_json(c)) == c`, for the PPO, GRPO, DPO and
//! ILQL configs (one `TrlConfigOf` with four method sections). Values are drawn over their
//! whole types (u64 seeds, usize counts, any finite float, any string), not only the sane
//! ones.

use proptest::prelude::*;
use torchrl::trainers::config::{MethodConfig, TrlConfig, TrlConfigOf};
use torchrl::trainers::dpo::DpoTrlConfig;
use torchrl::trainers::grpo::GrpoTrlConfig;
use torchrl::trainers::ilql::IlqlTrlConfig;

/// Finite floats of every magnitude, and the round ones configs hold.
fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("finite", |x| x.is_finite()),
        (0u32..1000).prop_map(|x| f64::from(x) / 100.0),
        Just(0.0),
        Just(1e-300),
        Just(5e-324),
    ]
}

fn count() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..64, any::<usize>(), Just(usize::MAX)]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_/]{1,12}",
        any::<String>(),
        Just("line\nbreak \"quoted\" \\ back".to_string()),
    ]
}

#[derive(Debug, Clone)]
struct Shared {
    seed: u64,
    counts: [usize; 4],
    max_grad_norm: Option<f64>,
    floats: [f64; 6],
    strings: [String; 2],
    run_name: Option<String>,
    unfrozen: i64,
}

fn shared() -> impl Strategy<Value = Shared> {
    (
        any::<u64>(),
        [count(), count(), count(), count()],
        proptest::option::of(float()),
        [float(), float(), float(), float(), float(), float()],
        [text(), text()],
        proptest::option::of(text()),
        -2i64..40,
    )
        .prop_map(
            |(seed, counts, max_grad_norm, floats, strings, run_name, unfrozen)| Shared {
                seed,
                counts,
                max_grad_norm,
                floats,
                strings,
                run_name,
                unfrozen,
            },
        )
}

/// `base` with the shared sections (train, model, optimizer, scheduler) set from `s`.
fn apply<M: MethodConfig>(mut c: TrlConfigOf<M>, s: &Shared) -> TrlConfigOf<M> {
    let [epochs, total_steps, batch_size, eval_interval] = s.counts;
    let [lr, b1, b2, eps, t_max, eta_min] = s.floats;
    c.train.seed = s.seed;
    c.train.epochs = epochs;
    c.train.total_steps = total_steps;
    c.train.batch_size = batch_size;
    c.train.minibatch_size = None;
    c.train.eval_interval = eval_interval;
    c.train.max_grad_norm = s.max_grad_norm;
    c.train.checkpoint_dir = s.strings[0].clone();
    c.train.project_name = s.strings[1].clone();
    c.train.run_name = s.run_name.clone();
    c.model.num_layers_unfrozen = s.unfrozen;
    c.optimizer.kwargs.lr = lr;
    c.optimizer.kwargs.betas = [b1.abs() % 1.0, b2.abs() % 1.0];
    c.optimizer.kwargs.eps = eps;
    c.scheduler.kwargs.t_max = t_max;
    c.scheduler.kwargs.eta_min = eta_min;
    c
}

/// A config that validates round-trips through TOML and JSON exactly.
fn round_trips<M>(c: &TrlConfigOf<M>) -> Result<(), TestCaseError>
where
    M: MethodConfig + PartialEq + std::fmt::Debug + Clone,
    TrlConfigOf<M>: PartialEq + std::fmt::Debug,
{
    if c.validate().is_err() {
        return Ok(());
    }
    let toml = c
        .to_toml()
        .map_err(|e| TestCaseError::fail(format!("to_toml of a valid config: {e}")))?;
    let back = TrlConfigOf::<M>::from_toml_str(&toml)
        .map_err(|e| TestCaseError::fail(format!("from_toml: {e}\n{toml}")))?;
    prop_assert_eq!(&back, c, "TOML:\n{}", toml);
    let json = c
        .to_json()
        .map_err(|e| TestCaseError::fail(format!("to_json of a valid config: {e}")))?;
    let back = TrlConfigOf::<M>::from_json_str(&json)
        .map_err(|e| TestCaseError::fail(format!("from_json: {e}\n{json}")))?;
    prop_assert_eq!(&back, c, "JSON:\n{}", json);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn ppo_configs_round_trip(s in shared(), target in proptest::option::of(float()),
                              top_k in count(), kl in float()) {
        let mut c = apply(TrlConfig::default(), &s);
        c.method.target = target;
        c.method.gen_kwargs.top_k = top_k;
        c.method.init_kl_coef = kl;
        round_trips(&c)?;
    }

    #[test]
    fn grpo_dpo_ilql_configs_round_trip(s in shared()) {
        round_trips(&apply(GrpoTrlConfig::default(), &s))?;
        round_trips(&apply(DpoTrlConfig::default(), &s))?;
        round_trips(&apply(IlqlTrlConfig::default(), &s))?;
    }
}

#[test]
fn the_defaults_round_trip() {
    round_trips(&TrlConfig::default()).unwrap();
    round_trips(&GrpoTrlConfig::default()).unwrap();
    round_trips(&DpoTrlConfig::default()).unwrap();
    round_trips(&IlqlTrlConfig::default()).unwrap();
}

#[test]
fn extreme_values_round_trip() {
    let mut c = TrlConfig::default();
    c.train.seed = u64::MAX;
    c.train.epochs = usize::MAX;
    c.train.max_grad_norm = None;
    c.optimizer.kwargs.eps = 3.7444474662064577e142; // serde_json's default parser misread it
    c.optimizer.kwargs.lr = 1e300;
    c.train.run_name = Some("tab\tand \u{1F600}".into());
    c.validate().unwrap();
    round_trips(&c).unwrap();
}
