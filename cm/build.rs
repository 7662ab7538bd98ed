//! Build check for the `rdma` feature, shared with the engine crate (`engine/build_check.rs`):
//! fail early with a clear message when the verbs/rdma_cm headers or a usable libclang are missing.

#[path = "../engine/build_check.rs"]
mod build_check;

fn main() {
    println!("cargo:rerun-if-changed=../engine/build_check.rs");
    build_check::run();
}
