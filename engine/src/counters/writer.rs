//! The writing side: one memory-mapped counters file per engine, written by the control thread
//! with relaxed stores (no read-modify-write), removed when the engine closes.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::layout::*;

/// A counters file mapped for writing. Every store is a relaxed (plain) store of one word; the
/// publication sequence (odd while an update runs) lets a reader take a consistent snapshot.
pub(crate) struct CountersFile {
    /// Start of the mapping: `len` bytes, page-aligned, mapped shared and writable.
    base: NonNull<u8>,
    len: usize,
    path: PathBuf,
    pollers: usize,
    /// The publication sequence as last stored (only this writer stores it).
    seq: u64,
}

// SAFETY: the mapping is owned by this value (unmapped in `drop`) and written only through
// `&mut self` or atomic stores; nothing in it is tied to the creating thread.
unsafe impl Send for CountersFile {}
// SAFETY: shared references only perform atomic stores and loads on the mapping.
unsafe impl Sync for CountersFile {}

impl std::fmt::Debug for CountersFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountersFile")
            .field("path", &self.path)
            .field("pollers", &self.pollers)
            .finish_non_exhaustive()
    }
}

impl CountersFile {
    /// Creates `path` (which must not exist) with `pollers` poller slots and [`CONN_SLOTS`]
    /// connection slots, maps it and writes the header.
    pub(crate) fn create(path: &Path, name: &str, pollers: usize) -> io::Result<CountersFile> {
        let len = file_bytes(pollers, CONN_SLOTS);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        let mapped = file.set_len(len as u64).and_then(|()| map(&file, len));
        let base = match mapped {
            Ok(b) => b,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        let f = CountersFile {
            base,
            len,
            path: path.to_owned(),
            pollers,
            seq: 0,
        };
        f.store(H_VERSION, LAYOUT_VERSION);
        f.store(H_PID, u64::from(std::process::id()));
        f.store(
            H_PROC_START,
            super::proc_start_ticks(std::process::id()).unwrap_or(0),
        );
        f.store(H_CREATED_NS, super::unix_ns());
        f.store(H_POLLER_SLOTS, pollers as u64);
        f.store(H_CONN_SLOTS, CONN_SLOTS as u64);
        f.store_text(H_NAME, name);
        // The magic last: a reader that sees it sees the header.
        f.word(H_MAGIC * 8).store(MAGIC, Ordering::Release);
        Ok(f)
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The word at byte offset `at`.
    fn word(&self, at: usize) -> &AtomicU64 {
        assert!(
            at % 8 == 0 && at + 8 <= self.len,
            "offset {at} outside the file"
        );
        // SAFETY: `at` is inside the mapping and 8-byte aligned (the mapping is page-aligned);
        // the mapping lives as long as `self`, and every access to it is atomic.
        unsafe { &*self.base.as_ptr().add(at).cast::<AtomicU64>() }
    }

    fn store(&self, word: usize, v: u64) {
        self.word(word * 8).store(v, Ordering::Relaxed);
    }

    /// Stores `text` NUL-padded (cut at a character boundary) into `(offset, len)`.
    fn store_text(&self, (at, len): (usize, usize), text: &str) {
        let mut cut = text.len().min(len);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let bytes = &text.as_bytes()[..cut];
        for w in 0..len / 8 {
            let mut b = [0u8; 8];
            let from = (w * 8).min(bytes.len());
            let to = (w * 8 + 8).min(bytes.len());
            b[..to - from].copy_from_slice(&bytes[from..to]);
            self.word(at + w * 8)
                .store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
    }

    /// Starts an update: the sequence turns odd.
    pub(crate) fn begin(&mut self) {
        self.seq = self.seq.wrapping_add(1) | 1;
        self.word(H_SEQ * 8).store(self.seq, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
    }

    /// Ends an update: the sequence turns even, with the publication time.
    pub(crate) fn end(&mut self) {
        self.store(H_PUBLISHED_NS, super::unix_ns());
        self.seq = self.seq.wrapping_add(1);
        self.word(H_SEQ * 8).store(self.seq, Ordering::Release);
    }

    /// The engine counters, in [`ENGINE_FIELDS`] order, and the pollers in use.
    pub(crate) fn set_engine(&self, vals: &[u64; ENGINE_FIELDS.len()], pollers_used: usize) {
        for (i, v) in vals.iter().enumerate() {
            self.store(H_ENGINE + i, *v);
        }
        self.store(H_POLLERS_USED, pollers_used as u64);
    }

    /// Poller slot `i` (ignored beyond the slots): its core and counters in
    /// [`POLLER_FIELDS`] order.
    pub(crate) fn set_poller(
        &self,
        i: usize,
        core: Option<usize>,
        vals: &[u64; POLLER_FIELDS.len()],
    ) {
        if i >= self.pollers {
            return;
        }
        let at = poller_at(i);
        self.word(at)
            .store(core.map_or(u64::MAX, |c| c as u64), Ordering::Relaxed);
        for (k, v) in vals.iter().enumerate() {
            self.word(at + 8 + k * 8).store(*v, Ordering::Relaxed);
        }
    }

    /// Connection slot `i` (ignored beyond the slots).
    pub(crate) fn set_conn(&self, i: usize, conn: &ConnSlot<'_>) {
        if i >= CONN_SLOTS {
            return;
        }
        let at = conn_at(self.pollers, i);
        self.word(at + C_ID * 8)
            .store(conn.id.wrapping_add(1), Ordering::Relaxed);
        self.word(at + C_STATE * 8)
            .store(conn.state.code(), Ordering::Relaxed);
        for (k, v) in conn.counters.iter().enumerate() {
            self.word(at + (C_COUNTERS + k) * 8)
                .store(*v, Ordering::Relaxed);
        }
        self.store_text((at + C_FABRIC.0, C_FABRIC.1), conn.fabric);
        self.store_text((at + C_REASON.0, C_REASON.1), conn.reason);
        self.store_text((at + C_ENDPOINT.0, C_ENDPOINT.1), conn.endpoint);
    }

    /// Marks connection slot `i` free.
    pub(crate) fn clear_conn(&self, i: usize) {
        if i < CONN_SLOTS {
            self.word(conn_at(self.pollers, i) + C_ID * 8)
                .store(0, Ordering::Relaxed);
        }
    }
}

/// What one connection slot shows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnSlot<'a> {
    pub(crate) id: u64,
    pub(crate) state: ConnState,
    pub(crate) fabric: &'a str,
    pub(crate) reason: &'a str,
    pub(crate) endpoint: &'a str,
    /// In [`CONN_FIELDS`] order.
    pub(crate) counters: [u64; CONN_FIELDS.len()],
}

impl Drop for CountersFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        // SAFETY: `base`/`len` are the mapping made in `create`, unmapped only here; no
        // reference into it outlives `self`.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// Maps `len` bytes of `file` shared and writable.
fn map(file: &std::fs::File, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping of an open file descriptor of at least `len` bytes; the
    // kernel picks the address. The descriptor may be closed afterwards.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}
