//! The errors `bench` reports. Each says what was wrong and how to fix it; `main` prints the
//! chain and exits non-zero.

use std::path::PathBuf;

/// Everything that can stop a benchmark.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A flag value that makes no sense (zero iterations, size above buffer size, ...).
    #[error("invalid {flag}: {reason}")]
    InvalidArg {
        /// The flag, e.g. `--size`.
        flag: &'static str,
        /// Why it is invalid.
        reason: String,
    },
    /// A core id that this process cannot run on.
    #[error("{flag}: core {core} does not exist or is not allowed here (available cores: {available:?})")]
    UnknownCore {
        /// The flag naming the core.
        flag: &'static str,
        /// The bad id.
        core: usize,
        /// Ids we may use.
        available: Vec<usize>,
    },
    /// The OS refused to pin a thread.
    #[error("could not pin a thread to core {core}")]
    Pin {
        /// The core.
        core: usize,
    },
    /// The fabric was not compiled into this binary.
    #[error("fabric {fabric} not compiled in; rebuild with --features {fabric}")]
    FabricNotCompiled {
        /// Fabric name.
        fabric: &'static str,
    },
    /// An endpoint whose scheme does not match `--fabric`, or that cannot be parsed.
    #[error("bad endpoint `{endpoint}`: {reason}")]
    BadEndpoint {
        /// The endpoint.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The engine failed at some step.
    #[error("{step} failed: {source}")]
    Engine {
        /// What we were doing, e.g. `connect to shm://x`.
        step: String,
        /// The engine's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The peer closed the connection.
    #[error("the peer disconnected")]
    Disconnected,
    /// The peer broke the bench protocol.
    #[error("peer: {0}")]
    Protocol(String),
    /// A wait ran past its bound.
    #[error("timed out after {secs:.1} s waiting for {what}")]
    Timeout {
        /// What we waited for.
        what: &'static str,
        /// How long we waited.
        secs: f64,
    },
    /// Reading or writing a report file.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A thread of ours panicked (a bug: please report it).
    #[error("internal error: the {0} thread panicked")]
    ThreadPanicked(&'static str),
    /// A file given to `bench compare` is not a summary.json.
    #[error("{path}: not a bench summary.json")]
    BadSummary {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// `bench compare` found figures worse than `--fail-above` allows.
    #[error("{count} figure(s) regressed by more than {:.1} %", limit * 100.0)]
    Regression {
        /// How many figures regressed.
        count: usize,
        /// The `--fail-above` fraction.
        limit: f64,
    },
    /// Ctrl-C arrived before anything was measured.
    #[error("interrupted")]
    Interrupted,
}

impl BenchError {
    /// Shorthand for [`BenchError::InvalidArg`].
    pub fn invalid(flag: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArg {
            flag,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`BenchError::Io`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
