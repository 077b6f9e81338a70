//! bench/targets/mod.rs — the targets `nvmf bench run` measures, one file
//! each, and the driver for a spec target (`for_target`): `nvmfd.rs` (an
//! nvmfd the harness starts from a config), `trid.rs` (a target that is
//! already running), `spdk.rs` (SPDK nvmf_tgt started by the harness) and
//! `kernel.rs` (the Linux kernel target set up through configfs).

pub mod kernel;
pub mod nvmfd;
pub mod spdk;
pub mod trid;

use super::spec::{Target, TargetKind};
use super::target::BenchTarget;
use std::path::PathBuf;

/// What the harness knows when it sets a target up.
#[derive(Debug, Clone, Default)]
pub struct TargetOptions {
    /// The nvmfd binary (`--nvmfd`); None: next to the running `nvmf`,
    /// else on PATH.
    pub nvmfd: Option<PathBuf>,
    /// CPUs of the NIC's NUMA node (all online CPUs without NUMA information).
    pub node_cpus: Vec<usize>,
    /// CPUs the initiator is pinned to (a started target avoids them).
    pub initiator_cpus: Vec<usize>,
    /// Leave the target's threads unpinned (`--no-pin`).
    pub no_pin: bool,
}

/// The driver for spec target `t`.
pub fn for_target(t: &Target, opts: &TargetOptions) -> anyhow::Result<Box<dyn BenchTarget>> {
    Ok(match &t.kind {
        TargetKind::Nvmfd {
            config,
            addr,
            binary,
            args,
        } => {
            let mut o = opts.clone();
            if binary.is_some() {
                o.nvmfd = binary.clone();
            }
            Box::new(nvmfd::NvmfdTarget::new(&t.name, config, addr, &o).with_args(args))
        }
        TargetKind::Trid(trid) => Box::new(trid::TridTarget::new(trid.clone())),
        TargetKind::Spdk(s) => {
            // SPDK's reactors avoid the initiator's CPUs unless the spec
            // names `cores`; --no-pin leaves it on its default mask.
            let cpus = if opts.no_pin {
                Vec::new()
            } else {
                spdk::target_cpus(&opts.node_cpus, &opts.initiator_cpus)
            };
            Box::new(spdk::SpdkTarget::new(&t.name, s, t.nsid, &cpus))
        }
        TargetKind::Kernel(k) => Box::new(kernel::KernelTarget::new(&t.name, k, t.nsid)),
    })
}
