//! Emits an rpath to libtorch's library folder so that every binary, test, example and bench
//! of this crate finds `libtorch_cpu.so` at run time without `LD_LIBRARY_PATH`.
//!
//! `torch-sys` (a direct dependency, `links = "tch"`) publishes the folder it linked against
//! as `DEP_TCH_LIBTORCH_LIB`. `rustc-link-arg` only applies to this package's own targets, so
//! the folder is passed on (`links = "torchrl"`: `DEP_TORCHRL_LIBTORCH_LIB` in the build
//! scripts of crates that depend on torchrl), and a dependent binary crate's build script emits
//! its own rpath from it (`fixtures/dependent/build.rs`, the README's "Depending on torchrl").
//!
//! With the cargo feature `gym` it also emits an rpath to libpython's folder and records the
//! interpreter's site-packages (`gym_python`).
//!
//! With the cargo feature `distributed` it also compiles `src/distributed/shim.cpp` (the C ABI
//! over libtorch's c10d: TCPStore + ProcessGroupGloo) against the wheel's headers and the system
//! gloo headers (Debian's `libgloo-dev`, installed by `scripts/setup.sh`); docs/distributed.md.
//! With the feature `nccl` the shim also compiles c10d's `ProcessGroupNCCL` path, against the
//! CUDA / NCCL headers of the wheel's `nvidia-*` packages, and links `libtorch_cuda`.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath={dir}");
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-env=TORCHRL_LIBTORCH_LIB={dir}");
        // metadata for crates that depend on torchrl (`links = "torchrl"`): they read it as
        // DEP_TORCHRL_LIBTORCH_LIB in their build script and emit their own rpath
        println!("cargo:libtorch_lib={dir}");
    }
    dispatcher_shims();
    #[cfg(feature = "distributed")]
    distributed::build_shim();
    if std::env::var_os("CARGO_FEATURE_GYM").is_some() {
        gym_python();
    }
}

