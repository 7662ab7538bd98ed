//! Build check for the `rdma` feature (see `build_check.rs`): fail early with a clear message
//! when the verbs/rdma_cm headers or a usable libclang are missing.

mod build_check;

fn main() {
    println!("cargo:rerun-if-changed=build_check.rs");
    build_check::run();
}
