//! Policy building blocks: [`TensorDictModule`]s that read and write tensordict keys,
//! [`TensorDictSequential`], models ([`MLP`], [`ValueOperator`]), probability distributions over
//! actions ([`distributions`]) and the [`ProbabilisticActor`] that joins them.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::modules::distributions::{Distribution, Normal};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let dist = Normal::new(&Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)),
//!                        &Tensor::ones([2], (Kind::Float, tch::Device::Cpu)))?;
//! let action = dist.sample(&mut Generator::new(0), &[])?;
//! assert_eq!(action.size(), vec![2]);
//! assert_eq!(dist.log_prob(&action)?.size(), vec![2]);
//! # Ok(()) }
//! ```

pub mod actor_value;
pub mod actors;
pub mod distributions;
pub mod exploration;
pub mod llm;
pub mod models;
pub mod module;
pub mod probabilistic;
pub mod q_value;
pub mod sequential;
pub mod tanh;
pub mod value_norm;

pub use actor_value::ActorValueOperator;
pub use actors::{DistributionBuilder, NormalParamExtractor, ProbabilisticActor};
pub use exploration::{AdditiveGaussianModule, EGreedyModule, OrnsteinUhlenbeckProcessModule};
pub use models::{MlpConfig, ValueOperator, MLP};
pub use module::{from_fn, TdModule, TensorDictModule};
pub use probabilistic::{
    exploration_type, set_exploration_type, ExplorationGuard, ExplorationType,
    ProbabilisticTensorDictModule,
};
pub use q_value::{ActionSpace, QValueActor, QValueModule};
pub use sequential::TensorDictSequential;
pub use tanh::TanhModule;
pub use value_norm::{PercentileValueNorm, PopArtValueNorm, RunningValueNorm, ValueNorm};
