//! W15 / W16: seconds per GRPO and DPO optimizer step at the RLHF flagship's config, the Rust
//! half of the side-by-side with TRL 1.16's `GRPOTrainer` and `DPOTrainer`
//! (`benches/python/grpo_dpo_baseline.py`: same model shape, batch, prompt and completion
//! lengths, steps per generation round; random-init models).
//!
//! Model: GPT-2 with vocabulary 259 (`ByteTokenizer`), context 32, 2 blocks × 64, 4 heads; hydra
//! with 1 unfrozen block (the flagship's; `TORCHRL_BENCH_UNFROZEN=-1` trains every block
//! against a full frozen copy, TRL's design).
//!
//! - W15, GRPO (`GrpoTrainer::iteration`): 8 prompts of 4 bytes × `num_generations` 8 = 64
//!   sampled completions of at most 12 tokens (temperature 1), the hydra pass for the
//!   rollout's and the reference's log-probs, a random-init GPT-2 reward model of the same
//!   shape, TRL's group advantages, then `num_iterations` 2 passes in minibatches of 32: 4
//!   optimizer steps (DAPO loss, ε 0.2 / 0.28, β 0.04 k3 KL, grad clip 1, AdamW 1e-3). One
//!   iteration's time / 4 is the reported s/step (generation included).
//! - W16, DPO (`DpoTrainer::step`): 32 random pairs (prompt 4 bytes, completions 5–11 bytes
//!   incl. EOS), reference log-probs per batch from the hydra branch
//!   (`precompute_ref_log_probs = false`), sigmoid loss at β 0.1, backward, clip, AdamW.
//!
//! Both: warm-up first (1 GRPO iteration, 3 DPO steps, as the Python side), then the best and
//! the median of the timed ones. Prints `W<name>\t<steps/s>` lines (the format
//! `scripts/bench.sh` pairs with the Python side) and `#` lines with the details.
//!
//! **Floors** (`W15_grpo_step_flagship_floor`, `W16_dpo_step_flagship_floor`, steps/s, and a
//! `#` line with ours / floor): the same workload as bare `tch` ops on a second copy of the
//! models (same seed, so the same initial parameters), from `common::bare_rlhf` /
//! `bare_gpt2` / `bare_optim`, timed interleaved with ours (`common::paired`: best of 3
//! iterations / steps each after a warm-up). The GRPO floor is one whole iteration: the env's
//! prompts, sampling with EOS from the same uniforms (its generator seeded as the trainer's),
//! the prompt pass once per group of `num_generations` identical prompts, the sampler's
//! log-probs kept as the rollout's, one frozen-trunk pass and the reference branch for the
//! reference's log-probs of the response tokens, the reward model at each row's last real
//! token, the group advantages, then the trainer's minibatch permutations (drawn as the
//! trainer draws them) and 4 DAPO updates starting above the frozen trunk with `BareAdamW`.
//! The DPO floor is one step: left-padded collation, per side one frozen-trunk pass shared by
//! the reference branch and the policy's top block, sequence log-probs, the sigmoid loss,
//! backward, clip, AdamW. Ours does the same since issue 27 (the shared prompt pass, the
//! sampler's log-probs, and DPO's trunk run once per side); left out of the floors (computed
//! by ours, not needed by the math): the value head in the update forwards, the LM head and
//! log-softmax at prompt positions, the loss statistics, the tensordict bookkeeping. Before
//! timing, the first GRPO iteration and the first two DPO steps
//! of ours and of the floor are checked against each other: the same tokens; log-probs, scores,
//! advantages and losses to 1e-4; every parameter after the updates to 1e-4. No floor runs
//! with `TORCHRL_BENCH_UNFROZEN` 0 or -1 (a full-copy reference: no frozen trunk). Env:
//! `TORCHRL_BENCH_GRPO_DPO=grpo|dpo|both` (default `both`), `TORCHRL_BENCH_ITERS` (timed GRPO
//! iterations, default 5), `TORCHRL_BENCH_DPO_STEPS` (timed DPO steps, default 20),
//! `TORCHRL_BENCH_THREADS` (default 1), `TORCHRL_BENCH_UNFROZEN` (default 1), `TORCHRL_BENCH_BF16=1`
//! (the models in bfloat16, the Python side's `--bf16`; no floor), `TORCHRL_BENCH_REUSE=0` (W15's
//! rollout without the shared prompt pass, without the reward model's shared prefix and with the
//! policy's log-probs recomputed, as before issue 27; no floor), `TORCHRL_BENCH_RM_PREFIX=0` (only
//! the reward model's shared prefix off; no floor).

