//! The rpath to the libtorch folder torchrl was built against (README, "Depending on torchrl"),
//! as any crate that depends on torchrl sets it for its binaries.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TORCHRL_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TORCHRL_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath={dir}");
    }
}
