//! Train a reward model from pairwise preferences with [`RewardModelLoss`] (Bradley-Terry:
//! `-log σ(r_chosen - r_rejected)`).
//!
//! The data is synthetic: each response is a feature vector, a hidden linear "true reward"
//! scores it, and of two responses the one with the higher true reward is the chosen one. The
//! scorer is an [`MLP`] wrapped as a tensordict module; the dataset names its sides
//! `"preferred"` / `"dispreferred"` and the scorer writes `"reward_score"`, so the loss's keys
//! are remapped with [`LossModule::set_keys`]. Per epoch the training loss and accuracy are
//! printed, then the accuracy on held-out pairs, which must be well above chance.
//!
//! Run: `cargo run --release --example reward_model` (a few seconds); options: `--epochs N`
//! (default 8), `--pairs N` (training pairs, default 4096), `--seed S` (default 0).

use indicatif::{ProgressBar, ProgressStyle};
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use torchrl::data::replay::{LastBatch, ReplayBuffer, SamplerWithoutReplacement};
use torchrl::modules::{MlpConfig, TdModule, MLP};
use torchrl::objectives::optim::step_with_grad_norm;
use torchrl::objectives::{LossModule, LossOutput, RewardModelLoss};
use torchrl::{Error, Generator, Result, TensorDict};

const FEATURES: i64 = 16;
const MINIBATCH: i64 = 128;
const LR: f64 = 3e-3;
/// Held-out pairs.
const TEST_PAIRS: i64 = 2048;
/// The held-out accuracy the run must reach.
const MIN_ACCURACY: f64 = 0.85;

/// The run's settings (the CLI knobs).
#[derive(Debug, Clone)]
pub struct Config {
    pub epochs: usize,
    /// Training pairs.
    pub pairs: i64,
    pub seed: u64,
    /// Print the per-epoch lines.
    pub verbose: bool,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Held-out loss and accuracy before training.
    pub initial_test_loss: f64,
    pub initial_test_accuracy: f64,
    /// Mean training loss and accuracy of each epoch.
    pub epochs: Vec<(f64, f64)>,
    /// Held-out loss and accuracy after training.
    pub test_loss: f64,
    pub test_accuracy: f64,
}

fn fail(message: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "reward_model",
        message: message.into(),
    }
}

impl Config {
    pub fn from_args() -> Result<Self> {
        let mut cfg = Config {
            epochs: 8,
            pairs: 4096,
            seed: 0,
            verbose: true,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let value = args.next();
            let value = |name: &str| -> Result<String> {
                value.ok_or_else(|| fail(format!("{name} needs a value")))
            };
            let bad = |e: std::num::ParseIntError| fail(format!("{arg}: {e}"));
            match arg.as_str() {
                "--epochs" => cfg.epochs = value("--epochs")?.parse().map_err(bad)?,
                "--pairs" => cfg.pairs = value("--pairs")?.parse().map_err(bad)?,
                "--seed" => cfg.seed = value("--seed")?.parse().map_err(bad)?,
                other => {
                    return Err(fail(format!(
                        "unknown argument {other:?} (usage: reward_model [--epochs N] \
                         [--pairs N] [--seed S])"
                    )))
                }
            }
        }
        if cfg.pairs < MINIBATCH {
            return Err(fail(format!("--pairs must be at least {MINIBATCH}")));
        }
        Ok(cfg)
    }
}

/// `n` preference pairs: two random responses each, the one the hidden `true_w` scores higher
/// under `"preferred"`, the other under `"dispreferred"`, each as `{"features": [n, F]}`.
fn make_pairs(rng: &mut Generator, true_w: &Tensor, n: i64) -> Result<TensorDict> {
    let a = rng.normal(&[n, FEATURES], 0.0, 1.0, Kind::Float, Device::Cpu)?;
    let b = rng.normal(&[n, FEATURES], 0.0, 1.0, Kind::Float, Device::Cpu)?;
    let a_wins = a
        .f_matmul(true_w)?
        .f_gt_tensor(&b.f_matmul(true_w)?)?
        .f_unsqueeze(-1)?; // [n, 1]
    let preferred = a.f_where_self(&a_wins, &b)?;
    let dispreferred = b.f_where_self(&a_wins, &a)?;
    TensorDict::new([n])?
        .with(("preferred", "features"), preferred)?
        .with(("dispreferred", "features"), dispreferred)
}

