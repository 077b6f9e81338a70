//! bench/engines/mod.rs — the load generators `nvmf bench run` can use,
//! one file each, and the choice of one for a spec (`for_spec`):
//! `perf.rs` (this crate's `nvmf perf`, in process) and `spdk_perf.rs`
//! (SPDK's spdk_nvme_perf).

pub mod perf;
pub mod spdk_perf;

use super::engine::Engine;
use super::spec::{BenchSpec, EngineKind};
use std::time::Duration;

/// Settings every engine may use (from the command line).
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Host NQN to connect with (None: the engine's default).
    pub host_nqn: Option<String>,
    /// Busy-poll window of the in-process engine (`nvmf perf --poll-us`).
    pub poll: Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            host_nqn: None,
            poll: Duration::from_micros(crate::perf::DEFAULT_POLL_US),
        }
    }
}

/// The engine that runs `spec`'s workloads.
pub fn for_spec(spec: &BenchSpec, opts: &EngineOptions) -> anyhow::Result<Box<dyn Engine>> {
    Ok(match spec.engine {
        EngineKind::NvmfPerf => Box::new(perf::PerfEngine::new(opts.clone())),
        EngineKind::SpdkPerf => Box::new(spdk_perf::SpdkPerfEngine::new(
            spec.spdk_perf.as_deref(),
            opts.host_nqn.clone(),
        )?),
        other => anyhow::bail!("engine {other:?} is not available in this build"),
    })
}
