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
