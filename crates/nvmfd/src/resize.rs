//! Owns the `nvmfd-resize` control thread: it applies the bdev size changes
//! backends notice by themselves (an `rbd resize` done by another client,
//! reported through `Backend::watch_size` on a library thread that only
//! sends a `SizeChange` message). Applying one sets the size of every
//! namespace on that bdev and tells their controllers (Changed Namespace
//! List, Namespace Attribute Changed): control-plane work, never on a
//! reactor and never on the backend's thread.

use std::sync::Arc;

use nvmf_core::target::Target;
use tracing::info;

/// Start the thread (once per target; it ends with the process).
pub fn spawn(target: &Arc<Target>) -> std::io::Result<()> {
    let Some(rx) = target.take_size_changes() else {
        return Ok(());
    };
    let target = Arc::downgrade(target);
    std::thread::Builder::new()
        .name("nvmfd-resize".to_string())
        .spawn(move || {
            while let Ok(change) = rx.recv() {
                let Some(t) = target.upgrade() else { return };
                let hit = t.apply_size_change(&change);
                if !hit.is_empty() {
                    info!(
                        bdev = %change.bdev,
                        num_blocks = change.num_blocks,
                        namespaces = ?hit,
                        "bdev size changed: namespaces resized, hosts notified"
                    );
                }
            }
        })
        .map(|_| ())
}
