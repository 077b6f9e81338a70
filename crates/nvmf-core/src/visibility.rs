//! Per-host namespace visibility (SPDK's `no_auto_visible`,
//! `nvmf_ns_add_host` / `nvmf_ns_remove_host`; docs/VISIBILITY.md).
//!
//! Owns [`Visibility`], a subsystem's rules (for each `no_auto_visible`
//! namespace, the host NQNs that see it) and the namespace table each host
//! gets: the subsystem's own `Arc<NamespaceTable>` when the host sees every
//! namespace (always so without rules), else a filtered copy, built once per
//! host and table generation and shared by every queue of that host's
//! controllers. A namespace a host does not see is an inactive NSID for it:
//! absent from the table its queues cache, so Identify, the active list, the
//! ANA log and I/O treat it as such with no check of their own and the I/O
//! lookup stays one vector index. The subsystem keeps this behind its
//! namespace lock and clears the views on every change (`subsystem.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::namespace::NamespaceTable;

/// Most per-host views kept at once; past this the cache starts over (a
/// flood of host NQNs costs rebuilds, never memory).
const VIEWS_MAX: usize = 1024;

/// Which hosts see a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NsVisibility {
    /// Every host (the default).
    All,
    /// `no_auto_visible`: only these hosts.
    Hosts(BTreeSet<String>),
}

impl NsVisibility {
    /// From the configuration's form: `None` = visible to all.
    pub fn from_hosts<'a>(hosts: Option<impl IntoIterator<Item = &'a String>>) -> NsVisibility {
        match hosts {
            None => NsVisibility::All,
            Some(h) => NsVisibility::Hosts(h.into_iter().cloned().collect()),
        }
    }

    /// Whether `hostnqn` sees the namespace.
    pub fn sees(&self, hostnqn: &str) -> bool {
        match self {
            NsVisibility::All => true,
            NsVisibility::Hosts(h) => h.contains(hostnqn),
        }
    }
}

/// A subsystem's visibility rules and the per-host tables built from them.
#[derive(Debug, Default)]
pub(crate) struct Visibility {
    /// NSID → hosts that see it, for `no_auto_visible` namespaces only.
    rules: BTreeMap<u32, BTreeSet<String>>,
    /// Host NQN → its filtered table (only hosts that do not see everything).
    views: HashMap<String, Arc<NamespaceTable>>,
}

impl Visibility {
    /// Whether `hostnqn` sees `nsid`.
    pub(crate) fn sees(&self, nsid: u32, hostnqn: &str) -> bool {
        self.rules.get(&nsid).is_none_or(|h| h.contains(hostnqn))
    }

    /// The rule of `nsid`.
    pub(crate) fn get(&self, nsid: u32) -> NsVisibility {
        match self.rules.get(&nsid) {
            None => NsVisibility::All,
            Some(h) => NsVisibility::Hosts(h.clone()),
        }
    }

    /// Replace the rule of `nsid`; returns the previous one. Drops every
    /// cached view (the caller bumps the table generation).
    pub(crate) fn set(&mut self, nsid: u32, v: NsVisibility) -> NsVisibility {
        self.views.clear();
        let old = match v {
            NsVisibility::All => self.rules.remove(&nsid),
            NsVisibility::Hosts(h) => self.rules.insert(nsid, h),
        };
        old.map_or(NsVisibility::All, NsVisibility::Hosts)
    }

    /// The table `hostnqn` sees, given the subsystem's `table`: `table`
    /// itself (same `Arc`) when nothing is hidden from the host.
    pub(crate) fn view(
        &mut self,
        table: &Arc<NamespaceTable>,
        hostnqn: &str,
    ) -> Arc<NamespaceTable> {
        if self.rules.is_empty() {
            return table.clone();
        }
        if let Some(v) = self.views.get(hostnqn) {
            return v.clone();
        }
        let hidden = |nsid: u32| self.rules.get(&nsid).is_some_and(|h| !h.contains(hostnqn));
        let view = if table.active_nsids().iter().any(|&n| hidden(n)) {
            Arc::new(table.filtered(|ns| !hidden(ns.nsid())))
        } else {
            table.clone()
        };
        if self.views.len() >= VIEWS_MAX {
            self.views.clear();
        }
        self.views.insert(hostnqn.to_string(), view.clone());
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, NullBackend};
    use crate::namespace::Namespace;

    fn ns(nsid: u32) -> Arc<Namespace> {
        let b: Arc<dyn Backend> = Arc::new(NullBackend::new("n", 512, 8));
        Arc::new(Namespace::new(nsid, b, [1; 16], [2; 8], [3; 16]))
    }

    fn hosts(h: &[&str]) -> NsVisibility {
        NsVisibility::Hosts(h.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn without_rules_every_host_shares_the_subsystem_table() {
        let table = Arc::new(NamespaceTable::from_namespaces([ns(1), ns(2)]));
        let mut v = Visibility::default();
        assert!(Arc::ptr_eq(&v.view(&table, "h1"), &table));
        // A rule that hides nothing from this host: still the same Arc.
        v.set(2, hosts(&["h1"]));
        assert!(Arc::ptr_eq(&v.view(&table, "h1"), &table));
        // A rule for an NSID not in the table hides nothing either.
        v.set(2, NsVisibility::All);
        v.set(7, hosts(&[]));
        assert!(Arc::ptr_eq(&v.view(&table, "h2"), &table));
    }

    #[test]
    fn filtered_views_per_host() {
        let table = Arc::new(NamespaceTable::from_namespaces([ns(1), ns(2), ns(3)]));
        let mut v = Visibility::default();
        v.set(1, hosts(&["h1"]));
        v.set(2, hosts(&["h2"]));
        let h1 = v.view(&table, "h1");
        let h2 = v.view(&table, "h2");
        let h3 = v.view(&table, "h3");
        assert_eq!(h1.active_nsids(), &[1, 3]);
        assert_eq!(h2.active_nsids(), &[2, 3]);
        assert_eq!(h3.active_nsids(), &[3]);
        assert!(h1.get(2).is_none() && h2.get(1).is_none() && h3.get(1).is_none());
        // Cached: the same Arc for the same host until something changes.
        assert!(Arc::ptr_eq(&v.view(&table, "h1"), &h1));
        v.set(1, hosts(&["h1", "h3"]));
        let h3b = v.view(&table, "h3");
        assert_eq!(h3b.active_nsids(), &[1, 3]);
        assert!(v.sees(1, "h3") && !v.sees(2, "h3") && v.sees(3, "h3"));
        assert_eq!(v.get(3), NsVisibility::All);
    }
}
