//! What a gateway group member does next, decided from the shared record
//! and who is alive (docs/GATEWAY-GROUPS.md).
//!
//! Owns the rules, as pure functions over a [`View`]:
//! - which incarnation owns an ANA group *alive* (its member's lease is held
//!   and the record's address of that member is still the owner's);
//! - who takes a group whose owner is not alive (its home if alive, else
//!   the least loaded live member serving it; ties by ID), and whether the
//!   old incarnation must be fenced first (always, unless it was already);
//! - when an owner hands a group back to its home (failback, `nvmf gw
//!   move`): planned, no fencing; and rebalancing: an owner with at least
//!   two groups more than another live member (counting groups without a
//!   live home) hands one of them over, one per tick;
//! - that such a hand-over waits until every host connected to the group
//!   here is connected to the receiver too (or the receiver has been alive
//!   longer than the failback wait): otherwise a host whose controller has
//!   not reconnected there yet would be left with no optimized path;
//! - the ANA state each group gets on this member's listeners: optimized
//!   on its live owner only, inaccessible everywhere else.
//!
//! No I/O here; `gateway::member` acts on the result.

use std::collections::{BTreeMap, BTreeSet};

use nvmf_config::AnaState;

use super::doc::{GroupDoc, Owner};

/// What one member sees at one moment.
pub struct View<'a> {
    pub me: &'a str,
    /// This incarnation's RADOS client address.
    pub address: &'a str,
    pub doc: &'a GroupDoc,
    /// Members whose lease is held now (this one included while its lease
    /// is valid).
    pub alive: &'a BTreeSet<String>,
    /// ANA groups this member serves, with their namespaces.
    pub serves: &'a BTreeSet<u32>,
    /// The hosts connected to each member, per ANA group (from each live
    /// incarnation's status object; this member's own count). Missing
    /// entries are no hosts.
    pub hosts: &'a HostsByMember,
    /// Members alive longer than the failback wait: a hand-over to them
    /// no longer waits for hosts.
    pub waited: &'a BTreeSet<String>,
}

/// Host NQNs with a controller on a subsystem holding a namespace of the
/// ANA group, per group, by member.
pub type HostsByMember = BTreeMap<String, BTreeMap<u32, BTreeSet<String>>>;

/// One step a member takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Become the owner of `group`. `fence`: the incarnation (member,
    /// address) to blocklist first.
    Take {
        group: u32,
        fence: Option<(String, String)>,
    },
    /// Give `group` to its home `to` (planned: drain, then hand over).
    HandOver { group: u32, to: String },
    /// `group` would be handed to `to`, but these hosts are connected to it
    /// here and not yet there: it stays here for now.
    WaitForHosts {
        group: u32,
        to: String,
        missing: BTreeSet<String>,
    },
}

/// The hosts connected to `g` on this member and not on `to`.
pub fn hosts_missing(v: &View<'_>, g: u32, to: &str) -> BTreeSet<String> {
    let of = |m: &str| v.hosts.get(m).and_then(|x| x.get(&g));
    let Some(mine) = of(v.me) else {
        return BTreeSet::new();
    };
    let theirs = of(to);
    mine.iter()
        .filter(|h| !theirs.is_some_and(|t| t.contains(*h)))
        .cloned()
        .collect()
}

/// A planned move of `g` to `to`, or the wait for its hosts.
fn hand_over(v: &View<'_>, g: u32, to: &str) -> Action {
    let missing = hosts_missing(v, g, to);
    if missing.is_empty() || v.waited.contains(to) {
        Action::HandOver {
            group: g,
            to: to.to_string(),
        }
    } else {
        Action::WaitForHosts {
            group: g,
            to: to.to_string(),
            missing,
        }
    }
}

/// Whether member `m` is alive: listed, holding its lease, and its listed
/// incarnation not fenced (a fenced client that renews before it learns
/// it was blocklisted is not a member any more; it must restart).
pub fn is_live(doc: &GroupDoc, alive: &BTreeSet<String>, m: &str) -> bool {
    alive.contains(m)
        && doc
            .members
            .get(m)
            .is_some_and(|x| !doc.is_fenced(&x.address))
}

