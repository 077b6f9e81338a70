//! bench/targets/mod.rs — the targets `nvmf bench run` measures, one file
//! each. Here so far: `spdk.rs` (SPDK nvmf_tgt started by the harness) and
//! `kernel.rs` (the Linux kernel target set up through configfs), and
//! `spdk_kernel_target`, the driver choice for those two kinds (to be
//! folded into the runner's `for_target`).

pub mod kernel;
pub mod spdk;

use super::spec::{Target, TargetKind};
use super::target::BenchTarget;

/// The driver for a `kind = "spdk"` or `kind = "kernel"` target (None for
/// other kinds). `node_cpus`: CPUs of the NIC's NUMA node;
/// `initiator_cpus`: CPUs the initiator is pinned to (SPDK's reactors avoid
/// them unless the spec names `cores`); `no_pin`: leave SPDK on its default
/// core mask.
pub fn spdk_kernel_target(
    t: &Target,
    node_cpus: &[usize],
    initiator_cpus: &[usize],
    no_pin: bool,
) -> Option<Box<dyn BenchTarget>> {
    Some(match &t.kind {
        TargetKind::Spdk(s) => {
            let cpus = if no_pin {
                Vec::new()
            } else {
                spdk::target_cpus(node_cpus, initiator_cpus)
            };
            Box::new(spdk::SpdkTarget::new(&t.name, s, t.nsid, &cpus))
        }
        TargetKind::Kernel(k) => Box::new(kernel::KernelTarget::new(&t.name, k, t.nsid)),
        _ => return None,
    })
}
