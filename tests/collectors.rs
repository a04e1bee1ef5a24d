//! `Collector` (`torchrl::collectors`), `ReplayBuffer` and its samplers
//! (`torchrl::data::replay`), and global gradient-norm clipping (`torchrl::objectives::optim`).

use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use torchrl::collectors::Collector;
use torchrl::data::replay::{RandomSampler, ReplayBuffer, Sampler, SamplerWithoutReplacement};
use torchrl::envs::builtin::{CountingEnv, PendulumEnv};
use torchrl::modules::{
    from_fn, DistributionBuilder, ExplorationType, ProbabilisticActor, TensorDictModule,
};
use torchrl::objectives::optim::{clip_grad_norm, clip_grad_norm_tensors, step_with_grad_norm};
use torchrl::{EnvBase, TensorDict};

type R = torchrl::Result<()>;

/// A policy writing a constant action shaped `[*batch, 1]`.
fn const_policy(
    batch: &[i64],
    value: f64,
) -> impl FnMut(TensorDict) -> torchrl::Result<TensorDict> {
    let shape: Vec<i64> = [batch, &[1]].concat();
    move |mut td: TensorDict| {
        td.set(
            "action",
            Tensor::f_full(&shape, value, (Kind::Float, Device::Cpu))?,
        )?;
        Ok(td)
    }
}

fn floats(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).reshape([-1])).unwrap_or_default()
}

// ------------------------------------------------------------------ collector

#[test]
fn counting_unbatched_batches_frames_and_continuation() -> R {
    let env = CountingEnv::new(7, &[])?;
    let collector = Collector::new(env, const_policy(&[], 0.0), 5, Some(23))?;
    let batches: Vec<TensorDict> = collector.collect::<torchrl::Result<_>>()?;
    // total_frames is rounded up to whole batches: ceil(23 / 5) = 5 batches
    assert_eq!(batches.len(), 5);
    let mut obs = Vec::new();
    let mut next_obs = Vec::new();
    for b in &batches {
        assert_eq!(b.batch_size(), &[5]);
        assert_eq!(b.get_or_err("observation")?.size(), vec![5, 1]);
        assert_eq!(b.get_or_err(("next", "reward"))?.size(), vec![5, 1]);
        obs.extend(floats(b.get_or_err("observation")?));
        next_obs.extend(floats(b.get_or_err(("next", "observation"))?));
    }
    // one long stream across batches: counts 0..6, reset, 0..6, ...
    let want: Vec<f64> = (0..25).map(|i| (i % 7) as f64).collect();
    assert_eq!(obs, want);
    let want_next: Vec<f64> = (0..25).map(|i| (i % 7 + 1) as f64).collect();
    assert_eq!(next_obs, want_next);
    Ok(())
}

#[test]
fn counting_batched_shapes_and_continuation() -> R {
    let env = CountingEnv::new(100, &[4])?;
    let mut c = Collector::new(env, const_policy(&[4], 0.0), 12, Some(36))?;
    assert_eq!(c.steps_per_batch(), 3);
    let mut n = 0;
    for (i, b) in c.by_ref().enumerate() {
        let b = b?;
        assert_eq!(b.batch_size(), &[4, 3]);
        let o = b.get_or_err("observation")?;
        assert_eq!(o.size(), vec![4, 3, 1]);
        for e in 0..4 {
            for t in 0..3 {
                assert_eq!(o.double_value(&[e, t, 0]), (3 * i as i64 + t) as f64);
            }
        }
        n += 1;
    }
    assert_eq!(n, 3);
    assert_eq!(c.frames(), 36);
    assert_eq!(c.batches(), 3);
    assert!(c.next().is_none());
    Ok(())
}

#[test]
fn partial_resets_inside_a_batch() -> R {
    // episodes of 2 steps in a batch of 5 steps: resets happen mid-batch
    let env = CountingEnv::new(2, &[3])?;
    let mut c = Collector::new(env, const_policy(&[3], 0.0), 15, Some(15))?;
    let b = c
        .next()
        .transpose()?
        .ok_or(torchrl::Error::InvalidArgument {
            op: "test",
            message: "no batch".into(),
        })?;
    assert_eq!(b.batch_size(), &[3, 5]);
    let o = b.get_or_err("observation")?;
    for t in 0..5 {
        assert_eq!(o.double_value(&[1, t, 0]), (t % 2) as f64);
    }
    let done = b.get_or_err(("next", "done"))?;
    assert_eq!(
        done.to_kind(Kind::Int64).sum(Kind::Int64).int64_value(&[]),
        3 * 2
    );
    Ok(())
}

