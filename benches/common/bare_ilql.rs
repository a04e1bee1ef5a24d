//! Bare-`tch` floor pieces of the ilql benches (see `bare_gpt2.rs`).

#![allow(dead_code)] // each bench uses some of these