mod common;
use common::bare_gpt2::{padded_blocked, positions_from_mask, BareGpt2};
use common::bare_optim::BareAdamW;
use common::bare_rlhf::{
    collate_left, dpo_sigmoid_loss, generate_eos, gpt2_parameters, group_advantages,
    grpo_dapo_loss, hydra_and_reward_model, sequence_sum, shuffled, trainable_params, BareHydra,
    BareRewardModel, HydraAndRewardModel,
};
use common::{best_median, env_or, max_diff, paired, peak_rss_mib, print_floor};

use std::time::Instant;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::envs::llm::{RewardModelScorer, TokenEnv, TokenEnvConfig};
use torchrl::modules::llm::keys::{
    ASSISTANT_MASK_KEY, FULL_KEY, FULL_LOG_PROBS_KEY, REF_LOG_PROBS_KEY,
};
use torchrl::modules::llm::{ByteTokenizer, CausalLmWithHydraValueHead, Gpt2Config, TextTokenizer};
use torchrl::trainers::api::Callbacks;
use torchrl::trainers::config::GenKwargs;
use torchrl::trainers::dpo::{DpoPair, DpoTrainer, DpoTrlConfig};
use torchrl::trainers::grpo::{GrpoLossType, GrpoTrainer, GrpoTrlConfig, ScaleRewards};
use torchrl::{Generator, Result};

const PROMPT_LEN: usize = 4;
const NEW_TOKENS: i64 = 12;
const ROLLOUTS: usize = 64;
const NUM_GENERATIONS: usize = 8;
const MINIBATCH: usize = 32;
const NUM_ITERATIONS: usize = 2;
const DPO_BATCH: usize = 32;
const DPO_WARMUP: usize = 3;
/// The GRPO stage's settings, shared by ours (the config) and the floor.
const EPSILON: f64 = 0.2;
const EPSILON_HIGH: f64 = 0.28;
const BETA: f64 = 0.04;
const LR: f64 = 1e-3;
const MAX_GRAD_NORM: f64 = 1.0;
const DPO_BETA: f64 = 0.1;
/// TRL's `scale_rewards = "group"` epsilon (`objectives::llm::TRL_STD_EPS`).
const STD_EPS: f64 = 1e-4;
/// The floor checks' tolerance (log-probs, scores, losses, parameters).
const TOL: f64 = 1e-4;

fn model_config() -> Gpt2Config {
    let tok = ByteTokenizer::new();
    Gpt2Config::new(tok.vocab_size())
        .with_n_positions(32)
        .with_n_embd(64)
        .with_n_layer(2)
        .with_n_head(4)
        .with_special_tokens(tok.bos_token_id(), tok.eos_token_id(), tok.pad_token_id())
}

/// `n` lowercase bytes (the Python side draws the same alphabet).
fn letters(rng: &mut Generator, n: usize) -> Vec<i64> {
    (0..n).map(|_| 97 + rng.below(26) as i64).collect()
}

fn rounded(times: &[f64]) -> Vec<f64> {
    times.iter().map(|t| (t * 1e4).round() / 1e4).collect()
}

/// Asserts that every parameter of two GPT-2 models is the same to [`TOL`].
fn assert_same_parameters(what: &str, ours: &BareGpt2, floor: &BareGpt2) {
    let (a, b) = (gpt2_parameters(ours), gpt2_parameters(floor));
    assert_eq!(a.len(), b.len(), "{what}: parameter counts differ");
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| max_diff(x, y))
        .fold(0.0, f64::max);
    assert!(
        worst <= TOL,
        "{what}: parameters differ by {worst} after the update"
    );
}

