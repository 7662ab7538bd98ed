//! The control thread (work in progress).
