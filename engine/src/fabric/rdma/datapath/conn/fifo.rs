//! [`Fifo`]: the fixed-capacity queues of a connection (held send buffers, pending receives,
//! per-SEND message counts).

/// A fixed-capacity FIFO (allocated at setup, never grown).
pub(super) struct Fifo<T: Copy> {
    buf: Box<[T]>,
    head: usize,
    /// Entries queued, `<= buf.len()`.
    pub(super) len: usize,
}

impl<T: Copy + Default> Fifo<T> {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            buf: vec![T::default(); cap.max(1)].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }
    #[inline]
    pub(super) fn push(&mut self, v: T) -> bool {
        if self.len == self.buf.len() {
            return false;
        }
        let i = (self.head + self.len) % self.buf.len();
        self.buf[i] = v;
        self.len += 1;
        true
    }
    #[inline]
    pub(super) fn front(&self) -> Option<T> {
        (self.len > 0).then(|| self.buf[self.head])
    }
    /// The `i`-th entry from the front, to change in place.
    #[inline]
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if i < self.len {
            let n = self.buf.len();
            self.buf.get_mut((self.head + i) % n)
        } else {
            None
        }
    }
    #[inline]
    pub(super) fn pop(&mut self) -> Option<T> {
        let v = self.front()?;
        self.head = (self.head + 1) % self.buf.len();
        self.len -= 1;
        Some(v)
    }
}