/// Asserts `|ours − floor| ≤ TOL · max(1, |ours|)`.
fn assert_close(what: &str, ours: f64, floor: f64) {
    assert!(
        (ours - floor).abs() <= TOL * ours.abs().max(1.0),
        "{what}: ours {ours} vs the floor {floor}"
    );
}

fn grpo(iters: usize, unfrozen: i64) -> Result<()> {
    let cfg = model_config();
    let (_vs, model, _rm_vs, rm) = hydra_and_reward_model(&cfg, unfrozen)?;
    let mut rng = Generator::new(0);
    let groups = ROLLOUTS / NUM_GENERATIONS;
    let prompts: Vec<Vec<i64>> = (0..groups * (iters + 1))
        .map(|_| letters(&mut rng, PROMPT_LEN))
        .collect();

    // the flagship's GRPO stage (examples/rlhf/compare.rs `grpo_config`)
    let mut c = GrpoTrlConfig::default();
    c.train.seq_length = 32;
    // never the last step (no final evaluate + save inside the timing): the warm-up, the
    // timed iterations, then the floor comparison's warm-up and 3 timed ones, and a spare
    c.train.epochs = iters + 8;
    c.train.total_steps = 1_000_000;
    c.train.batch_size = MINIBATCH;
    c.train.log_interval = 1_000_000;
    c.train.eval_interval = 1_000_000;
    c.train.checkpoint_interval = 1_000_000;
    c.train.seed = 0;
    c.train.max_grad_norm = Some(MAX_GRAD_NORM);
    c.optimizer.kwargs.lr = LR;
    c.scheduler.kwargs.eta_min = LR;
    let m = &mut c.method;
    m.num_generations = NUM_GENERATIONS;
    m.num_rollouts = ROLLOUTS;
    m.chunk_size = ROLLOUTS;
    m.num_iterations = NUM_ITERATIONS;
    m.beta = BETA;
    m.epsilon = EPSILON;
    m.epsilon_high = Some(EPSILON_HIGH);
    m.loss_type = GrpoLossType::Dapo;
    m.scale_rewards = ScaleRewards::Group;
    m.gen_kwargs = GenKwargs {
        max_new_tokens: NEW_TOKENS as usize,
        ..GenKwargs::default()
    };
    let steps_per_iteration = c.steps_per_iteration();
    let seed = c.train.seed;

    let env_cfg = TokenEnvConfig::for_model(&cfg.facts())
        .with_max_new_tokens(NEW_TOKENS)
        .with_batch_size(ROLLOUTS as i64)
        .with_num_generations(NUM_GENERATIONS as i64);
    // TORCHRL_BENCH_REUSE=0: the rollout as before issue 27 (every row's prompt pass in the
    // policy and the reward model, the policy's log-probs recomputed by the hydra pass), for an
    // A/B of the two (no floor then)
    let reuse = env_or("TORCHRL_BENCH_REUSE", 1u8) == 1;
    // TORCHRL_BENCH_RM_PREFIX=0: only the reward model's shared prefix off (no floor then)
    let rm_prefix = reuse && env_or("TORCHRL_BENCH_RM_PREFIX", 1u8) == 1;
    let env = TokenEnv::new(
        env_cfg,
        prompts.clone(),
        Box::new(RewardModelScorer::new(rm).with_shared_prompts(rm_prefix)),
    )?;
    let mut trainer = GrpoTrainer::new(c, model, env, Box::new(ByteTokenizer::new()))?
        .with_shared_prompts(reuse)
        .with_sampler_log_probs(reuse);
    let mut floor = if unfrozen >= 1 && !bf16() && rm_prefix {
        Some(GrpoFloor::new(&cfg, unfrozen, prompts, seed)?)
    } else {
        None
    };
    let mut callbacks = Callbacks::new();
    let warm = trainer.iteration(&mut callbacks)?; // warm-up, as the Python side
    if let Some(floor) = floor.as_mut() {
        check_grpo(&trainer, &warm, floor, cfg.n_head)?;
    }
    let (mut per_step, mut rollout, mut update, mut lengths) = (vec![], vec![], vec![], vec![]);
    for _ in 0..iters {
        let t0 = Instant::now();
        let s = trainer.iteration(&mut callbacks)?;
        per_step.push(t0.elapsed().as_secs_f64() / steps_per_iteration as f64);
        rollout.push(s.rollout_s);
        update.push(s.update_s / steps_per_iteration as f64);
        lengths.push(s.response_length);
    }
    let (best, median) = best_median(&per_step);
    let (_, rollout_median) = best_median(&rollout);
    let (_, update_median) = best_median(&update);
    println!("W15_grpo_step_flagship\t{:.4}", 1.0 / best);
    println!(
        "# W15_grpo_step_flagship: num_layers_unfrozen {unfrozen}; {steps_per_iteration} steps \
         per iteration of {ROLLOUTS} completions; best {best:.4} / median {median:.4} s/step \
         over {:?}; per iteration: rollout (generate + hydra log-probs + reward model + \
         advantages) median {rollout_median:.4} s, update median {update_median:.4} s/step; \
         mean completion length {:.1}; peak RSS {:.0} MiB",
        rounded(&per_step),
        lengths.iter().sum::<f64>() / lengths.len().max(1) as f64,
        peak_rss_mib()
    );
    let Some(mut floor) = floor else {
        println!(
            "# W15_grpo_step_flagship: no floor (num_layers_unfrozen {unfrozen}, bf16 or TORCHRL_BENCH_REUSE=0)"
        );
        return Ok(());
    };
    let (ours_s, floor_s) = paired(
        Box::new(|| trainer.iteration(&mut callbacks).map(|_| ())),
        Box::new(|| floor.iteration().map(|_| ())),
    )?;
    // per optimizer step, as the row
    print_floor(
        "W15_grpo_step_flagship",
        steps_per_iteration as f64,
        ours_s,
        floor_s,
    );
    Ok(())
}

