//! bench/engine.rs — the seam between the bench runner and the load
//! generators: what a run asks of an engine (`EngineJob`) and the one
//! trait every engine implements (`Engine`). The engines themselves live
//! in `engines/` (one file each: nvmf perf in process, fio with our
//! external ioengine, fio on a kernel block device, spdk_nvme_perf, fio
//! client/server across several machines); the runner (`run.rs`) picks
//! one per spec and never knows which.

use super::results::EngineResult;
use super::spec::WorkloadSpec;
use crate::trid::TransportId;
use std::sync::atomic::AtomicBool;

/// Edges of the measured window, reported by the engine to the runner so
/// that CPU time, `perf stat` counts and the target's counters are read
/// exactly around the measured part (ramp excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Ramp is over; measurement starts now.
    Start,
    /// Measurement ended (before connections are torn down).
    End,
}

/// One run for an engine to do.
pub struct EngineJob<'a> {
    /// Where the target listens (subnqn included).
    pub trid: &'a TransportId,
    /// Namespace to load.
    pub nsid: u32,
    pub workload: &'a WorkloadSpec,
    /// CPUs to pin the initiator's threads to (one per queue, as many as
    /// the workload's queues; may be empty = unpinned).
    pub pin: &'a [usize],
    /// Host NQN to connect with (None: the engine's default).
    pub host_nqn: Option<&'a str>,
    /// Set by Ctrl-C: stop as soon as possible and return what was
    /// measured (the result then covers a shorter window).
    pub stop: &'a AtomicBool,
}

/// A load generator.
pub trait Engine {
    /// Short name recorded in results (`nvmf-perf`, `fio`, ...).
    fn name(&self) -> &'static str;
    /// Version string of the engine (recorded in the machine context).
    fn version(&self) -> String;
    /// Client machines that generate the load together
    /// (`Measurement::clients`): 1 unless the engine drives several
    /// (fio client/server).
    fn clients(&self) -> u32 {
        1
    }
    /// Called by the runner before each run with the target it loads;
    /// engines with per-target settings (fio-kernel: the target's
    /// `device`) take them here.
    fn for_target(&mut self, _target: &super::spec::Target) {}
    /// Run `job`: connect, ramp for `workload.ramp_s`, call
    /// `window(Window::Start)`, load for `workload.runtime_s` (or until
    /// `stop`), call `window(Window::End)`, disconnect, and return what
    /// the measured window saw. An error means the run produced no valid
    /// measurement (its text is recorded as the run's failure).
    fn run(
        &mut self,
        job: &EngineJob<'_>,
        window: &mut dyn FnMut(Window),
    ) -> anyhow::Result<EngineResult>;
}