#[test]
fn pendulum_batch_and_continuation() -> R {
    for batch in [vec![], vec![4i64]] {
        let mut env = PendulumEnv::new(&batch, Device::Cpu)?;
        env.set_seed(0)?;
        let numel: i64 = batch.iter().product();
        let fpb = 8 * numel;
        let c = Collector::new(env, const_policy(&batch, 0.5), fpb, Some(3 * fpb))?;
        let batches: Vec<TensorDict> = c.collect::<torchrl::Result<_>>()?;
        assert_eq!(batches.len(), 3);
        let want: Vec<i64> = [batch.clone(), vec![8]].concat();
        for b in &batches {
            assert_eq!(b.batch_size(), want.as_slice());
            assert_eq!(b.numel(), fpb);
            let mut obs_shape = want.clone();
            obs_shape.push(3);
            assert_eq!(b.get_or_err("observation")?.size(), obs_shape);
        }
        // the first observation of a batch is the last next-observation of the previous one
        let nb = batch.len() as i64;
        for w in batches.windows(2) {
            let last = w[0].get_or_err(("next", "observation"))?.select(nb, 7);
            let first = w[1].get_or_err("observation")?.select(nb, 0);
            assert!(last.equal(&first));
        }
    }
    Ok(())
}

#[test]
fn actor_policy_from_as_policy() -> R {
    let net = from_fn(["observation"], ["loc", "scale"], |x: &[&Tensor]| {
        let loc = x[0]
            .f_sum_dim_intlist(-1, true, Kind::Float)?
            .f_mul_scalar(0.0)?;
        Ok(vec![
            loc.f_ones_like()?.f_mul_scalar(0.25)?,
            loc.f_ones_like()?,
        ])
    })?;
    let actor = ProbabilisticActor::new(net, DistributionBuilder::normal("loc", "scale")?);
    let env = PendulumEnv::new(&[2], Device::Cpu)?;
    // the collector explores by default (TorchRL): ask for the deterministic action here
    let mut c = Collector::new(env, actor.as_policy(), 6, Some(12))?
        .with_exploration_type(ExplorationType::Deterministic);
    let mut n = 0;
    for b in c.by_ref() {
        let b = b?;
        assert_eq!(b.batch_size(), &[2, 3]);
        let a = b.get_or_err("action")?;
        assert!(!a.requires_grad());
        assert!(floats(a).iter().all(|v| (v - 0.25).abs() < 1e-6)); // deterministic: the mean
        n += 1;
    }
    assert_eq!(n, 2);
    Ok(())
}

#[test]
fn update_policy_and_random_frames_and_reset_each_iter() -> R {
    let env = CountingEnv::new(100, &[2])?;
    let mut c = Collector::new(env, const_policy(&[2], 0.0), 4, None)?
        .with_init_random_frames(4)
        .with_reset_at_each_iter(true);
    let err = || torchrl::Error::InvalidArgument {
        op: "test",
        message: "no batch".into(),
    };
    let b1 = c.next().transpose()?.ok_or_else(err)?;
    let a1 = floats(b1.get_or_err("action")?);
    assert!(
        a1.iter().any(|v| *v != 0.0),
        "random actions in the first batch"
    );
    assert!(a1.iter().all(|v| (-1.0..=1.0).contains(v)));
    let b2 = c.next().transpose()?.ok_or_else(err)?;
    assert!(floats(b2.get_or_err("action")?).iter().all(|v| *v == 0.0));
    // reset at each iteration: the count starts again
    assert_eq!(b2.get_or_err("observation")?.double_value(&[0, 0, 0]), 0.0);
    c.update_policy(const_policy(&[2], 1.0));
    let b3 = c.next().transpose()?.ok_or_else(err)?;
    assert!(floats(b3.get_or_err("action")?).iter().all(|v| *v == 1.0));
    // no total_frames: never stops by itself
    assert_eq!(c.by_ref().take(5).count(), 5);
    assert_eq!(c.frames(), 4 * 8);
    Ok(())
}