/// W15's floor: one GRPO iteration as bare ops on its own copy of the models.
struct GrpoFloor {
    hydra: BareHydra,
    rm: BareRewardModel,
    opt: BareAdamW,
    /// The trainer's generator (seeded with `train.seed`): the sampler's seed, then the
    /// minibatch permutations.
    rng: Generator,
    prompts: Vec<Vec<i64>>,
    cursor: usize,
    eos: i64,
    pad: i64,
    _models: HydraAndRewardModel,
}

/// One floor rollout: `[B, T]` tokens and mask, the frozen trunk's output and the attention
/// mask of the updates, and per response token `[B, R]` the mask and the rollout's policy and
/// reference log-probs; per completion the score and the advantage.
struct FloorRollout {
    full: Tensor,
    blocked: Tensor,
    trunk: Tensor,
    mask: Tensor,
    old_lp: Tensor,
    ref_lp: Tensor,
    scores: Tensor,
    adv: Tensor,
}

impl GrpoFloor {
    fn new(cfg: &Gpt2Config, unfrozen: i64, prompts: Vec<Vec<i64>>, seed: u64) -> Result<Self> {
        let models = hydra_and_reward_model(cfg, unfrozen)?;
        let hydra = BareHydra::from_model(&models.1, cfg.n_head);
        let rm = BareRewardModel::from_model(&models.3, cfg.n_head);
        let opt = BareAdamW::new(trainable_params(&models.1, false), LR, 0.0);
        let tok = ByteTokenizer::new();
        Ok(GrpoFloor {
            hydra,
            rm,
            opt,
            rng: Generator::new(seed),
            prompts,
            cursor: 0,
            eos: tok.eos_token_id().unwrap_or(256),
            pad: tok.pad_token_id().unwrap_or(257),
            _models: models,
        })
    }

