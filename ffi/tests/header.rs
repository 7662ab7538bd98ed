//! The checked-in `ffi/include/spinwire.h` is what cbindgen generates from this crate now.
//!
//! Regenerate it with `SPINWIRE_BLESS=1 cargo test -p spinwire-ffi --test header`.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("ffi/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let path = dir.join("include/spinwire.h");
    if std::env::var_os("SPINWIRE_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write ffi/include/spinwire.h");
        return;
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    if checked_in != fresh {
        panic!(
            "ffi/include/spinwire.h is stale (it differs from what cbindgen generates from \
             ffi/src).\nRegenerate it: SPINWIRE_BLESS=1 cargo test -p spinwire-ffi --test header"
        );
    }
}