/// The owner of `g` if that incarnation is alive.
pub fn live_owner<'d>(doc: &'d GroupDoc, alive: &BTreeSet<String>, g: u32) -> Option<&'d Owner> {
    let o = doc.groups.get(&g)?.owner.as_ref()?;
    let current = doc.members.get(&o.member)?;
    (is_live(doc, alive, &o.member) && current.address == o.address).then_some(o)
}

/// Whether member `m` serves group `g` (what it published when it joined).
fn serves(doc: &GroupDoc, m: &str, g: u32) -> bool {
    doc.members.get(m).is_some_and(|x| x.serves.contains(&g))
}

/// Who should own `g` now that its owner is not alive: its home if alive
/// and serving it, else the live member serving it that owns fewest groups
/// alive (ties: the smallest ID).
pub fn successor(doc: &GroupDoc, alive: &BTreeSet<String>, g: u32) -> Option<String> {
    successor_with(doc, alive, g, &BTreeMap::new())
}

/// [`successor`], counting `extra` groups (given away earlier in the same
/// decision) as owned: several orphaned groups spread over the survivors.
fn successor_with(
    doc: &GroupDoc,
    alive: &BTreeSet<String>,
    g: u32,
    extra: &BTreeMap<String, usize>,
) -> Option<String> {
    if let Some(h) = doc.groups.get(&g).and_then(|a| a.home.as_deref()) {
        if is_live(doc, alive, h) && serves(doc, h, g) {
            return Some(h.to_string());
        }
    }
    loads(doc, alive)
        .into_iter()
        .filter(|(m, _)| serves(doc, m, g))
        .map(|(m, n)| (m, n + extra.get(m).copied().unwrap_or(0)))
        .min_by_key(|(m, n)| (*n, *m))
        .map(|(m, _)| m.to_string())
}

/// Live members and how many groups each owns alive.
fn loads<'d>(doc: &'d GroupDoc, alive: &BTreeSet<String>) -> BTreeMap<&'d str, usize> {
    let mut load: BTreeMap<&str, usize> = doc
        .members
        .keys()
        .filter(|m| is_live(doc, alive, m))
        .map(|m| (m.as_str(), 0))
        .collect();
    for g in doc.groups.keys() {
        if let Some(o) = live_owner(doc, alive, *g) {
            if let Some(n) = load.get_mut(o.member.as_str()) {
                *n += 1;
            }
        }
    }
    load
}

/// The steps this member takes now.
pub fn decide(v: &View<'_>) -> Vec<Action> {
    let mut out = decide_groups(v);
    if out.iter().all(|a| matches!(a, Action::WaitForHosts { .. })) {
        out.extend(rebalance(v));
    }
    out
}

/// Rebalancing: a group this member owns whose home is not alive goes to
/// the least loaded live member serving it when that one owns at least two
/// fewer groups (one group per call: the loads change with each move).
fn rebalance(v: &View<'_>) -> Option<Action> {
    let load = loads(v.doc, v.alive);
    let mine = *load.get(v.me)?;
    for &g in v.serves {
        let Some(o) = live_owner(v.doc, v.alive, g) else {
            continue;
        };
        if o.member != v.me || o.address != v.address {
            continue;
        }
        let home = v.doc.groups.get(&g).and_then(|a| a.home.as_deref());
        if home.is_some_and(|h| is_live(v.doc, v.alive, h)) {
            continue;
        }
        let least = load
            .iter()
            .filter(|(m, _)| **m != v.me && serves(v.doc, m, g))
            .min_by_key(|(m, n)| (**n, **m));
        if let Some((m, n)) = least {
            if mine >= n + 2 {
                return Some(hand_over(v, g, m));
            }
        }
    }
    None
}