    /// The rollout: the env's next prompts, sampling, the hydra pass, the reward model, the
    /// group advantages.
    fn rollout(&mut self) -> Result<FloorRollout> {
        let (b, p) = (ROLLOUTS as i64, PROMPT_LEN as i64);
        // the env's reset: the next prompts in order, each in NUM_GENERATIONS rows
        let mut ids = Vec::with_capacity(ROLLOUTS * PROMPT_LEN);
        for _ in 0..ROLLOUTS / NUM_GENERATIONS {
            let prompt = &self.prompts[self.cursor % self.prompts.len()];
            self.cursor += 1;
            for _ in 0..NUM_GENERATIONS {
                ids.extend_from_slice(prompt);
            }
        }
        let prompt = Tensor::from_slice(&ids).view([b, p]);
        let prompt_mask = prompt.ones_like();
        // the policy step's sampler, seeded from the trainer's generator
        let sampler_seed = self.rng.next_u64();
        let u = Generator::new(sampler_seed).uniform(
            &[NEW_TOKENS, b],
            0.0,
            1.0,
            Kind::Double,
            Device::Cpu,
        )?;
        let gen = generate_eos(
            &self.hydra.policy,
            &prompt,
            Some(&prompt_mask),
            NEW_TOKENS,
            &u,
            self.eos,
            self.pad,
            true,
            NUM_GENERATIONS as i64,
        );
        let _guard = tch::no_grad_guard();
        let full = Tensor::cat(&[&prompt, &gen.response], 1);
        let attention = Tensor::cat(&[&prompt_mask, &gen.live.to_kind(Kind::Int64)], 1);
        let positions = positions_from_mask(&attention);
        let blocked = padded_blocked(&attention);
        // the rollout's log-probs are the sampler's; one frozen-trunk pass and the reference
        // branch for the reference's
        let trunk = self.hydra.trunk(&full, &positions, &blocked);
        let ref_lp = self.hydra.reference_log_probs(&trunk, &blocked, &full, p);
        let old_lp = gen.log_probs.expect("asked for");
        // the reward model runs each group's shared prefix once (`RewardModelScorer`)
        let g = NUM_GENERATIONS as i64;
        let scores = self
            .rm
            .scores_grouped(&full, &attention, &positions, &blocked, g);
        let adv = group_advantages(
            &scores.to_kind(Kind::Double),
            NUM_GENERATIONS as i64,
            STD_EPS,
        )
        .to_kind(Kind::Float);
        Ok(FloorRollout {
            full,
            blocked,
            trunk,
            mask: gen.live.to_kind(Kind::Float),
            old_lp,
            ref_lp,
            scores,
            adv,
        })
    }

    /// The updates: `NUM_ITERATIONS` passes of shuffled minibatches, each one DAPO step from
    /// the cached trunk output. Returns each step's loss.
    fn update(&mut self, r: &FloorRollout) -> Vec<Tensor> {
        let p = PROMPT_LEN as i64;
        let mut losses = Vec::with_capacity(NUM_ITERATIONS * ROLLOUTS.div_ceil(MINIBATCH));
        for _ in 0..NUM_ITERATIONS {
            let perm = shuffled(&mut self.rng, ROLLOUTS);
            for chunk in perm.chunks(MINIBATCH) {
                let idx = Tensor::from_slice(chunk);
                let pick = |t: &Tensor| t.index_select(0, &idx);
                let (lp, _) = self.hydra.policy_forward(
                    &pick(&r.trunk),
                    &pick(&r.blocked),
                    &pick(&r.full),
                    p,
                    false,
                );
                let loss = grpo_dapo_loss(
                    &lp,
                    &pick(&r.old_lp),
                    &pick(&r.adv),
                    &pick(&r.mask),
                    Some(&pick(&r.ref_lp)),
                    EPSILON,
                    EPSILON_HIGH,
                    BETA,
                );
                self.opt.backward_step(&loss, Some(MAX_GRAD_NORM));
                losses.push(loss.detach());
            }
        }
        losses
    }

    /// One iteration: the rollout, then the updates.
    fn iteration(&mut self) -> Result<(FloorRollout, Vec<Tensor>)> {
        let r = self.rollout()?;
        let losses = self.update(&r);
        Ok((r, losses))
    }
}

