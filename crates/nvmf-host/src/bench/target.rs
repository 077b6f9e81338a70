//! bench/target.rs — the seam between the bench runner and the targets it
//! measures: one trait (`BenchTarget`) for a target the harness starts and
//! stops itself (nvmfd from a config, SPDK `nvmf_tgt`, the Linux kernel
//! target) or one that is already running (a transport ID). The drivers
//! live in `targets/`, one file each.

use crate::trid::TransportId;

/// Where a started target can be reached.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub trid: TransportId,
    /// The namespace to load.
    pub nsid: u32,
}

/// A target under test.
pub trait BenchTarget {
    /// Kind name recorded in results (`nvmfd`, `trid`, `spdk`, `kernel`).
    fn kind(&self) -> &'static str;
    /// Start it if the harness owns it (a no-op for a running target) and
    /// say where to connect. Called before its first run, and again after
    /// `stop` when the matrix comes back to it (only one harness-started
    /// target runs at a time), so it must start afresh after a stop.
    fn start(&mut self) -> anyhow::Result<Endpoint>;
    /// Local processes whose CPU time is the target's (empty: unknown or
    /// remote; the target's CPU figures are then left out).
    fn pids(&self) -> Vec<u32>;
    /// CPUs the target's reactors were pinned to (empty: not pinned by us).
    fn cpus(&self) -> Vec<usize>;
    /// The target's own cumulative I/O counters (reads, writes) for the
    /// namespace under load, when it exposes them.
    fn io_counters(&mut self) -> Option<(u64, u64)>;
    /// Version string (recorded in the machine context).
    fn version(&self) -> String;
    /// Things to record with each run about how the target was set up
    /// (e.g. SPDK on plain memory instead of hugepages); default none.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// Stop it if the harness started it. Called when the matrix moves to
    /// another target and at the end (also after Ctrl-C or a failure);
    /// may be called when already stopped; must not panic.
    fn stop(&mut self);
}
