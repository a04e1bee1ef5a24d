//! ILQL in the shape of trlX's `AccelerateILQLTrainer`: offline data of scored samples
//! ([`data`]), the ILQL loss, Polyak-synced target Q-heads and β-shaped generation.

pub mod config;
pub mod data;
pub mod trainer;

pub use config::{BetaSweep, IlqlGenKwargs, IlqlMethodConfig, IlqlTrlConfig};
pub use trainer::IlqlTrainer;