/// Checks ours (the trainer after its first iteration, `stats` that iteration's) against the
/// floor's first iteration from the same parameters: the same tokens; the same log-probs,
/// scores, advantages, mean loss and updated parameters to [`TOL`].
fn check_grpo(
    trainer: &GrpoTrainer,
    stats: &torchrl::trainers::on_policy::IterationStats,
    floor: &mut GrpoFloor,
    n_head: i64,
) -> Result<()> {
    let (r, losses) = floor.iteration()?;
    let store = trainer.store().expect("a store after an iteration");
    let (p, n) = (PROMPT_LEN as i64, NEW_TOKENS);
    assert!(
        store.get_or_err(FULL_KEY)?.equal(&r.full),
        "W15 floor: the floor drew other tokens"
    );
    let mask = store
        .get_or_err(ASSISTANT_MASK_KEY)?
        .narrow(1, p, n)
        .to_kind(Kind::Float);
    assert!(mask.equal(&r.mask), "W15 floor: other response masks");
    for (what, key, floor_lp) in [
        ("rollout log-probs", FULL_LOG_PROBS_KEY, &r.old_lp),
        ("reference log-probs", REF_LOG_PROBS_KEY, &r.ref_lp),
    ] {
        let ours = store.get_or_err(key)?.narrow(1, p, n) * &mask;
        let diff = max_diff(&ours, &(floor_lp * &mask));
        assert!(diff <= TOL, "W15 floor: {what} differ by {diff}");
    }
    let diff = max_diff(store.get_or_err(("next", "score"))?, &r.scores);
    assert!(diff <= TOL, "W15 floor: scores differ by {diff}");
    let diff = max_diff(store.get_or_err("advantage")?, &r.adv);
    assert!(diff <= TOL, "W15 floor: advantages differ by {diff}");
    let ours_loss = stats.update.get("loss").copied().unwrap_or(f64::NAN);
    let floor_loss =
        losses.iter().map(|l| l.double_value(&[])).sum::<f64>() / losses.len().max(1) as f64;
    assert_close("W15 floor: the mean step loss", ours_loss, floor_loss);
    let ours = BareGpt2::from_model(trainer.model().policy().model(), n_head);
    assert_same_parameters("W15 floor", &ours, &floor.hydra.policy);
    println!(
        "# W15_grpo_step_flagship: floor checked against ours on one iteration: same tokens \
         ({} live response tokens of {}), log-probs / scores / advantages / mean loss \
         ({ours_loss:.6} vs {floor_loss:.6}) / parameters after {} steps within {TOL}",
        r.mask.sum(Kind::Float).double_value(&[]) as i64,
        ROLLOUTS as i64 * NEW_TOKENS,
        losses.len()
    );
    Ok(())
}

fn dpo_pairs(rng: &mut Generator, n: usize) -> Vec<DpoPair> {
    let eos = ByteTokenizer::new().eos_token_id().unwrap_or(256);
    let completion = |rng: &mut Generator| {
        let len = 4 + rng.below(7) as usize; // 4..=10 bytes, then EOS
        let mut c = letters(rng, len);
        c.push(eos);
        c
    };
    (0..n)
        .map(|_| {
            let prompt = letters(rng, PROMPT_LEN);
            let chosen = completion(rng);
            let rejected = completion(rng);
            DpoPair::new(prompt, chosen, rejected)
        })
        .collect()
}

/// The hydra policy with `unfrozen` trainable blocks, seeded: two calls give the same
/// parameters.
fn dpo_model(cfg: &Gpt2Config, unfrozen: i64) -> Result<(VarStore, CausalLmWithHydraValueHead)> {
    tch::manual_seed(0);
    let mut vs = VarStore::new(Device::Cpu);
    if bf16() {
        vs.set_kind(tch::Kind::BFloat16);
    }
    let model = CausalLmWithHydraValueHead::new(&vs.root(), cfg, unfrozen)?;
    Ok((vs, model))
}

/// `TORCHRL_BENCH_BF16=1`: the models are made in bfloat16 (AdamW keeps float32 masters; the
/// Python side's `--bf16`), and no floor runs (its checks compare in float32).
fn bf16() -> bool {
    env_or("TORCHRL_BENCH_BF16", 0u8) == 1
}

