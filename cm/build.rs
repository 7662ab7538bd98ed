//! Build check for the `rdma` feature: fail early with a clear message (instead of a bindgen
//! panic inside rdma-sys) when the verbs/rdma_cm headers or a usable libclang are missing.
//! Without the feature it does nothing: the default build needs none of these packages.
//!
//! This is the only copy of the check: `spinwire`'s `rdma` feature enables `cm/rdma`, so every
//! build that links rdma-sys runs it here.

use std::path::{Path, PathBuf};

/// Runs the check (a no-op without the `rdma` feature); panics with the list of problems.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");
    if std::env::var_os("CARGO_FEATURE_RDMA").is_none() {
        return;
    }
    let mut problems = Vec::new();
    for (header, pkg) in [
        ("infiniband/verbs.h", "libibverbs-dev"),
        ("rdma/rdma_cma.h", "librdmacm-dev"),
    ] {
        if !Path::new("/usr/include").join(header).exists() {
            problems.push(format!("missing <{header}>: install {pkg}"));
        }
    }
    if std::env::var_os("LIBCLANG_PATH").is_none() {
        // clang-sys (bindgen) picks the newest libclang it finds; rdma-sys 0.3's bindgen 0.59
        // mis-generates with libclang >= 16.
        let versions = libclang_versions();
        match versions.iter().max() {
            None => problems.push(
                "no libclang found: install libclang-dev (Debian 12: libclang-14-dev)".to_owned(),
            ),
            Some(&v) if v >= 16 => {
                let hint = versions.iter().filter(|&&v| v < 16).max().map_or(
                    "install libclang-14-dev and set LIBCLANG_PATH=/usr/lib/llvm-14/lib".to_owned(),
                    |old| format!("set LIBCLANG_PATH=/usr/lib/llvm-{old}/lib"),
                );
                problems.push(format!(
                    "libclang {v} found; rdma-sys 0.3 needs libclang < 16: {hint}"
                ));
            }
            Some(_) => {}
        }
    }
    if !problems.is_empty() {
        panic!(
            "\n\nfeature `rdma` (cm's, which spinwire's `rdma` enables) cannot be built:\n  - {}\n\
             On Debian/Ubuntu: apt-get install libibverbs-dev librdmacm-dev libclang-dev clang\n\
             (or build without `--features rdma`).\n",
            problems.join("\n  - ")
        );
    }
}

/// Major versions of the libclang shared libraries installed under /usr/lib/llvm-N.
fn libclang_versions() -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/usr/lib") else {
        return out;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(v) = name.to_str().and_then(|n| n.strip_prefix("llvm-")) else {
            continue;
        };
        let Ok(v) = v.parse::<u32>() else { continue };
        let lib: PathBuf = entry.path().join("lib");
        let has = std::fs::read_dir(&lib).is_ok_and(|d| {
            d.flatten().any(|f| {
                f.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with("libclang") && n.contains(".so"))
            })
        });
        if has {
            out.push(v);
        }
    }
    out
}