#[test]
fn collector_argument_errors() -> R {
    assert!(Collector::new(
        CountingEnv::new(3, &[4])?,
        const_policy(&[4], 0.0),
        10,
        None
    )
    .is_err());
    assert!(Collector::new(CountingEnv::new(3, &[])?, const_policy(&[], 0.0), 0, None).is_err());
    assert!(Collector::new(
        CountingEnv::new(3, &[])?,
        const_policy(&[], 0.0),
        4,
        Some(-1)
    )
    .is_err());
    // a failing policy: one error, then the iterator ends
    let env = CountingEnv::new(3, &[])?;
    // (it returns a tensordict of the wrong batch size, which the env's step refuses)
    let mut c = Collector::new(env, |_td: TensorDict| TensorDict::new([3]), 2, None)?;
    assert!(matches!(c.next(), Some(Err(_))));
    assert!(c.next().is_none());
    Ok(())
}

// ------------------------------------------------------------------ replay buffer

fn items(start: i64, n: i64) -> torchrl::Result<TensorDict> {
    let x = Tensor::arange_start(start, start + n, (Kind::Int64, Device::Cpu));
    TensorDict::new([n])?.with("x", x.shallow_clone())?.with(
        ("nested", "y"),
        x.to_kind(Kind::Float).unsqueeze(-1).repeat([1, 3]),
    )
}

fn xs(td: &TensorDict) -> Vec<i64> {
    td.get("x")
        .and_then(|t| Vec::<i64>::try_from(t).ok())
        .unwrap_or_default()
}

#[test]
fn extend_splits_the_first_dim_and_sample_shapes() -> R {
    let mut rb = ReplayBuffer::new(100)?;
    let td = TensorDict::new([2, 8])?
        .with("obs", Tensor::zeros([2, 8, 3], (Kind::Float, Device::Cpu)))?
        .with(
            ("next", "reward"),
            Tensor::ones([2, 8, 1], (Kind::Float, Device::Cpu)),
        )?;
    // TorchRL's storages split along the first batch dim only: a [2, 8] batch is two
    // items of [8]; flattened first, it is 16 transitions
    let mut traj = ReplayBuffer::new(10)?;
    assert_eq!(traj.extend(&td)?, vec![0, 1]);
    assert_eq!(traj.sample(3)?.batch_size(), &[3, 8]);
    assert_eq!(traj.sample(3)?.get_or_err("obs")?.size(), vec![3, 8, 3]);
    let idx = rb.extend(&td.reshape([-1])?)?;
    assert_eq!(idx, (0..16).collect::<Vec<_>>());
    assert_eq!(rb.len(), 16);
    assert_eq!(rb.capacity(), 100);
    let s = rb.sample(32)?;
    assert_eq!(s.batch_size(), &[32]);
    assert_eq!(s.get_or_err("obs")?.size(), vec![32, 3]);
    assert_eq!(s.get_or_err(("next", "reward"))?.size(), vec![32, 1]);
    // a single batch-less transition
    let one = TensorDict::new([])?
        .with("obs", Tensor::ones([3], (Kind::Float, Device::Cpu)))?
        .with(
            ("next", "reward"),
            Tensor::ones([1], (Kind::Float, Device::Cpu)),
        )?;
    assert_eq!(rb.add(&one)?, vec![16]);
    assert_eq!(rb.len(), 17);
    // a structure mismatch is refused and writes nothing
    let bad =
        TensorDict::new([2])?.with("obs", Tensor::zeros([2, 4], (Kind::Float, Device::Cpu)))?;
    assert!(rb.extend(&bad).is_err());
    assert_eq!(rb.len(), 17);
    Ok(())
}

#[test]
fn fifo_overwrite() -> R {
    let mut rb = ReplayBuffer::new(10)?;
    rb.extend(&items(0, 6)?)?;
    rb.extend(&items(6, 6)?)?;
    assert_eq!(rb.len(), 10);
    let st = rb.storage()?.ok_or(torchrl::Error::InvalidArgument {
        op: "t",
        message: "empty".into(),
    })?;
    assert_eq!(xs(&st), vec![10, 11, 2, 3, 4, 5, 6, 7, 8, 9]);
    let y = st.get_or_err(("nested", "y"))?;
    assert_eq!(y.double_value(&[0, 2]), 10.0);
    // a write larger than the buffer keeps its last `capacity` items, as sequential writes would
    rb.extend(&items(100, 25)?)?;
    let st = rb.storage()?.ok_or(torchrl::Error::InvalidArgument {
        op: "t",
        message: "empty".into(),
    })?;
    // cursor was 2; after 25 writes it is 7: slots 7, 8, 9 hold the oldest kept (115..117)
    assert_eq!(
        xs(&st),
        vec![118, 119, 120, 121, 122, 123, 124, 115, 116, 117]
    );
    // every sample comes from the stored items
    let s = rb.sample(50)?;
    assert!(xs(&s).iter().all(|v| (115..125).contains(v)));
    rb.clear();
    assert!(rb.is_empty());
    assert!(rb.sample(1).is_err());
    assert!(rb.storage()?.is_none());
    rb.extend(&items(0, 3)?)?;
    assert_eq!(rb.len(), 3);
    assert!(ReplayBuffer::new(0).is_err());
    Ok(())
}

