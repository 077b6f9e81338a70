//! Owns handing registered Ceph clusters (`bdev_rbd_register_cluster`) to the
//! rbd backend, which keeps one connection per cluster that the rbd bdevs
//! naming it share. Called on the control plane only (startup, RPC thread):
//! registering may connect to the cluster, which takes network round trips.
//!
//! The rbd backend's cluster registry lives in nvmf-backend (its rbd
//! module); until this build links one, registering only records the
//! cluster in the model and an rbd bdev that names it fails to open with the
//! backend registry's error.

use nvmf_config::RbdCluster;

/// Make cluster `c` known to the rbd backend.
pub fn register(c: &RbdCluster) -> Result<(), String> {
    tracing::info!(cluster = %c.name, "rbd cluster registered");
    Ok(())
}

/// Forget cluster `name` (no bdev in the configuration uses it: the RPC
/// refuses otherwise). A failure is only logged: the configuration no
/// longer has the cluster either way.
pub fn unregister(name: &str) {
    tracing::info!(cluster = %name, "rbd cluster unregistered");
}
