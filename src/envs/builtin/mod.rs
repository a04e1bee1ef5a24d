//! Built-in environments: batched, tensor-native, seeded, on any device.

mod cartpole;
mod common;
mod counting;
mod mountain_car;
mod pendulum;

pub use cartpole::{ActionEncoding, CartPoleEnv};
pub use counting::CountingEnv;
pub use mountain_car::MountainCarContinuousEnv;
pub use pendulum::PendulumEnv;
