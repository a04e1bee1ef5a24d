//! Emits an rpath to libtorch's library folder so that every binary, test, example and bench
//! of this crate finds `libtorch_cpu.so` at run time without `LD_LIBRARY_PATH`.
//!
//! `torch-sys` (a direct dependency, `links = "tch"`) publishes the folder it linked against
//! as `DEP_TCH_LIBTORCH_LIB`. `rustc-link-arg` only applies to this package's own targets,
//! which is exactly what we need.
//!
//! With the cargo feature `distributed` it also compiles `src/distributed/shim.cpp` (the C ABI
//! over libtorch's c10d: TCPStore + ProcessGroupGloo) against the wheel's headers and the system
//! gloo headers (Debian's `libgloo-dev`, installed by `scripts/setup.sh`); docs/distributed.md.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath={dir}");
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-env=TORCHRL_LIBTORCH_LIB={dir}");
    }
    #[cfg(feature = "distributed")]
    distributed::build_shim();
}

#[cfg(feature = "distributed")]
mod distributed {
    use std::path::{Path, PathBuf};

    const SHIM: &str = "src/distributed/shim.cpp";

    /// Compiles the c10d shim into a static library linked into this crate, followed by the
    /// libtorch libraries its symbols come from (`c10d::ProcessGroupGloo`, `c10d::TCPStore` are
    /// exported by `libtorch_cpu.so`).
    pub fn build_shim() {
        println!("cargo:rerun-if-changed={SHIM}");
        println!("cargo:rerun-if-env-changed=TORCHRL_GLOO_INCLUDE");
        let lib = match std::env::var("DEP_TCH_LIBTORCH_LIB") {
            Ok(lib) => PathBuf::from(lib),
            Err(_) => fail("torch-sys did not publish DEP_TCH_LIBTORCH_LIB (where libtorch is)"),
        };
        let torch = lib.parent().unwrap_or(Path::new("/")).to_path_buf();
        let include = torch.join("include");
        let c10d = include.join("torch/csrc/distributed/c10d/ProcessGroupGloo.hpp");
        if !c10d.exists() {
            fail(&format!(
                "{} is missing: this libtorch ships no c10d headers (the torch==2.13.0 wheel does)",
                c10d.display()
            ));
        }
        let gloo = std::env::var("TORCHRL_GLOO_INCLUDE").unwrap_or_else(|_| "/usr/include".into());
        if !Path::new(&gloo).join("gloo/context.h").exists() {
            fail(&format!(
                "{gloo}/gloo/context.h is missing: install Debian's libgloo-dev \
                 (scripts/setup.sh does), or point TORCHRL_GLOO_INCLUDE at a folder holding gloo/"
            ));
        }
        cc::Build::new()
            .cpp(true)
            .file(SHIM)
            .std("c++17")
            .define("_GLIBCXX_USE_CXX11_ABI", "1")
            .define("USE_C10D_GLOO", None)
            .include(&include)
            .include(include.join("torch/csrc/api/include"))
            .include(&gloo)
            // The wheel's headers are not warning-clean under -Wall; ours is checked by hand.
            .warnings(false)
            .extra_warnings(false)
            .cargo_warnings(false)
            .compile("torchrl_c10d");
        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-lib=dylib=torch_cpu");
        println!("cargo:rustc-link-lib=dylib=c10");
    }

    fn fail(msg: &str) -> ! {
        eprintln!("torchrl build (feature `distributed`): {msg}");
        std::process::exit(1);
    }
}
