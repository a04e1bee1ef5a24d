//! Smoke runs of the training examples (`examples/ppo_pendulum.rs`, `examples/reward_model.rs`)
//! with tiny settings: their `run` functions are compiled in here, so the examples cannot rot
//! and their seeding stays deterministic. The full runs (`cargo run --release --example ...`)
//! check that learning happens; these only check that everything runs end to end.

#[allow(dead_code)]
#[path = "../examples/ppo_pendulum.rs"]
mod ppo_pendulum;

#[allow(dead_code)]
#[path = "../examples/reward_model.rs"]
mod reward_model;

use std::sync::Mutex;

/// The examples seed libtorch's global RNG (weight initialisation): run them one at a time.
static GLOBAL_RNG: Mutex<()> = Mutex::new(());

#[test]
fn ppo_pendulum_smoke_run_is_deterministic() -> torchrl::Result<()> {
    let _lock = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
    // 2 pendulums, 2 batches of one 200-step episode each: 60 gradient steps per batch.
    let cfg = ppo_pendulum::Config {
        frames: 800,
        seed: 3,
        envs: 2,
        quiet: true,
    };
    let a = ppo_pendulum::run(&cfg)?;
    assert_eq!(a.frames, 800);
    for r in [
        a.first_train_return,
        a.last_train_return,
        a.random_return,
        a.untrained_return,
        a.trained_return,
    ] {
        // Pendulum's reward is in [-16.3, 0] per step, 200 steps per episode.
        assert!(r.is_finite() && (-3300.0..=0.0).contains(&r), "{a:?}");
    }
    let b = ppo_pendulum::run(&cfg)?;
    assert_eq!(a, b, "same seed, same run");
    Ok(())
}

#[test]
fn reward_model_smoke_run_learns() -> torchrl::Result<()> {
    let _lock = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = reward_model::Config {
        epochs: 3,
        pairs: 1024,
        seed: 1,
        verbose: false,
    };
    let s = reward_model::run(&cfg)?;
    assert_eq!(s.epochs.len(), 3);
    assert!(
        s.test_accuracy > 0.7 && s.test_accuracy > s.initial_test_accuracy,
        "{s:?}"
    );
    assert!(s.test_loss < s.initial_test_loss, "{s:?}");
    Ok(())
}
