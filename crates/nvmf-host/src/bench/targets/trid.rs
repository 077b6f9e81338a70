//! bench/targets/trid.rs — a target that is already running, reached by
//! its transport ID: nothing to start or stop, no local processes, no
//! counters (its CPU figures and the counter cross-check are left out).

use crate::bench::target::{BenchTarget, Endpoint};
use crate::trid::TransportId;

pub struct TridTarget {
    trid: TransportId,
}

impl TridTarget {
    pub fn new(trid: TransportId) -> TridTarget {
        TridTarget { trid }
    }
}

impl BenchTarget for TridTarget {
    fn kind(&self) -> &'static str {
        "trid"
    }
    fn start(&mut self) -> anyhow::Result<Endpoint> {
        Ok(Endpoint {
            nsid: self.trid.nsid.unwrap_or(1),
            trid: self.trid.clone(),
        })
    }
    fn pids(&self) -> Vec<u32> {
        Vec::new()
    }
    fn cpus(&self) -> Vec<usize> {
        Vec::new()
    }
    fn io_counters(&mut self) -> Option<(u64, u64)> {
        None
    }
    fn version(&self) -> String {
        "unknown (running target)".into()
    }
    fn stop(&mut self) {}
}
