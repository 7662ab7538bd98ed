//! iWARP (no immediate data): the [`RdmaConn`] posting variants that carry the credit word in a
//! header slot ([`HdrParts`]) as a separate gather/scatter entry.

use super::{Outgoing, Planned, RdmaConn};
use crate::error::FabricError;
use crate::fabric::rdma::datapath::chain::CHAIN;
use crate::fabric::rdma::header::{HdrParts, HDR_LEN};
use crate::fabric::rdma::verbs::{self, RecvWr, SendWr, Sge};
use crate::fabric::rdma::wr_id::recv_wr_id;

impl RdmaConn {
    /// [`Self::post_recvs`] on iWARP: each receive scatters the header into the buffer's header
    /// slot and the payload into the buffer.
    pub(super) fn post_recvs_hdr(&mut self, bufs: &[u32], h: HdrParts) -> Result<(), FabricError> {
        let size = u32::try_from(self.rx_pool.buf_size()).unwrap_or(u32::MAX);
        let zero = Sge {
            addr: 0,
            length: 0,
            lkey: 0,
        };
        for chunk in bufs.chunks(CHAIN) {
            let mut wrs = [const { std::mem::MaybeUninit::<RecvWr>::uninit() }; CHAIN];
            let mut sges = [[zero; 2]; CHAIN];
            let n = chunk.len();
            for (i, &buf) in chunk.iter().enumerate() {
                if buf >= self.rx_pool.count() || buf >= h.rx_slots {
                    return Err(FabricError::Protocol(
                        "released receive buffer out of range",
                    ));
                }
                sges[i] = [
                    Sge {
                        addr: h.view.buf_ptr(buf).as_ptr() as u64,
                        length: HDR_LEN,
                        lkey: h.lkey,
                    },
                    Sge {
                        addr: self.rx_pool.buf_ptr(buf).as_ptr() as u64,
                        length: size,
                        lkey: self.rx_lkey,
                    },
                ];
            }
            let base = wrs.as_mut_ptr().cast::<RecvWr>();
            for (i, &buf) in chunk.iter().enumerate() {
                let next = if i + 1 < n {
                    // SAFETY: i + 1 < n <= CHAIN: in bounds of `wrs`.
                    unsafe { base.add(i + 1) }
                } else {
                    std::ptr::null_mut()
                };
                wrs[i].write(RecvWr {
                    wr_id: recv_wr_id(self.gen, buf),
                    next,
                    sg_list: sges[i].as_mut_ptr(),
                    num_sge: 2,
                });
            }
            // SAFETY: as in `post_recvs`; in addition each header entry is the buffer's own slot
            // (index checked against `rx_slots`) in the header region registered with
            // LOCAL_WRITE, which `_keep` holds as long as the QP.
            unsafe { self.qp.post_recv(base) }.map_err(|e| FabricError::Io(e.errno))?;
            self.rx_return.on_consumed(n as u64);
        }
        Ok(())
    }

    /// The header slot of the send with sequence number `seq` (iWARP).
    #[inline]
    fn send_hdr_slot(&self, h: &HdrParts, seq: u64) -> *mut u8 {
        let idx = h.rx_slots + (seq % u64::from(self.sq_depth)) as u32;
        h.view.buf_ptr(idx).as_ptr()
    }

    /// Writes the header of the next send (sequence `self.sq_posted`) and returns its
    /// scatter/gather entry.
    #[inline]
    pub(super) fn write_send_hdr(&self, h: &HdrParts, word: u32) -> Sge {
        let slot = self.send_hdr_slot(h, self.sq_posted);
        // SAFETY: the slot is HDR_LEN bytes inside the header region (index < rx_slots +
        // sq_depth, the region's slot count); the send that last used it completed (the send
        // queue holds at most `sq_depth` sends), so nothing reads it concurrently.
        unsafe { std::ptr::copy_nonoverlapping(word.to_le_bytes().as_ptr(), slot, 4) };
        Sge {
            addr: slot as u64,
            length: HDR_LEN,
            lkey: h.lkey,
        }
    }

    /// [`Self::post_plan`] on iWARP for `plan` (already limited to the credits and send-queue
    /// room): plain SENDs of header + payload (two gather entries); a frame carries the frame
    /// flag in its header word.
    pub(super) fn post_plan_hdr(
        &mut self,
        plan: &[Planned],
        h: HdrParts,
    ) -> Result<(), FabricError> {
        let n = plan.len();
        let mut wrs = [const { std::mem::MaybeUninit::<SendWr>::uninit() }; CHAIN];
        let zero = Sge {
            addr: 0,
            length: 0,
            lkey: 0,
        };
        let mut sges = [[zero; 2]; CHAIN];
        let hoarding = self.hoarding(plan);
        for (i, p) in plan.iter().enumerate() {
            let word = self.send_word(p.frame);
            let hdr = self.write_send_hdr(&h, word);
            let (addr, lkey) = self.send_source(p);
            let out = Outgoing {
                addr,
                len: p.len,
                imm: word,
                inline: self.send_inline(p.len),
                force_signal: p.rndv || (i + 1 == n && hoarding),
            };
            let mut wr = verbs::send_wr_zeroed();
            self.fill_send(&mut wr, &mut sges[i][1], out);
            sges[i][1].lkey = lkey;
            sges[i][0] = hdr;
            wr.opcode = verbs::WR_SEND;
            wr.num_sge = 1 + i32::from(p.len > 0);
            wrs[i].write(wr);
            self.track_send(p, self.sq_posted - 1);
        }
        for i in 0..n {
            let sg = sges[i].as_mut_ptr();
            let next = if i + 1 < n {
                wrs[i + 1].as_mut_ptr()
            } else {
                std::ptr::null_mut()
            };
            // SAFETY: entry i was initialised in the loop above.
            let w = unsafe { wrs[i].assume_init_mut() };
            w.sg_list = sg;
            w.next = next;
        }
        self.spend_credits(n as u64);
        // SAFETY: as in `post_plan`; in addition each WR's first gather entry is its own header
        // slot in the registered header region (kept by `_keep`), untouched until the send
        // completes (see `write_send_hdr`).
        unsafe { self.qp.post_send(wrs[0].as_mut_ptr()) }.map_err(|e| FabricError::Io(e.errno))
    }
}
