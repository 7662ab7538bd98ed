//! `--server`: serves clients one after another until Ctrl-C (or the first one leaves, with
//! `--once`).

use std::time::Duration;

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
            "bench server listening on {endpoint} (fabric {}, mode {}, buffers {} x {} B); Ctrl-C to stop\n",
            self.fabric.as_str(),
            g.mode.as_str(),
            g.buffers,
            g.buffer_size
        ));
        loop {
            if stop_requested() {
                return Ok(true);
            }
            let Some(mut conn) =
                engine::accept(&engine, &mut listener, Duration::from_millis(200))?
            else {
                continue;
            };
            eprintln!("bench server: client connected");
            match proto::serve(&mut conn, g.idle, g.buffer_size, Duration::from_secs(60)) {
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
