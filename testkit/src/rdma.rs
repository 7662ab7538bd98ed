//! The RDMA VM (`scripts/rxe-vm`): tests of the `rdma` feature run against a real kernel RDMA
//! stack there, and outside it have nothing to talk to.

/// The VM's RDMA-capable address (`RXE_VM_IP`), or `None` outside the VM (after printing why
/// the calling test does nothing).
pub fn vm_ip() -> Option<String> {
    match std::env::var("RXE_VM_IP") {
        Ok(ip) => Some(ip),
        Err(_) => {
            eprintln!("skipped: RXE_VM_IP unset (not inside the RDMA VM)");
            None
        }
    }
}

/// Whether the VM's RDMA device (`RXE_VM_DEV`, else the first) refuses a shared receive queue
/// (iWARP does: spinwire refuses `rdma_srq` there), after printing why the calling test skips.
///
/// # Panics
/// If the device cannot be opened (a test inside the VM expects one).
#[cfg(feature = "rdma")]
pub fn srq_unsupported() -> bool {
    let name = std::env::var("RXE_VM_DEV").ok();
    let ctx = spinwire::fabric::rdma::verbs::Context::open(name.as_deref())
        .expect("open the RDMA device");
    if ctx.is_iwarp() {
        eprintln!(
            "skipped: device {} is iWARP, where rdma_srq is refused",
            ctx.name()
        );
    }
    ctx.is_iwarp()
}