#[test]
fn seeded_sampling_is_reproducible() -> R {
    let mut a = ReplayBuffer::with_sampler(50, RandomSampler::new(42))?;
    let mut b = ReplayBuffer::with_sampler(50, RandomSampler::new(42))?;
    let mut c = ReplayBuffer::with_sampler(50, RandomSampler::new(43))?;
    for rb in [&mut a, &mut b, &mut c] {
        rb.extend(&items(0, 50)?)?;
    }
    let (sa, sb, sc) = (xs(&a.sample(20)?), xs(&b.sample(20)?), xs(&c.sample(20)?));
    assert_eq!(sa, sb);
    assert_ne!(sa, sc);
    let (ta, tb) = (xs(&a.sample(20)?), xs(&b.sample(20)?));
    assert_eq!(ta, tb);
    assert_ne!(sa, ta);
    // with replacement: a large sample repeats indices
    let big = a.sample(200)?;
    let mut v = xs(&big);
    v.sort();
    v.dedup();
    assert!(v.len() <= 50);
    Ok(())
}

#[test]
fn without_replacement_covers_each_index_once_per_epoch() -> R {
    let mut rb = ReplayBuffer::with_sampler(64, SamplerWithoutReplacement::new(7, true))?;
    rb.extend(&items(0, 20)?)?;
    let mut epochs = Vec::new();
    for _ in 0..3 {
        let mut seen = Vec::new();
        for k in 0..4 {
            let (s, idx) = rb.sample_with_indices(5)?;
            assert_eq!(s.batch_size(), &[5]);
            assert_eq!(xs(&s), idx);
            seen.extend(idx);
            assert_eq!(rb.sampler().ran_out(), k == 3);
        }
        let order = seen.clone();
        seen.sort();
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
        epochs.push(order);
    }
    assert_ne!(epochs[0], epochs[1], "a fresh permutation per epoch");

    // drop_last: 22 items, batches of 5 -> 4 full batches, the 2 left over are dropped
    let mut s = SamplerWithoutReplacement::new(1, true);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let i = s.sample_indices(22, 5)?;
        assert_eq!(i.len(), 5);
        seen.extend(i);
    }
    assert!(s.ran_out());
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 20);
    assert!(s.sample_indices(4, 5).is_err());

    // without drop_last: the short remainder ends the epoch
    let mut s = SamplerWithoutReplacement::new(1, false);
    let sizes: Vec<usize> = (0..5)
        .map(|_| s.sample_indices(22, 5).map(|v| v.len()))
        .collect::<torchrl::Result<_>>()?;
    assert_eq!(sizes, vec![5, 5, 5, 5, 2]);
    assert!(s.ran_out());

    // seeded: reproducible
    let mut a = SamplerWithoutReplacement::new(3, false);
    let mut b = SamplerWithoutReplacement::new(3, false);
    assert_eq!(a.sample_indices(30, 30)?, b.sample_indices(30, 30)?);
    Ok(())
}

// ------------------------------------------------------------------ grad-norm clipping

