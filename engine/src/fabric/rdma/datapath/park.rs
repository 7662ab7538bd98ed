//! [`Parking`]: a bounded, preallocated FIFO of items waiting for their owner, drained in
//! arrival order. The poller parks here the receive completions of QPs not attached yet
//! ([`rdma`](super#protocol), Protocol), and replays them once their connection is.
//!
//! Generic and free of verbs, so its ordering rules are tested on any host.

/// A ring of at most `capacity` items, allocated once; [`push`](Parking::push) and
/// [`drain_in_order`](Parking::drain_in_order) never allocate.
#[derive(Debug)]
pub(super) struct Parking<T> {
    slots: Box<[Option<T>]>,
    /// Index of the oldest item.
    head: usize,
    len: usize,
}

impl<T> Parking<T> {
    /// An empty buffer with room for `capacity` items (at least 1).
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            slots: (0..capacity.max(1)).map(|_| None).collect(),
            head: 0,
            len: 0,
        }
    }

    /// Nothing is parked (the one check the hot path makes).
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Items parked now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Parks `item` behind every item already parked, or gives it back when the buffer is full.
    ///
    /// # Errors
    ///
    /// `Err(item)` when full.
    #[inline]
    pub(super) fn push(&mut self, item: T) -> Result<(), T> {
        let cap = self.slots.len();
        if self.len == cap {
            return Err(item);
        }
        self.slots[(self.head + self.len) % cap] = Some(item);
        self.len += 1;
        Ok(())
    }

    /// Offers every parked item to `take`, oldest first; an item for which `take` returns
    /// `true` is removed (consumed), the others stay parked in their order, ahead of anything
    /// pushed later. Returns how many were removed.
    pub(super) fn drain_in_order(&mut self, mut take: impl FnMut(&mut T) -> bool) -> usize {
        let cap = self.slots.len();
        let n = self.len;
        let mut kept = 0;
        for i in 0..n {
            let from = (self.head + i) % cap;
            let remove = match &mut self.slots[from] {
                Some(item) => take(item),
                None => true,
            };
            if remove {
                self.slots[from] = None;
            } else {
                // Compact towards the head; kept <= i, so the target is free or `from` itself.
                let to = (self.head + kept) % cap;
                if to != from {
                    self.slots[to] = self.slots[from].take();
                }
                kept += 1;
            }
        }
        self.len = kept;
        if kept == 0 {
            self.head = 0;
        }
        n - kept
    }
}

/// When the parked items are worth another look: the look (a lookup per QP, a scan of the
/// poller's table for each QP not attached, a clock read) is only useful once a connection was
/// attached since the last one, or to age out the items of a QP that never comes.
///
/// Offered at every `poll_shared` instead, items of a QP that never got attached (such as an
/// accept given up after its peer had sent) made every cycle of the poller pay that look until
/// they aged out: in the Soft-RoCE VM, about 8500 instructions a look for the 10 s of
/// `PARK_MAX_AGE`.
#[derive(Debug)]
pub(super) struct ReplayGate {
    /// A connection was attached since the last look.
    attached: bool,
    /// Polls with items parked left before a look anyway (for their ageing).
    countdown: u32,
}

impl ReplayGate {
    /// Polls with items parked between two looks when no connection is attached: the ageing
    /// of `PARK_MAX_AGE` (10 s) needs no finer step (a cycle takes tens of ns natively, a
    /// few µs under TCG: a look every ms to tens of ms).
    pub(super) const AGE_EVERY: u32 = 1 << 14;

    /// No connection attached yet.
    pub(super) fn new() -> Self {
        Self {
            attached: false,
            countdown: Self::AGE_EVERY,
        }
    }

    /// A connection was attached: the next poll with items parked looks at them.
    #[inline]
    pub(super) fn attached(&mut self) {
        self.attached = true;
    }

