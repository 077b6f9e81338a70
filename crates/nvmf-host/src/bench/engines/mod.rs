//! bench/engines/mod.rs — the load generators `nvmf bench run` can use,
//! one file each. Here so far: `spdk_perf.rs` (SPDK's spdk_nvme_perf) and
//! `spdk_perf_engine`, its choice for a spec (to be folded into the
//! runner's `for_spec`).

pub mod spdk_perf;

use super::engine::Engine;
use super::spec::{BenchSpec, EngineKind};

/// The spdk-perf engine when `spec` asks for it (None for other engines).
pub fn spdk_perf_engine(
    spec: &BenchSpec,
    host_nqn: Option<String>,
) -> Option<anyhow::Result<Box<dyn Engine>>> {
    (spec.engine == EngineKind::SpdkPerf).then(|| {
        spdk_perf::SpdkPerfEngine::new(spec.spdk_perf.as_deref(), host_nqn)
            .map(|e| Box::new(e) as Box<dyn Engine>)
    })
}