#[test]
fn clip_grad_norm_matches_hand_computed_norm() -> R {
    let vs = nn::VarStore::new(Device::Cpu);
    let a = vs.root().zeros("a", &[2]);
    let b = vs.root().zeros("b", &[2, 2]);
    let _unused = vs.root().zeros("no_grad_yet", &[3]);
    let ga = [1.0f32, -2.0];
    let gb = [3.0f32, 0.5, -4.0, 2.0];
    // gradients set by hand: d/dp of sum(p * g) is g
    let loss = (&a * Tensor::from_slice(&ga)).sum(Kind::Float)
        + (&b * Tensor::from_slice(&gb).view([2, 2])).sum(Kind::Float);
    loss.backward();
    let hand = ga
        .iter()
        .chain(gb.iter())
        .map(|g| f64::from(*g).powi(2))
        .sum::<f64>()
        .sqrt();
    let max_norm = 1.5;
    let norm = clip_grad_norm(&vs, max_norm)?;
    assert!((norm - hand).abs() < 1e-6, "{norm} vs {hand}");
    let after = clip_grad_norm_tensors(&[a.shallow_clone(), b.shallow_clone()], 1e9)?;
    assert!((after - max_norm).abs() < 1e-5, "clipped norm {after}");
    // the direction is kept
    let scale = max_norm / (hand + 1e-6);
    let g = floats(&a.grad());
    assert!((g[0] - 1.0 * scale).abs() < 1e-6 && (g[1] + 2.0 * scale).abs() < 1e-6);
    // below max_norm: untouched
    let again = clip_grad_norm(&vs, 10.0)?;
    assert!((again - max_norm).abs() < 1e-5);
    assert!((floats(&a.grad())[0] - scale).abs() < 1e-6);
    assert!(clip_grad_norm(&vs, -1.0).is_err());
    assert!(clip_grad_norm(&vs, f64::NAN).is_err());
    // no gradients at all
    let empty = nn::VarStore::new(Device::Cpu);
    let _w = empty.root().zeros("w", &[2]);
    assert_eq!(clip_grad_norm(&empty, 1.0)?, 0.0);
    Ok(())
}

#[test]
fn step_with_grad_norm_clips_before_the_step() -> R {
    let vs = nn::VarStore::new(Device::Cpu);
    let w = vs.root().zeros("w", &[2]);
    let mut opt = nn::Sgd::default().build(&vs, 1.0)?;
    for _ in 0..2 {
        // each step starts from zeroed gradients: the norm is the same both times
        let loss = (&w * Tensor::from_slice(&[6.0f32, 8.0])).sum(Kind::Float);
        let norm = step_with_grad_norm(&mut opt, &vs, &loss, 2.0)?;
        assert!((norm - 10.0).abs() < 1e-5);
    }
    // two steps of lr 1 along -[0.6, 0.8] * 2
    let v = floats(&w);
    assert!(
        (v[0] + 2.4).abs() < 1e-5 && (v[1] + 3.2).abs() < 1e-5,
        "{v:?}"
    );
    Ok(())
}

#[test]
fn random_batches_carry_the_policy_keys_and_share_a_buffer() -> R {
    use torchrl::data::replay::ReplayBuffer;
    let env = CountingEnv::new(100, &[2])?;
    // a policy that writes more than the action (a log-prob and a nested loc)
    let policy = |mut td: TensorDict| {
        td.set("action", Tensor::zeros([2, 1], (Kind::Float, Device::Cpu)))?;
        td.set(
            "action_log_prob",
            Tensor::full([2], -0.5, (Kind::Float, Device::Cpu)),
        )?;
        td.set(
            ("dist", "loc"),
            Tensor::ones([2, 1], (Kind::Float, Device::Cpu)),
        )?;
        Ok(td)
    };
    let mut c = Collector::new(env, policy, 4, Some(8))?.with_init_random_frames(4);
    let no_batch = || torchrl::Error::InvalidArgument {
        op: "test",
        message: "no batch".into(),
    };
    let mut rb = ReplayBuffer::new(100)?;
    let random = c.next().transpose()?.ok_or_else(no_batch)?;
    // random batch: the policy's keys, as zeros
    assert_eq!(random.get_or_err("action_log_prob")?.size(), vec![2, 2]);
    assert_eq!(floats(random.get_or_err(("dist", "loc"))?), vec![0.0; 4]);
    assert!(floats(random.get_or_err("action")?)
        .iter()
        .any(|v| *v != 0.0));
    let policy_batch = c.next().transpose()?.ok_or_else(no_batch)?;
    assert_eq!(
        floats(policy_batch.get_or_err(("dist", "loc"))?),
        vec![1.0; 4]
    );
    // both extend one buffer (the second extend failed before)
    rb.extend(&random.reshape([-1])?)?;
    rb.extend(&policy_batch.reshape([-1])?)?;
    assert_eq!(rb.len(), 8);
    Ok(())
}