fn dpo(steps: usize, unfrozen: i64) -> Result<()> {
    let cfg = model_config();
    let (_vs, model) = dpo_model(&cfg, unfrozen)?;
    let mut rng = Generator::new(1);
    let batches: Vec<Vec<DpoPair>> = (0..DPO_WARMUP + steps)
        .map(|_| dpo_pairs(&mut rng, DPO_BATCH))
        .collect();
    // the flagship's DPO stage (examples/rlhf/compare.rs `dpo_config`), the reference per batch
    let mut c = DpoTrlConfig::default();
    c.train.seq_length = 32;
    c.train.total_steps = 1_000_000;
    c.train.batch_size = DPO_BATCH;
    c.train.log_interval = 1_000_000;
    c.train.eval_interval = 1_000_000;
    c.train.checkpoint_interval = 1_000_000;
    c.train.seed = 0;
    c.train.max_grad_norm = Some(MAX_GRAD_NORM);
    c.optimizer.kwargs.lr = LR;
    c.scheduler.kwargs.eta_min = LR;
    c.method.beta = DPO_BETA;
    c.method.precompute_ref_log_probs = false;
    let all: Vec<DpoPair> = batches.iter().flatten().cloned().collect();
    let mut trainer = DpoTrainer::new(c, model, all, Box::new(ByteTokenizer::new()))?;
    let mut floor = if unfrozen >= 1 && !bf16() {
        Some(DpoFloor::new(&cfg, unfrozen)?)
    } else {
        None
    };
    let mut times = Vec::with_capacity(steps);
    for (i, batch) in batches.iter().enumerate() {
        let t0 = Instant::now();
        let stats = trainer.step(batch)?;
        if i >= DPO_WARMUP {
            times.push(t0.elapsed().as_secs_f64());
        }
        // the first step's loss is ln 2 whatever the log-probs (policy = reference): the
        // second one's is checked too
        if let (0 | 1, Some(floor)) = (i, floor.as_mut()) {
            check_dpo(&trainer, &stats, floor, batch, cfg.n_head);
        }
    }
    let (best, median) = best_median(&times);
    // where the time goes: the same batches' reference + policy forward without gradient
    let mut forward = Vec::with_capacity(steps);
    for batch in batches.iter().skip(DPO_WARMUP) {
        let t0 = Instant::now();
        trainer.evaluate_pairs(batch)?;
        forward.push(t0.elapsed().as_secs_f64());
    }
    let (_, forward_median) = best_median(&forward);
    println!("W16_dpo_step_flagship\t{:.4}", 1.0 / best);
    println!(
        "# W16_dpo_step_flagship: num_layers_unfrozen {unfrozen}; {DPO_BATCH} pairs per step; \
         best {best:.4} / median {median:.4} s/step over {:?}; the reference + policy forward \
         alone (no gradient, `evaluate_pairs`) median {forward_median:.4} s; peak RSS {:.0} MiB",
        rounded(&times),
        peak_rss_mib()
    );
    let Some(mut floor) = floor else {
        println!(
            "# W16_dpo_step_flagship: no floor with num_layers_unfrozen {unfrozen} or in bf16"
        );
        return Ok(());
    };
    let (mut at_ours, mut at_floor) = (0usize, 0usize);
    let n = batches.len();
    let (ours_s, floor_s) = paired(
        Box::new(|| {
            at_ours += 1;
            trainer.step(&batches[at_ours % n]).map(|_| ())
        }),
        Box::new(|| {
            at_floor += 1;
            let _ = floor.step(&batches[at_floor % n]);
            Ok(())
        }),
    )?;
    print_floor("W16_dpo_step_flagship", 1.0, ours_s, floor_s);
    Ok(())
}

/// W16's floor: one DPO step as bare ops on its own copy of the model.
struct DpoFloor {
    hydra: BareHydra,
    opt: BareAdamW,
    pad: i64,
    _model: (VarStore, CausalLmWithHydraValueHead),
}

