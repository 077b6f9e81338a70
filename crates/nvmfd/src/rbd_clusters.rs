//! Owns handing registered Ceph clusters (`bdev_rbd_register_cluster`) to the
//! rbd backend, which keeps one connection per cluster that the rbd bdevs
//! naming it share. Called on the control plane only (startup, RPC thread):
//! registering may connect to the cluster, which takes network round trips.
//!
//! The rbd backend's cluster registry lives in nvmf-backend
//! (`nvmf_backend::rbd::{register_cluster, unregister_cluster}`): it
//! connects (bounded by the connect timeouts, see docs/RBD.md) and keeps
//! the connection until the cluster is unregistered.

use nvmf_config::RbdCluster;

/// Make cluster `c` known to the rbd backend (connects to it).
pub fn register(c: &RbdCluster) -> Result<(), String> {
    nvmf_core::backend::rbd::register_cluster(c)?;
    tracing::info!(cluster = %c.name, "rbd cluster registered");
    Ok(())
}

/// Forget cluster `name` (no bdev in the configuration uses it: the RPC
/// refuses otherwise). A failure is only logged: the configuration no
/// longer has the cluster either way.
pub fn unregister(name: &str) {
    match nvmf_core::backend::rbd::unregister_cluster(name) {
        Ok(()) => tracing::info!(cluster = %name, "rbd cluster unregistered"),
        Err(e) => tracing::warn!(cluster = %name, "rbd cluster unregister: {e}"),
    }
}