/// Trains the reward model with `cfg` and evaluates it on held-out pairs.
pub fn run(cfg: &Config) -> Result<Summary> {
    tch::manual_seed(cfg.seed as i64); // the MLP's initialisation
    tch::set_num_threads(1); // tiny matrices: intra-op threads only cost synchronisation
    let mut rng = Generator::new(cfg.seed);
    let true_w = rng.normal(&[FEATURES], 0.0, 1.0, Kind::Float, Device::Cpu)?;
    let train = make_pairs(&mut rng, &true_w, cfg.pairs)?;
    let test = make_pairs(&mut rng, &true_w, TEST_PAIRS)?;

    // The scorer: features -> one score per response, written under "reward_score" ([B, 1];
    // the loss squeezes the trailing singleton).
    let vs = nn::VarStore::new(Device::Cpu);
    let mlp = MLP::new(
        &vs.root().sub("scorer"),
        &MlpConfig::new(FEATURES, 1).with_depth(1).with_num_cells(32),
    )?;
    let scorer = TdModule::new(mlp, ["features"], ["reward_score"])?;

    let mut loss = RewardModelLoss::new()
        .with_score_network(scorer)
        .with_center_coeff(1e-3)?; // keeps the scores near 0

    // The dataset's names and the scorer's output key, by name (TorchRL's `set_keys`).
    loss.set_keys(&[
        ("chosen", Some("preferred".into())),
        ("rejected", Some("dispreferred".into())),
        ("score", Some("reward_score".into())),
    ])?;
    // An unknown name is refused, the error lists the accepted ones, and nothing changes.
    let refused = loss.set_keys(&[("reward", Some("r".into()))]);
    if refused.is_ok() {
        return Err(fail(
            "set_keys accepted a name that is not a key of the loss",
        ));
    }
    if cfg.verbose {
        println!("loss keys: {:?}", loss.tensor_keys());
        println!("loss in_keys: {:?}", loss.in_keys());
        if let Err(e) = &refused {
            println!("set_keys(reward = ...) refused: {e}");
        }
    }

    let mut opt = nn::Adam::default().build(&vs, LR)?;
    let mut buffer = ReplayBuffer::with_sampler(
        cfg.pairs,
        SamplerWithoutReplacement::new(cfg.seed, LastBatch::Drop),
    )?;
    buffer.extend(&train)?;
    let steps = cfg.pairs / MINIBATCH;

    let eval = |loss: &RewardModelLoss, td: &TensorDict| -> Result<(f64, f64)> {
        let _guard = tch::no_grad_guard();
        let out = loss.forward(td)?;
        Ok((
            out.loss_reward_model.f_double_value(&[])?,
            out.accuracy.f_double_value(&[])?,
        ))
    };
    let (initial_test_loss, initial_test_accuracy) = eval(&loss, &test)?;
    if cfg.verbose {
        println!(
            "before training: held-out loss {initial_test_loss:.4}, accuracy {:.1}%",
            100.0 * initial_test_accuracy
        );
    }
    let mut epochs = Vec::with_capacity(cfg.epochs);
    // one tick per gradient step; the per-epoch lines print above the bar
    let bar = if cfg.verbose {
        let style = ProgressStyle::with_template("[{bar:24}] step {pos:>5}/{len} | {msg}")
            .map_err(|e| fail(e.to_string()))?
            .progress_chars("#.");
        ProgressBar::new((cfg.epochs as u64) * (steps as u64)).with_style(style)
    } else {
        ProgressBar::hidden()
    };

    for epoch in 1..=cfg.epochs {
        let (mut sum_loss, mut sum_acc) = (0.0, 0.0);
        for _ in 0..steps {
            let mb = buffer.sample(MINIBATCH)?;
            let out = loss.forward(&mb)?;
            step_with_grad_norm(&mut opt, &vs, &out.total_loss()?, 1.0)?;
            let step_loss = out.loss_reward_model.f_double_value(&[])?;
            sum_loss += step_loss;
            sum_acc += out.accuracy.f_double_value(&[])?;
            bar.set_message(format!("epoch {epoch}, loss {step_loss:.4}"));
            bar.inc(1);
        }
        let n = steps as f64;
        let (mean_loss, mean_acc) = (sum_loss / n, sum_acc / n);
        if cfg.verbose {
            bar.suspend(|| {
                println!(
                    "epoch {epoch:>2}/{}: train loss {mean_loss:.4}, train accuracy {:.1}%",
                    cfg.epochs,
                    100.0 * mean_acc
                )
            });
        }
        epochs.push((mean_loss, mean_acc));
    }
    bar.finish_and_clear();

    let (test_loss, test_accuracy) = eval(&loss, &test)?;
    Ok(Summary {
        initial_test_loss,
        initial_test_accuracy,
        epochs,
        test_loss,
        test_accuracy,
    })
}

fn main() -> Result<()> {
    let cfg = Config::from_args()?;
    let s = run(&cfg)?;
    println!(
        "held-out ({TEST_PAIRS} pairs): loss {:.4}, accuracy {:.1}% (before training {:.1}%)",
        s.test_loss,
        100.0 * s.test_accuracy,
        100.0 * s.initial_test_accuracy
    );
    if s.test_accuracy < MIN_ACCURACY {
        return Err(fail(format!(
            "held-out accuracy {:.1}% is below {:.0}%",
            100.0 * s.test_accuracy,
            100.0 * MIN_ACCURACY
        )));
    }
    Ok(())
}
