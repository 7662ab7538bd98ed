//! [`Fifo`]: the fixed-capacity queues of a connection (held send buffers, pending receives,
//! per-SEND message counts).
//!
//! The storage is a power of two long and indices wrap with a mask: with a `%` of the
//! capacity every push and pop was an integer division (a ping-pong's rdma send and receive
//! ran four to six of them per message, each tens of cycles on a real core and a helper call
//! under TCG). The capacity a caller asked for is kept apart and bounds `len`, so a queue
//! holds exactly what it was sized for.

/// A fixed-capacity FIFO (allocated at setup, never grown).
pub(super) struct Fifo<T: Copy> {
    /// `buf.len()` is a power of two, `>= cap`.
    buf: Box<[T]>,
    /// `buf.len() - 1`.
    mask: usize,
    /// The most entries queued at once (what `new` was given, at least 1).
    cap: usize,
    /// `< buf.len()`.
    head: usize,
    /// Entries queued, `<= cap`.
    pub(super) len: usize,
}

impl<T: Copy + Default> Fifo<T> {
    pub(super) fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        let n = cap.next_power_of_two();
        Self {
            buf: vec![T::default(); n].into_boxed_slice(),
            mask: n - 1,
            cap,
            head: 0,
            len: 0,
        }
    }
    #[inline(always)]
    pub(super) fn push(&mut self, v: T) -> bool {
        if self.len == self.cap {
            return false;
        }
        let i = (self.head + self.len) & self.mask;
        // Indexed with its check (a compare: the compiler cannot tell that `mask < buf.len()`).
        self.buf[i] = v;
        self.len += 1;
        true
    }
    #[inline(always)]
    pub(super) fn front(&self) -> Option<T> {
        (self.len > 0).then(|| self.buf[self.head])
    }
    /// The `i`-th entry from the front, to change in place.
    #[inline]
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if i < self.len {
            self.buf.get_mut((self.head + i) & self.mask)
        } else {
            None
        }
    }
    #[inline(always)]
    pub(super) fn pop(&mut self) -> Option<T> {
        let v = self.front()?;
        self.head = (self.head + 1) & self.mask;
        self.len -= 1;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::Fifo;

    #[test]
    fn holds_exactly_its_capacity_in_order_across_wraps() {
        // 5 is not a power of two: the storage is 8, the queue still holds 5.
        let mut f = Fifo::<u32>::new(5);
        let mut next_in = 0u32;
        let mut next_out = 0u32;
        for round in 0..20 {
            // Fill to the brim, then take a varying number out, so that head wraps at every
            // offset of the storage.
            while f.push(next_in) {
                next_in += 1;
            }
            assert_eq!(f.len, 5, "round {round}");
            assert_eq!(f.front(), Some(next_out));
            for _ in 0..(round % 5 + 1) {
                assert_eq!(f.pop(), Some(next_out));
                next_out += 1;
            }
        }
        while let Some(v) = f.pop() {
            assert_eq!(v, next_out);
            next_out += 1;
        }
        assert_eq!(next_out, next_in);
        assert_eq!(f.front(), None);
        assert!(f.get_mut(0).is_none());
    }

    #[test]
    fn get_mut_sees_the_ith_entry_from_the_front() {
        let mut f = Fifo::<u32>::new(3);
        for v in [10, 11, 12] {
            assert!(f.push(v));
        }
        assert_eq!(f.pop(), Some(10));
        assert!(f.push(13)); // wraps in a storage of 4
        *f.get_mut(2).unwrap() += 100;
        assert!(f.get_mut(3).is_none());
        assert_eq!(
            [f.pop(), f.pop(), f.pop(), f.pop()],
            [Some(11), Some(12), Some(113), None]
        );
    }

    #[test]
    fn a_zero_capacity_holds_one() {
        let mut f = Fifo::<u8>::new(0);
        assert!(f.push(1));
        assert!(!f.push(2));
        assert_eq!(f.pop(), Some(1));
    }
}
