//! Gives `libspinwire.so` its SONAME, `libspinwire.so.MAJOR`, and links that name to the
//! library in the build tree (`target/<profile>/libspinwire.so.MAJOR -> libspinwire.so`), so a
//! program linked with `-Ltarget/release -lspinwire` (which records the SONAME as its
//! dependency) finds it there by rpath as it would in an install prefix (`scripts/install-c`).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    let soname = format!("libspinwire.so.{major}");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os != "linux" {
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    // OUT_DIR is target/<profile>/build/spinwire-ffi-<hash>/out: three levels below the
    // directory cargo puts the library in. The link may dangle until the library is linked.
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let Some(dir) = out.ancestors().nth(3) else {
        return;
    };
    let link = dir.join(&soname);
    if std::fs::symlink_metadata(&link).is_err() {
        #[cfg(unix)]
        if let Err(e) = std::os::unix::fs::symlink("libspinwire.so", &link) {
            println!("cargo:warning=could not link {}: {e}", link.display());
        }
    }
}
