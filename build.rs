//! Emits an rpath to libtorch's library folder so that every binary, test, example and bench
//! of this crate finds `libtorch_cpu.so` at run time without `LD_LIBRARY_PATH`.
//!
//! `torch-sys` (a direct dependency, `links = "tch"`) publishes the folder it linked against
//! as `DEP_TCH_LIBTORCH_LIB`. `rustc-link-arg` only applies to this package's own targets,
//! which is exactly what we need.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath={dir}");
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-env=TORCHRL_LIBTORCH_LIB={dir}");
    }
}
