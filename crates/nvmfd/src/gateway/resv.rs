//! Reservations shared by a gateway group (docs/GATEWAY-GROUPS.md,
//! "Reservations in a group").
//!
//! Owns [`GroupResvStore`]: one RADOS object per namespace,
//! `nvmfd.group.<name>.resv.<nqn>.<nsid>`, holding the reservation state
//! in the PTPL file's JSON (registrants, holder, type, generation, PTPL
//! flag), written with a version guard; and [`take_over`], which a member
//! runs for every namespace of an ANA group before that group becomes
//! optimized on it: the namespace's state comes from RADOS (or, if the
//! group never saved one, what this member has is saved), so a host's
//! reservation survives the gateway it was made through.
//!
//! Only an ANA group's owner accepts reservation commands and I/O for its
//! namespaces (the others answer ANA Inaccessible), so only the owner
//! writes. The guard stops a late write of the previous owner after a
//! planned hand-over; after a takeover the previous owner is blocklisted.

use std::sync::{Arc, Mutex};

use nvmf_core::backend::rbd::group::{GroupObjects, WriteError};
use nvmf_core::reservation::{parse_ptpl, ptpl_json, ResvState, ResvStore};

/// One namespace's shared reservation state.
#[derive(Debug)]
pub struct GroupResvStore {
    objs: Arc<GroupObjects>,
    oid: String,
    /// The object's version this member last read or wrote (`None`: it did
    /// not exist). Saving before [`take_over`] set it fails.
    version: Mutex<Option<Option<u64>>>,
}

impl GroupResvStore {
    pub fn new(objs: Arc<GroupObjects>, group: &str, nqn: &str, nsid: u32) -> GroupResvStore {
        GroupResvStore {
            objs,
            oid: format!("nvmfd.group.{group}.resv.{nqn}.{nsid}"),
            version: Mutex::new(None),
        }
    }

    /// The group's state of the namespace and its version (`None`: never
    /// saved).
    fn load(&self) -> Result<(Option<ResvState>, Option<u64>), String> {
        match self.objs.read(&self.oid)? {
            None => Ok((None, None)),
            Some((bytes, v)) => {
                let st = parse_ptpl(&bytes).map_err(|e| format!("{}: {e}", self.oid))?;
                Ok((Some(st), Some(v)))
            }
        }
    }
}

impl ResvStore for GroupResvStore {
    fn save(&self, new: &ResvState) -> Result<(), String> {
        let mut v = self.version.lock().unwrap_or_else(|e| e.into_inner());
        let Some(expect) = *v else {
            return Err(format!("{}: not loaded by this member yet", self.oid));
        };
        let body = serde_json::to_vec(&ptpl_json(new)).unwrap_or_default();
        match self.objs.write(&self.oid, &body, expect) {
            Ok(nv) => {
                *v = Some(Some(nv));
                Ok(())
            }
            Err(WriteError::Conflict) => Err(format!(
                "{}: changed by another member (this one is no longer its owner)",
                self.oid
            )),
            Err(WriteError::Failed(e)) => Err(e),
        }
    }
}

/// Before namespace `ns` is served here as its group's owner: attach
/// `store` (the group's object of that namespace) if the namespace has no
/// store yet, and load its state from RADOS; a namespace the group never
/// saved keeps this member's state, which is saved.
pub fn take_over(
    store: &Arc<GroupResvStore>,
    ns: &nvmf_core::namespace::Namespace,
) -> Result<(), String> {
    let r = ns.reservations();
    if r.store().is_none() {
        r.attach_store(store.clone());
    }
    let (st, version) = store.load()?;
    *store.version.lock().unwrap_or_else(|e| e.into_inner()) = Some(version);
    match st {
        Some(st) => r.install(st),
        None => {
            // Never saved: what this member has becomes the group's.
            let cur = (*r.snapshot()).clone();
            if cur != ResvState::default() {
                store.save(&cur)?;
            }
        }
    }
    Ok(())
}