/// Compiles the C++ files that reach libtorch ops tch does not bind, through the dispatcher by
/// name, against the headers of the libtorch torch-sys linked: `src/modules/llm/nn/mkl_packed.cpp`
/// (MKL's packed-weight linear; `modules::llm::nn::packed`) and `src/objectives/fused_adam.cpp`
/// (the fused Adam step; `objectives::optim::FusedAdam`) and `src/modules/models/tanh.cpp` (an
/// AVX2 float32 tanh; `modules::models::tanh`). Without `DEP_TCH_LIBTORCH_LIB`
/// (nothing to compile against) the crate builds without them (`cfg(torchrl_shims)` is then
/// unset): decoding uses the plain products, `FusedAdam` its per-tensor fallback and `tanh`
/// libtorch's.
fn dispatcher_shims() {
    const SHIM: &str = "src/modules/llm/nn/mkl_packed.cpp";
    const ADAM: &str = "src/objectives/fused_adam.cpp";
    const TANH: &str = "src/modules/models/tanh.cpp";
    println!("cargo:rerun-if-changed={SHIM}");
    println!("cargo:rerun-if-changed={ADAM}");
    println!("cargo:rerun-if-changed={TANH}");
    println!("cargo:rerun-if-changed=src/shims/guard.h");
    println!("cargo::rustc-check-cfg=cfg(torchrl_shims)");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    let lib = std::path::PathBuf::from(lib);
    let include = lib
        .parent()
        .unwrap_or(std::path::Path::new("/"))
        .join("include");
    if !include.join("ATen/core/dispatch/Dispatcher.h").exists() {
        println!(
            "cargo:warning=torchrl: {} has no ATen headers; decoding uses the plain products",
            include.display()
        );
        return;
    }
    cc::Build::new()
        .cpp(true)
        .file(SHIM)
        .file(ADAM)
        .file(TANH)
        .std("c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        // the wheel's headers are not warning-clean under -Wall; ours is checked by hand
        .warnings(false)
        .extra_warnings(false)
        .cargo_warnings(false)
        .compile("torchrl_shims");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-cfg=torchrl_shims");
}

/// With the feature `gym`: an rpath to the folder of the Python library pyo3 links against
/// (so tests and binaries start without `LD_LIBRARY_PATH`), and the interpreter's
/// site-packages baked in as `TORCHRL_GYM_SITE` (an embedded interpreter does not read a
/// virtual environment's `pyvenv.cfg`, so `GymEnv` adds them to `sys.path`). The interpreter is
/// `PYO3_PYTHON` (as for pyo3), else `python3`.
fn gym_python() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let code = "import site, sysconfig; print(sysconfig.get_config_var('LIBDIR')); \
                print(':'.join(site.getsitepackages()))";
    let out = std::process::Command::new(&python)
        .args(["-c", code])
        .output();
    let Ok(out) = out else {
        println!("cargo:warning=feature gym: cannot run {python} to find libpython");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = text.lines();
    if let Some(libdir) = lines.next().filter(|l| !l.is_empty()) {
        println!("cargo:rustc-link-arg=-Wl,-rpath={libdir}");
    }
    if let Some(site) = lines.next() {
        println!("cargo:rustc-env=TORCHRL_GYM_SITE={site}");
    }
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
        let mut build = cc::Build::new();
        build
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
            .cargo_warnings(false);
        #[cfg(feature = "nccl")]
        nccl(&mut build, &torch, &lib);
        build.compile("torchrl_c10d");
        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-lib=dylib=torch_cpu");
        println!("cargo:rustc-link-lib=dylib=c10");
    }

    /// The NCCL path: c10d's `ProcessGroupNCCL.hpp` (in the wheel) includes CUDA's and NCCL's
    /// headers, which the wheel's `nvidia-*` dependencies ship under
    /// `site-packages/nvidia/*/include` (`TORCHRL_CUDA_INCLUDE`, a `:`-separated list, replaces
    /// them), plus CUDA's `crt/` and `nv/` headers from `nvidia-cuda-crt` / `nvidia-cuda-cccl`.
    #[cfg(feature = "nccl")]
    fn nccl(build: &mut cc::Build, torch: &Path, lib: &Path) {
        println!("cargo:rerun-if-env-changed=TORCHRL_CUDA_INCLUDE");
        if !lib.join("libtorch_cuda.so").exists() {
            fail(&format!(
                "{}/libtorch_cuda.so is missing: the feature `nccl` needs a CUDA build of \
                 libtorch (the torch==2.13.0 wheel from PyPI is one)",
                lib.display()
            ));
        }
        let dirs: Vec<PathBuf> = match std::env::var("TORCHRL_CUDA_INCLUDE") {
            Ok(list) => list.split(':').map(PathBuf::from).collect(),
            Err(_) => {
                let nvidia = torch.parent().unwrap_or(Path::new("/")).join("nvidia");
                let mut dirs: Vec<PathBuf> = std::fs::read_dir(&nvidia)
                    .map(|rd| {
                        rd.filter_map(|e| e.ok())
                            .map(|e| e.path().join("include"))
                            .filter(|p| p.is_dir())
                            .collect()
                    })
                    .unwrap_or_default();
                dirs.sort();
                dirs
            }
        };
        for header in [
            "nccl.h",
            "cuda_runtime_api.h",
            "crt/host_config.h",
            "nv/target",
        ] {
            if !dirs.iter().any(|d| d.join(header).exists()) {
                fail(&format!(
                    "{header} is in none of {dirs:?}: the feature `nccl` needs the CUDA and NCCL \
                     headers (scripts/setup.sh installs nvidia-cuda-crt and nvidia-cuda-cccl \
                     beside the wheel's nvidia-* packages; or set TORCHRL_CUDA_INCLUDE)"
                ));
            }
        }
        build
            .define("TORCHRL_NCCL", None)
            .define("USE_C10D_NCCL", None);
        for d in &dirs {
            build.include(d);
        }
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }

    fn fail(msg: &str) -> ! {
        eprintln!("torchrl build (feature `distributed`): {msg}");
        std::process::exit(1);
    }
}
