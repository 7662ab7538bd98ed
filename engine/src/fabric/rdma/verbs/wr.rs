//! Work requests: the raw `ibv_send_wr` / `ibv_recv_wr` / `ibv_sge` types, zeroed
//! constructors, opcodes and send flags.

use std::mem::MaybeUninit;
use std::ptr;

use rdma_sys as ffi;

pub use ffi::{ibv_recv_wr as RecvWr, ibv_send_wr as SendWr, ibv_sge as Sge};

/// A zeroed send work request (fill it in place; no allocation).
#[inline]
pub fn send_wr_zeroed() -> SendWr {
    // SAFETY: all-zero is a valid ibv_send_wr (null pointers, zero counts).
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// A zeroed receive work request.
#[inline]
pub fn recv_wr_zeroed() -> RecvWr {
    RecvWr {
        wr_id: 0,
        next: ptr::null_mut(),
        sg_list: ptr::null_mut(),
        num_sge: 0,
    }
}

/// `IBV_WR_SEND_WITH_IMM` opcode.
pub const WR_SEND_WITH_IMM: u32 = ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
/// `IBV_WR_SEND` opcode.
pub const WR_SEND: u32 = ffi::ibv_wr_opcode::IBV_WR_SEND;
/// `IBV_WR_RDMA_READ` opcode.
pub const WR_RDMA_READ: u32 = ffi::ibv_wr_opcode::IBV_WR_RDMA_READ;
/// `IBV_SEND_SIGNALED` flag.
pub const SEND_SIGNALED: u32 = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
/// `IBV_SEND_INLINE` flag.
pub const SEND_INLINE: u32 = ffi::ibv_send_flags::IBV_SEND_INLINE.0;

/// Sets a send WR's immediate data (host order in, network order on the wire).
#[inline]
pub fn set_imm(wr: &mut SendWr, imm: u32) {
    wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
}

/// Sets an RDMA READ/WRITE work request's remote address and key.
#[inline]
pub fn set_rdma(wr: &mut SendWr, remote_addr: u64, rkey: u32) {
    wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
}
