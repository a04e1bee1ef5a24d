//! Built-in environments: batched, tensor-native, seeded, on any device.

mod counting;

pub use counting::CountingEnv;
