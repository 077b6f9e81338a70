//! The gateway group's shared record: the one RADOS object
//! `nvmfd.group.<name>` (docs/GATEWAY-GROUPS.md) every member reads and
//! changes with a version guard.
//!
//! Owns [`GroupDoc`] (members and their RADOS client addresses, each ANA
//! group's home and owner with the epoch of the change that made it the
//! owner, the members fenced so far), its JSON form, and the edits the
//! members make to it. Pure data: no I/O; the member thread
//! (`gateway::member`) reads and writes it, `gateway::plan` decides.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How many fencing records the document keeps (the newest).
pub const FENCED_KEPT: usize = 32;

/// The group's shared record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDoc {
    /// Bumped by every ownership change.
    pub epoch: u64,
    /// Members by gateway ID.
    pub members: BTreeMap<String, Member>,
    /// ANA groups by ANAGRPID.
    pub groups: BTreeMap<u32, AnaGroup>,
    /// Fencings, oldest first (at most [`FENCED_KEPT`]).
    #[serde(default)]
    pub fenced: Vec<Fenced>,
}

/// One member: its current incarnation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The RADOS client address of the incarnation that joined last
    /// (`rados_getaddrs`): what a survivor blocklists.
    pub address: String,
    /// When it joined (seconds since the epoch, the member's clock).
    pub joined: u64,
    /// The ANA groups it serves (namespaces in its configuration).
    #[serde(default)]
    pub serves: std::collections::BTreeSet<u32>,
}

/// One ANA group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnaGroup {
    /// The member that should own it while alive (`--gateway-ana-groups`
    /// of the member that first claimed it, or `nvmf gw move`).
    pub home: Option<String>,
    /// Who owns it now.
    pub owner: Option<Owner>,
}

/// The owner of an ANA group: one incarnation of a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub member: String,
    pub address: String,
    /// The document epoch of the change that made it the owner.
    pub epoch: u64,
}

/// A fencing: which incarnation, by whom, when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fenced {
    pub member: String,
    pub address: String,
    pub by: String,
    pub at: u64,
}

impl GroupDoc {
    /// Parses the object's bytes; an empty object is an empty group.
    pub fn parse(bytes: &[u8]) -> Result<GroupDoc, String> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(GroupDoc::default());
        }
        serde_json::from_slice(bytes).map_err(|e| format!("group record is not valid: {e}"))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Whether `address` was fenced already.
    pub fn is_fenced(&self, address: &str) -> bool {
        self.fenced.iter().any(|f| f.address == address)
    }

    /// Records a fencing, dropping the oldest past [`FENCED_KEPT`].
    pub fn record_fence(&mut self, f: Fenced) {
        if self.is_fenced(&f.address) {
            return;
        }
        self.fenced.push(f);
        let n = self.fenced.len();
        if n > FENCED_KEPT {
            self.fenced.drain(..n - FENCED_KEPT);
        }
    }

    /// Makes `member` at `address` the owner of `g` under a new epoch.
    pub fn set_owner(&mut self, g: u32, member: &str, address: &str) {
        self.epoch += 1;
        let e = self.epoch;
        self.groups.entry(g).or_default().owner = Some(Owner {
            member: member.to_string(),
            address: address.to_string(),
            epoch: e,
        });
    }

    /// The ANA groups `member` owns (any incarnation).
    pub fn owned_by(&self, member: &str) -> Vec<u32> {
        self.groups
            .iter()
            .filter(|(_, a)| a.owner.as_ref().is_some_and(|o| o.member == member))
            .map(|(g, _)| *g)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_empty() {
        assert_eq!(GroupDoc::parse(b"").unwrap(), GroupDoc::default());
        let mut d = GroupDoc::default();
        d.members.insert(
            "a".into(),
            Member {
                address: "v2:1.2.3.4:0/1".into(),
                joined: 5,
                serves: [3].into_iter().collect(),
            },
        );
        d.set_owner(3, "a", "v2:1.2.3.4:0/1");
        assert_eq!(d.epoch, 1);
        assert_eq!(GroupDoc::parse(&d.to_bytes()).unwrap(), d);
        assert!(GroupDoc::parse(b"{nope").is_err());
    }

    #[test]
    fn fencing_records_are_bounded() {
        let mut d = GroupDoc::default();
        for i in 0..100 {
            d.record_fence(Fenced {
                member: "a".into(),
                address: format!("x/{i}"),
                by: "b".into(),
                at: i,
            });
        }
        assert_eq!(d.fenced.len(), FENCED_KEPT);
        assert!(d.is_fenced("x/99") && !d.is_fenced("x/0"));
    }
}