fn decide_groups(v: &View<'_>) -> Vec<Action> {
    let mut out = Vec::new();
    // Groups handed out earlier in this walk count as owned: every member
    // walks all the groups in the same order over the same record, so they
    // agree on who takes which, and orphans spread over the survivors.
    let mut given: BTreeMap<String, usize> = BTreeMap::new();
    let all: BTreeSet<u32> = v
        .doc
        .groups
        .keys()
        .chain(v.serves.iter())
        .copied()
        .collect();
    for g in all {
        let Some(o) = live_owner(v.doc, v.alive, g) else {
            let to = successor_with(v.doc, v.alive, g, &given);
            if let Some(t) = &to {
                *given.entry(t.clone()).or_default() += 1;
            }
            if v.serves.contains(&g) && to.as_deref() == Some(v.me) {
                let fence = v
                    .doc
                    .groups
                    .get(&g)
                    .and_then(|a| a.owner.as_ref())
                    .filter(|o| o.address != v.address && !v.doc.is_fenced(&o.address))
                    .map(|o| (o.member.clone(), o.address.clone()));
                out.push(Action::Take { group: g, fence });
            }
            continue;
        };
        if !v.serves.contains(&g) || o.member != v.me || o.address != v.address {
            continue;
        }
        let home = v.doc.groups.get(&g).and_then(|a| a.home.as_deref());
        if let Some(h) = home {
            if h != v.me && is_live(v.doc, v.alive, h) && serves(v.doc, h, g) {
                out.push(hand_over(v, g, h));
            }
        }
    }
    out
}

/// The ANA state group `g` gets on this member's listeners.
pub fn ana_state(v: &View<'_>, g: u32, fenced_self: bool) -> AnaState {
    match live_owner(v.doc, v.alive, g) {
        Some(o) if !fenced_self && o.member == v.me && o.address == v.address => {
            AnaState::Optimized
        }
        _ => AnaState::Inaccessible,
    }
}

#[cfg(test)]
mod tests {
    use super::super::doc::{Fenced, Member};
    use super::*;

    fn doc(members: &[(&str, &str, &[u32])]) -> GroupDoc {
        let mut d = GroupDoc::default();
        for (m, a, s) in members {
            d.members.insert(
                m.to_string(),
                Member {
                    address: a.to_string(),
                    joined: 0,
                    serves: s.iter().copied().collect(),
                },
            );
        }
        d
    }

