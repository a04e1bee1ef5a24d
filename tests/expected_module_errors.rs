//! Libtorch failures inside the classic modules come back as `torchrl::Error`s naming the
//! module, the key and the dtypes / shapes, without C++ frames (issue 26, item 6).

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};
use torchrl::modules::{
    from_fn, DistributionBuilder, MlpConfig, ProbabilisticActor, TdModule, TensorDictModule,
    ValueOperator, MLP,
};
use torchrl::{Error, TensorDict};

type R = torchrl::Result<()>;

fn obs(kind: Kind) -> torchrl::Result<TensorDict> {
    TensorDict::new([5])?.with("observation", Tensor::zeros([5, 3], (kind, Device::Cpu)))
}

fn no_cpp_frames(msg: &str) {
    assert!(!msg.contains("frame #"), "C++ frames in: {msg}");
    assert!(
        !msg.contains("Exception raised from"),
        "C++ origin in: {msg}"
    );
    assert!(!msg.contains('\n'), "multi-line message: {msg}");
}

#[test]
fn float64_observation_into_float32_mlp_names_module_key_and_dtypes() -> R {
    let vs = nn::VarStore::new(Device::Cpu);
    let mlp = MLP::new(&vs.root(), &MlpConfig::new(3, 2))?;
    let module = TdModule::new(mlp, ["observation"], ["out"])?;
    let err = module.forward(obs(Kind::Double)?).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::InvalidValue { .. }), "{msg}");
    assert!(msg.contains("MLP expects float32"), "{msg}");
    assert!(msg.contains("observation"), "{msg}");
    assert!(msg.contains("float64 [5, 3]"), "{msg}");
    no_cpp_frames(&msg);
    // the right dtype runs
    assert_eq!(
        module.forward(obs(Kind::Float)?)?.get_or_err("out")?.size(),
        [5, 2]
    );
    Ok(())
}

#[test]
fn mlp_forward_alone_checks_dtype_before_the_op() -> R {
    let vs = nn::VarStore::new(Device::Cpu);
    let mlp = MLP::new(&vs.root(), &MlpConfig::new(3, 2))?;
    let err = mlp
        .forward(&Tensor::zeros([5, 3], (Kind::Double, Device::Cpu)))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("MLP expects float32") && msg.contains("float64 [5, 3]"),
        "{msg}"
    );
    no_cpp_frames(&msg);
    Ok(())
}

#[test]
fn value_operator_names_the_key() -> R {
    let vs = nn::VarStore::new(Device::Cpu);
    let critic = ValueOperator::new(MLP::new(&vs.root(), &MlpConfig::new(3, 1))?);
    let err = critic.forward(obs(Kind::Double)?).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("observation") && msg.contains("float64"),
        "{msg}"
    );
    Ok(())
}

/// A tch::nn module (no dtype declared) that libtorch rejects: the error keeps only
/// libtorch's first line and names the module's inputs.
#[test]
fn tch_module_failure_is_one_line_with_inputs() -> R {
    #[derive(Debug)]
    struct Lin(Tensor);
    impl Module for Lin {
        fn forward(&self, xs: &Tensor) -> Tensor {
            xs.matmul(&self.0)
        }
    }
    let module = TdModule::new(
        Lin(Tensor::zeros([4, 2], (Kind::Float, Device::Cpu))),
        ["observation"],
        ["out"],
    )?;
    let err = module.forward(obs(Kind::Float)?).unwrap_err();
    let msg = err.to_string();
    eprintln!("{msg}");
    assert!(
        msg.contains("[5, 3]") && msg.contains("cannot be multiplied"),
        "{msg}"
    );
    no_cpp_frames(&msg);
    Ok(())
}

/// A libtorch failure while the actor builds its distribution: the error names the actor,
/// the distribution and its parameters' dtypes and shapes, in one line.
#[test]
fn actor_distribution_failure_names_parameters() -> R {
    let net = from_fn(["observation"], ["loc", "scale"], |x: &[&Tensor]| {
        Ok(vec![
            x[0].shallow_clone(),
            x[0].f_narrow(-1, 0, 2)?.f_ones_like()?,
        ])
    })?;
    // a distribution whose construction runs a libtorch op that fails: [5, 3] @ [5, 2]
    let builder = DistributionBuilder::custom("Broken", ["loc", "scale"], |td: &TensorDict| {
        let loc = td.get_or_err("loc")?;
        let scale = td.get_or_err("scale")?;
        let _ = loc.f_matmul(scale)?;
        Err(torchrl::Error::InvalidArgument {
            op: "unreachable",
            message: String::new(),
        })
    })?;
    let actor = ProbabilisticActor::new(net, builder);
    let err = actor.forward(obs(Kind::Float)?).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("ProbabilisticActor (Broken distribution"),
        "{msg}"
    );
    assert!(
        msg.contains("\"loc\": float32 [5, 3]") && msg.contains("\"scale\": float32 [5, 2]"),
        "{msg}"
    );
    assert!(msg.contains("cannot be multiplied"), "{msg}");
    no_cpp_frames(&msg);
    Ok(())
}
