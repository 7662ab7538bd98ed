//! `--server`: serves clients one after another until Ctrl-C (or the first one leaves, with
//! `--once`).

use std::time::Duration;

use super::conn::BenchConn;
use super::{engine, proto, stop_requested, Plan};
use crate::error::BenchError;
use crate::machine::pin_current;
use crate::report;

impl Plan {
    /// `--server`: serve clients until Ctrl-C (or the first client leaves, with `--once`).
    pub(super) fn serve(&self, endpoint: String) -> Result<bool, BenchError> {
        let g = &self.groups[0];
        pin_current(self.app_cores[0])?;
        let engine = engine::build(g)?;
        let mut listener = engine::listen(&engine, &endpoint)?;
        report::print(&format!(
            "bench server listening on {endpoint} (fabric {}, mode {}, idle {}, core {}); Ctrl-C to stop\n\
             settings a client must share: --buffers {} --buffer-size {} --max-size {} --large-buffers {} --large-threshold {} --depth {} --batch {} --inline-threshold {} (a client's --app-batch, --size and --verify travel in its requests)\n",
            self.fabric.as_str(),
            g.mode.as_str(),
            g.idle.as_str(),
            self.app_cores[0],
            g.buffers,
            g.buffer_size,
            g.max_message_size,
            g.large_buffers,
            g.effective_large_threshold(),
            g.depth,
            g.batch,
            g.inline_threshold,
        ));
        loop {
            if stop_requested() {
                return Ok(true);
            }
            let Some(mut conn) =
                engine::accept(&engine, g, &mut listener, Duration::from_millis(200))?
            else {
                continue;
            };
            eprintln!("bench server: client connected");
            let limit = conn.max_message_size().unwrap_or(g.buffer_size);
            match proto::serve_with(
                &mut conn,
                g.idle,
                limit,
                g.buffer_size,
                Duration::from_secs(60),
                Some(g.settings()),
            ) {
                Ok(()) => eprintln!("bench server: client done"),
                Err(BenchError::Interrupted) => return Ok(true),
                Err(e) => eprintln!("bench server: client failed: {e}"),
            }
            if self.once {
                return Ok(false);
            }
        }
    }
}