    /// Asked by a poll that has items parked: whether it looks at them now.
    #[inline]
    pub(super) fn due(&mut self) -> bool {
        self.countdown -= 1;
        if self.attached || self.countdown == 0 {
            self.attached = false;
            self.countdown = Self::AGE_EVERY;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::{Parking, ReplayGate};

    #[test]
    fn the_gate_opens_after_an_attach_and_every_age_step_only() {
        let mut g = ReplayGate::new();
        // Nothing attached: closed until the ageing step.
        for _ in 1..ReplayGate::AGE_EVERY {
            assert!(!g.due());
        }
        assert!(g.due());
        assert!(!g.due());
        // An attach opens it once, at the next poll, and restarts the ageing step.
        g.attached();
        assert!(g.due());
        assert!(!g.due());
        for _ in 2..ReplayGate::AGE_EVERY {
            assert!(!g.due());
        }
        assert!(g.due());
        // Attaches between two polls open it once.
        g.attached();
        g.attached();
        assert!(g.due());
        assert!(!g.due());
    }

    /// (key, sequence): a key stands for a QP, the sequence for arrival order within it.
    fn drain_keys(p: &mut Parking<(u32, u32)>, ready: &[u32], out: &mut Vec<(u32, u32)>) -> usize {
        p.drain_in_order(|&mut (k, s)| {
            if ready.contains(&k) {
                out.push((k, s));
                true
            } else {
                false
            }
        })
    }

    #[test]
    fn replays_in_arrival_order_and_keeps_the_rest_in_order() {
        let mut p = Parking::new(8);
        for (k, s) in [(1, 0), (2, 0), (1, 1), (3, 0), (2, 1), (1, 2)] {
            p.push((k, s)).unwrap();
        }
        let mut out = Vec::new();
        assert_eq!(drain_keys(&mut p, &[1], &mut out), 3);
        assert_eq!(out, [(1, 0), (1, 1), (1, 2)]);
        assert_eq!(p.len(), 3);
        // Newer items of a still-parked key go behind the older ones.
        p.push((2, 2)).unwrap();
        out.clear();
        assert_eq!(drain_keys(&mut p, &[2, 3], &mut out), 4);
        assert_eq!(out, [(2, 0), (3, 0), (2, 1), (2, 2)]);
        assert!(p.is_empty());
    }

    #[test]
    fn full_buffer_gives_the_item_back_and_wraps_after_draining() {
        let mut p = Parking::new(3);
        for s in 0..3 {
            p.push((7, s)).unwrap();
        }
        assert_eq!(p.push((7, 3)), Err((7, 3)));
        let mut out = Vec::new();
        // Remove the first only: the ring's head moves, the next pushes wrap around.
        let mut first = true;
        assert_eq!(
            p.drain_in_order(|_| std::mem::replace(&mut first, false)),
            1
        );
        p.push((7, 3)).unwrap();
        assert_eq!(p.push((7, 4)), Err((7, 4)));
        assert_eq!(drain_keys(&mut p, &[7], &mut out), 3);
        assert_eq!(out, [(7, 1), (7, 2), (7, 3)]);
        assert!(p.is_empty());
    }

    /// Random pushes and drains against a model (a `VecDeque`): the same items, the same order.
    #[test]
    fn matches_a_fifo_model() {
        use std::collections::VecDeque;
        let mut p = Parking::new(16);
        let mut model: VecDeque<(u32, u32)> = VecDeque::new();
        let mut seq = [0u32; 4];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..10_000 {
            if rnd() % 3 != 0 {
                let k = (rnd() % 4) as u32;
                let item = (k, seq[k as usize]);
                let full = model.len() == 16;
                assert_eq!(p.push(item).is_err(), full);
                if !full {
                    seq[k as usize] += 1;
                    model.push_back(item);
                }
            } else {
                let ready: Vec<u32> = (0..4).filter(|_| rnd() % 2 == 0).collect();
                let mut out = Vec::new();
                drain_keys(&mut p, &ready, &mut out);
                let want: Vec<_> = model
                    .iter()
                    .copied()
                    .filter(|(k, _)| ready.contains(k))
                    .collect();
                model.retain(|(k, _)| !ready.contains(k));
                assert_eq!(out, want);
                assert_eq!(p.len(), model.len());
            }
        }
    }
}