impl DpoFloor {
    fn new(cfg: &Gpt2Config, unfrozen: i64) -> Result<Self> {
        let model = dpo_model(cfg, unfrozen)?;
        let hydra = BareHydra::from_model(&model.1, cfg.n_head);
        let opt = BareAdamW::new(trainable_params(&model.1, false), LR, 0.0);
        Ok(DpoFloor {
            hydra,
            opt,
            // the trainer pads with the model's pad id
            pad: cfg.pad_token_id.or(cfg.eos_token_id).unwrap_or(0),
            _model: model,
        })
    }

    /// The policy's and the reference's sequence log-probs of one side's completions: one
    /// frozen-trunk pass, then the branch (no gradient) and the policy's top blocks.
    fn side(&self, pairs: &[DpoPair], chosen: bool) -> (Tensor, Tensor) {
        let prompts: Vec<&[i64]> = pairs.iter().map(|p| p.prompt.as_slice()).collect();
        let completions: Vec<&[i64]> = pairs
            .iter()
            .map(|p| if chosen { &p.chosen } else { &p.rejected }.as_slice())
            .collect();
        let rows = collate_left(&prompts, &completions, self.pad);
        let t = rows.ids.size()[1];
        let from = t - rows.longest_completion;
        let completion = rows
            .completion_mask
            .narrow(1, from, rows.longest_completion);
        let positions = positions_from_mask(&rows.attention_mask);
        let blocked = padded_blocked(&rows.attention_mask);
        let h = &self.hydra;
        let trunk = h.trunk(&rows.ids, &positions, &blocked);
        let reference = tch::no_grad(|| {
            sequence_sum(
                &h.reference_log_probs(&trunk, &blocked, &rows.ids, from),
                &completion,
            )
        });
        let (policy, _) = h.policy_forward(&trunk, &blocked, &rows.ids, from, false);
        (sequence_sum(&policy, &completion), reference)
    }

    /// One step on `pairs`; returns the loss.
    fn step(&mut self, pairs: &[DpoPair]) -> Tensor {
        let (pc, rc) = self.side(pairs, true);
        let (pr, rr) = self.side(pairs, false);
        let loss = dpo_sigmoid_loss(&pc, &pr, &rc, &rr, DPO_BETA);
        self.opt.backward_step(&loss, Some(MAX_GRAD_NORM));
        loss.detach()
    }
}

/// Checks ours (the trainer after a step on `batch`, `stats` that step's) against the
/// floor's step on the same batch from the same parameters (both having taken the same steps
/// before): the loss and the updated parameters to [`TOL`].
fn check_dpo(
    trainer: &DpoTrainer,
    stats: &torchrl::trainers::api::Stats,
    floor: &mut DpoFloor,
    batch: &[DpoPair],
    n_head: i64,
) {
    let floor_loss = floor.step(batch).double_value(&[]);
    let ours_loss = stats.get("loss").copied().unwrap_or(f64::NAN);
    assert_close("W16 floor: the loss", ours_loss, floor_loss);
    let ours = BareGpt2::from_model(trainer.model().policy().model(), n_head);
    assert_same_parameters("W16 floor", &ours, &floor.hydra.policy);
    println!(
        "# W16_dpo_step_flagship: floor checked against ours on a step: loss \
         ({ours_loss:.6} vs {floor_loss:.6}) and parameters after the step within {TOL}"
    );
}

fn main() -> Result<()> {
    tch::set_num_threads(env_or("TORCHRL_BENCH_THREADS", 1));
    let which = std::env::var("TORCHRL_BENCH_GRPO_DPO").unwrap_or_else(|_| "both".into());
    let unfrozen = env_or("TORCHRL_BENCH_UNFROZEN", 1i64);
    if which == "grpo" || which == "both" {
        grpo(env_or("TORCHRL_BENCH_ITERS", 5usize).max(1), unfrozen)?;
    }
    if which == "dpo" || which == "both" {
        dpo(env_or("TORCHRL_BENCH_DPO_STEPS", 20usize).max(1), unfrozen)?;
    }
    Ok(())
}