    fn set(xs: &[&str]) -> BTreeSet<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    fn view<'a>(
        me: &'a str,
        address: &'a str,
        d: &'a GroupDoc,
        alive: &'a BTreeSet<String>,
        serves: &'a BTreeSet<u32>,
    ) -> View<'a> {
        View {
            me,
            address,
            doc: d,
            alive,
            serves,
            hosts: &NO_HOSTS,
            waited: &NOBODY,
        }
    }

    static NO_HOSTS: HostsByMember = BTreeMap::new();
    static NOBODY: BTreeSet<String> = BTreeSet::new();

    #[test]
    fn unowned_groups_go_home_or_to_the_least_loaded() {
        let all = [1, 2, 3, 4];
        let mut d = doc(&[("a", "A", &all), ("b", "B", &all), ("c", "C", &all)]);
        d.groups.entry(1).or_default().home = Some("a".into());
        d.groups.entry(2).or_default().home = Some("b".into());
        let alive = set(&["a", "b", "c"]);
        let serves: BTreeSet<u32> = all.into_iter().collect();
        // a takes its home 1; nobody's home 3 and 4 go to the least loaded
        // (all zero: "a" by ID) — each member computes the same answer.
        let acts = decide(&view("a", "A", &d, &alive, &serves));
        assert!(acts.contains(&Action::Take {
            group: 1,
            fence: None
        }));
        assert!(!acts
            .iter()
            .any(|x| matches!(x, Action::Take { group: 2, .. })));
        let acts_b = decide(&view("b", "B", &d, &alive, &serves));
        assert_eq!(
            acts_b,
            vec![Action::Take {
                group: 2,
                fence: None
            }]
        );
        // Once a owns 1 and b owns 2, group 3 goes to c (it owns none).
        d.set_owner(1, "a", "A");
        d.set_owner(2, "b", "B");
        assert_eq!(successor(&d, &alive, 3).as_deref(), Some("c"));
        assert_eq!(
            ana_state(&view("a", "A", &d, &alive, &serves), 1, false),
            AnaState::Optimized
        );
        assert_eq!(
            ana_state(&view("a", "A", &d, &alive, &serves), 1, true),
            AnaState::Inaccessible
        );
        assert_eq!(
            ana_state(&view("b", "B", &d, &alive, &serves), 1, false),
            AnaState::Inaccessible
        );
    }

    #[test]
    fn a_dead_owner_is_fenced_by_its_successor_then_failback_is_planned() {
        let all = [1, 2];
        let mut d = doc(&[("a", "A1", &all), ("b", "B", &all)]);
        d.groups.entry(1).or_default().home = Some("a".into());
        d.groups.entry(2).or_default().home = Some("b".into());
        d.set_owner(1, "a", "A1");
        d.set_owner(2, "b", "B");
        let serves: BTreeSet<u32> = all.into_iter().collect();
        // a's lease expired: b takes 1 and fences A1 first.
        let only_b = set(&["b"]);
        assert_eq!(
            decide(&view("b", "B", &d, &only_b, &serves)),
            vec![Action::Take {
                group: 1,
                fence: Some(("a".into(), "A1".into()))
            }]
        );
        d.set_owner(1, "b", "B");
        d.record_fence(Fenced {
            member: "a".into(),
            address: "A1".into(),
            by: "b".into(),
            at: 0,
        });
        assert!(decide(&view("b", "B", &d, &only_b, &serves)).is_empty());
        // A1 renewing its lease again (frozen, then resumed before it learns
        // it was blocklisted) is not alive: nothing goes back to it.
        assert!(decide(&view("b", "B", &d, &set(&["a", "b"]), &serves)).is_empty());
        assert_eq!(successor(&d, &set(&["a", "b"]), 1).as_deref(), Some("b"));
        // a comes back as a new incarnation A2: b hands 1 back, a waits.
        d.members.get_mut("a").unwrap().address = "A2".into();
        let both = set(&["a", "b"]);
        assert_eq!(
            decide(&view("b", "B", &d, &both, &serves)),
            vec![Action::HandOver {
                group: 1,
                to: "a".into()
            }]
        );
        assert!(decide(&view("a", "A2", &d, &both, &serves)).is_empty());
        // If the record still names the old incarnation as owner, the new
        // one takes it (fencing A1 only if nobody did).
        let mut d2 = d.clone();
        d2.set_owner(1, "a", "A1");
        assert_eq!(
            decide(&view("a", "A2", &d2, &both, &serves)),
            vec![Action::Take {
                group: 1,
                fence: None
            }]
        );
        d2.fenced.clear();
        assert_eq!(
            decide(&view("a", "A2", &d2, &both, &serves)),
            vec![Action::Take {
                group: 1,
                fence: Some(("a".into(), "A1".into()))
            }]
        );
    }

    #[test]
    fn orphaned_groups_spread_over_the_survivors() {
        let all = [1, 2, 3, 4, 5, 6];
        let mut d = doc(&[("a", "A", &all), ("b", "B", &all), ("c", "C", &all)]);
        for (g, m, a) in [
            (1, "a", "A"),
            (4, "a", "A"),
            (2, "b", "B"),
            (5, "b", "B"),
            (3, "c", "C"),
            (6, "c", "C"),
        ] {
            d.set_owner(g, m, a);
            d.groups.get_mut(&g).unwrap().home = Some(m.into());
        }
        let serves: BTreeSet<u32> = all.into_iter().collect();
        let alive = set(&["b", "c"]);
        let b = decide(&view("b", "B", &d, &alive, &serves));
        let c = decide(&view("c", "C", &d, &alive, &serves));
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(c.len(), 1, "{c:?}");
        let taken: BTreeSet<u32> = b
            .iter()
            .chain(&c)
            .map(|x| match x {
                Action::Take { group, .. } => *group,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(taken, [1, 4].into_iter().collect());
    }

    #[test]
    fn a_member_that_joins_gets_homeless_groups_one_at_a_time() {
        let all = [1, 2, 3, 4];
        let mut d = doc(&[("a", "A", &all), ("b", "B", &all)]);
        for g in all {
            d.set_owner(g, "a", "A");
        }
        let serves: BTreeSet<u32> = all.into_iter().collect();
        let alive = set(&["a", "b"]);
        let acts = decide(&view("a", "A", &d, &alive, &serves));
        assert_eq!(acts.len(), 1, "{acts:?}");
        let Action::HandOver { group, to } = &acts[0] else {
            panic!("{acts:?}")
        };
        assert_eq!(to, "b");
        d.set_owner(*group, "b", "B");
        // 3 against 1: one more.
        assert_eq!(decide(&view("a", "A", &d, &alive, &serves)).len(), 1);
        let g2 = all
            .into_iter()
            .find(|g| d.groups[g].owner.as_ref().unwrap().member == "a")
            .unwrap();
        d.set_owner(g2, "b", "B");
        // 2 against 2: settled, on both sides.
        assert!(decide(&view("a", "A", &d, &alive, &serves)).is_empty());
        assert!(decide(&view("b", "B", &d, &alive, &serves)).is_empty());
        // A group whose home is alive is not moved by rebalancing.
        let mut d3 = doc(&[("a", "A", &all), ("b", "B", &all)]);
        for g in all {
            d3.set_owner(g, "a", "A");
            d3.groups.get_mut(&g).unwrap().home = Some("a".into());
        }
        assert!(decide(&view("a", "A", &d3, &alive, &serves)).is_empty());
    }

    #[test]
    fn nobody_takes_a_group_it_does_not_serve() {
        let mut d = doc(&[("a", "A", &[1]), ("b", "B", &[2])]);
        d.set_owner(1, "a", "A");
        let alive = set(&["b"]);
        let serves_b: BTreeSet<u32> = [2].into_iter().collect();
        assert_eq!(successor(&d, &alive, 1), None);
        assert_eq!(
            decide(&view("b", "B", &d, &alive, &serves_b)),
            vec![Action::Take {
                group: 2,
                fence: None
            }]
        );
    }

    #[test]
    fn failback_waits_until_the_hosts_are_connected_to_the_home() {
        let all = [1, 2];
        let mut d = doc(&[("a", "A2", &all), ("b", "B", &all)]);
        d.groups.entry(1).or_default().home = Some("a".into());
        d.groups.entry(2).or_default().home = Some("b".into());
        d.set_owner(1, "b", "B");
        d.set_owner(2, "b", "B");
        let serves: BTreeSet<u32> = all.into_iter().collect();
        let both = set(&["a", "b"]);
        let h = |x: &[(&str, u32, &[&str])]| -> HostsByMember {
            let mut m = HostsByMember::new();
            for (who, g, hs) in x {
                m.entry(who.to_string())
                    .or_default()
                    .insert(*g, hs.iter().map(|s| s.to_string()).collect());
            }
            m
        };
        let decide_with = |hosts: &HostsByMember, waited: &BTreeSet<String>| {
            decide(&View {
                me: "b",
                address: "B",
                doc: &d,
                alive: &both,
                serves: &serves,
                hosts,
                waited,
            })
        };
        // Hosts x and y use group 1 through b; only x has reconnected to a.
        let hosts = h(&[("b", 1, &["x", "y"]), ("b", 2, &["x"]), ("a", 1, &["x"])]);
        assert_eq!(
            decide_with(&hosts, &NOBODY),
            vec![Action::WaitForHosts {
                group: 1,
                to: "a".into(),
                missing: ["y".to_string()].into_iter().collect()
            }]
        );
        // y connects there too: the group goes home.
        let hosts = h(&[("b", 1, &["x", "y"]), ("a", 1, &["y", "x", "z"])]);
        assert_eq!(
            decide_with(&hosts, &NOBODY),
            vec![Action::HandOver {
                group: 1,
                to: "a".into()
            }]
        );
        // y never comes: once a has been alive longer than the wait, it goes
        // home anyway.
        let hosts = h(&[("b", 1, &["x", "y"])]);
        assert_eq!(
            decide_with(&hosts, &set(&["a"])),
            vec![Action::HandOver {
                group: 1,
                to: "a".into()
            }]
        );
        // No host uses group 1 here: nothing to wait for.
        let hosts = h(&[("b", 2, &["x"])]);
        assert_eq!(
            decide_with(&hosts, &NOBODY),
            vec![Action::HandOver {
                group: 1,
                to: "a".into()
            }]
        );
    }
}
