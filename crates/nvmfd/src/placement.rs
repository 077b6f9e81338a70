//! Queue placement policy: which reactor serves each I/O queue.
//!
//! Every reactor accepts connections for itself (`SO_REUSEPORT`), so the
//! kernel's hash of the 4-tuple decides where a connection arrives. Once a
//! connection's Fabrics Connect succeeds we know its controller and QID,
//! and with `--queue-placement balanced` (the default) the reactor asks
//! [`Placement::place`] where the queue should live and hands it over if
//! that is another reactor (mechanism: `reactor.rs`). The rules:
//!
//! - The admin queue stays where it arrived (it is not placed here).
//! - Candidates: the reactors on the NUMA node of the network device that
//!   carries the connection's local address; all reactors when that device
//!   has no node (loopback, virtual devices, single-node machines) or no
//!   reactor runs on its node.
//! - Among the candidates, an I/O queue goes to the reactor holding the
//!   fewest I/O queues *of its controller*, then the fewest I/O queues in
//!   total, then the first in reactor order starting from the controller's
//!   cursor (the reactor after its previous choice). For a fresh controller
//!   this is round-robin starting at the reactor with the fewest I/O
//!   queues, so one controller's queues spread evenly and several
//!   controllers balance against each other; after a queue of a controller
//!   goes away its replacement fills the gap.
//!
//! The counters (I/O queues per reactor, per controller per reactor) live
//! in one small structure under a mutex shared by all reactors, touched
//! only at Connect and at queue teardown (control path, nothing per I/O).
//! A queue's place is held by a [`Placed`] ticket that travels with the
//! connection and gives the place back when dropped.
//!
//! Pure: the topology comes in as data (`numa.rs` reads it from sysfs), so
//! the unit tests below simulate machines of any shape.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// `--queue-placement`: how I/O queues are assigned to reactors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Policy {
    /// Spread the I/O queues of each controller evenly over the reactors
    /// (preferring the NIC's NUMA node); queues that arrive on another
    /// reactor are handed over right after their Fabrics Connect.
    #[default]
    Balanced,
    /// Keep each queue on the reactor whose listener accepted it (the
    /// kernel's SO_REUSEPORT hash decides).
    Kernel,
}

/// Identity of a controller while it has placed I/O queues (the address
/// of its `Arc<Controller>`: cannot be reused while a queue holds it).
pub type CtrlKey = usize;

/// The placement state shared by all reactors.
#[derive(Debug)]
pub struct Placement {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// NUMA node of each reactor's core (None: unknown).
    nodes: Vec<Option<u32>>,
    /// I/O queues placed on each reactor.
    io_queues: Vec<u32>,
    /// Controllers with at least one placed I/O queue.
    ctrls: HashMap<CtrlKey, CtrlPlaces>,
}

#[derive(Debug)]
struct CtrlPlaces {
    /// This controller's I/O queues on each reactor.
    per_reactor: Vec<u32>,
    total: u32,
    /// Where the next round-robin tie-break starts.
    cursor: usize,
}

/// One placed I/O queue: its reactor's count includes it until dropped.
#[derive(Debug)]
pub struct Placed {
    owner: Arc<Placement>,
    ctrl: CtrlKey,
    reactor: usize,
}

impl Placed {
    /// The reactor this queue is placed on.
    pub fn reactor(&self) -> usize {
        self.reactor
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        self.owner.release(self.ctrl, self.reactor);
    }
}

impl Placement {
    /// Placement over reactors `0..nodes.len()`, reactor `i` running on NUMA
    /// node `nodes[i]` (None: unknown).
    pub fn new(nodes: Vec<Option<u32>>) -> Arc<Placement> {
        let n = nodes.len();
        Arc::new(Placement {
            state: Mutex::new(State {
                nodes,
                io_queues: vec![0; n],
                ctrls: HashMap::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent across a panic elsewhere: every update
        // is a few integer operations.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Chooses the reactor for a new I/O queue of controller `ctrl` whose
    /// connection is carried by a network device on NUMA node `nic_node`
    /// (None: no node known), and counts it there.
    pub fn place(self: &Arc<Self>, ctrl: CtrlKey, nic_node: Option<u32>) -> Placed {
        let mut st = self.lock();
        let n = st.nodes.len();
        let local = |st: &State, r: usize| nic_node.is_none() || st.nodes[r] == nic_node;
        let any_local = (0..n).any(|r| local(&st, r));
        let cursor = st.ctrls.get(&ctrl).map_or(0, |c| c.cursor);
        let mine = |st: &State, r: usize| st.ctrls.get(&ctrl).map_or(0, |c| c.per_reactor[r]);
        let mut best: Option<(u32, u32, usize)> = None;
        let mut choice = 0;
        for k in 0..n {
            let r = (cursor + k) % n;
            if any_local && !local(&st, r) {
                continue;
            }
            // Ordered by: this controller's queues, all queues, distance
            // from the cursor (k grows, so the first minimum wins).
            let key = (mine(&st, r), st.io_queues[r], k);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
                choice = r;
            }
        }
        Self::count(&mut st, ctrl, choice, n);
        Placed {
            owner: self.clone(),
            ctrl,
            reactor: choice,
        }
    }

    /// Counts an I/O queue of `ctrl` on `reactor` without choosing (a queue
    /// that cannot move now stays where it is).
    pub fn place_at(self: &Arc<Self>, ctrl: CtrlKey, reactor: usize) -> Placed {
        let mut st = self.lock();
        let n = st.nodes.len();
        let reactor = reactor.min(n.saturating_sub(1));
        Self::count(&mut st, ctrl, reactor, n);
        Placed {
            owner: self.clone(),
            ctrl,
            reactor,
        }
    }

    fn count(st: &mut State, ctrl: CtrlKey, r: usize, n: usize) {
        st.io_queues[r] += 1;
        let c = st.ctrls.entry(ctrl).or_insert_with(|| CtrlPlaces {
            per_reactor: vec![0; n],
            total: 0,
            cursor: r,
        });
        c.per_reactor[r] += 1;
        c.total += 1;
        c.cursor = (r + 1) % n;
    }

    fn release(&self, ctrl: CtrlKey, r: usize) {
        let mut st = self.lock();
        st.io_queues[r] = st.io_queues[r].saturating_sub(1);
        if let Some(c) = st.ctrls.get_mut(&ctrl) {
            c.per_reactor[r] = c.per_reactor[r].saturating_sub(1);
            c.total = c.total.saturating_sub(1);
            if c.total == 0 {
                st.ctrls.remove(&ctrl);
            }
        }
    }

    /// I/O queues placed on each reactor now.
    pub fn io_queues(&self) -> Vec<u32> {
        self.lock().io_queues.clone()
    }

    /// Controllers with placed I/O queues now.
    #[cfg(test)]
    fn controllers(&self) -> usize {
        self.lock().ctrls.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` reactors, no NUMA information.
    fn flat(n: usize) -> Arc<Placement> {
        Placement::new(vec![None; n])
    }

    /// Places `k` queues of `ctrl`; returns the tickets.
    fn connect(p: &Arc<Placement>, ctrl: CtrlKey, k: usize, nic: Option<u32>) -> Vec<Placed> {
        (0..k).map(|_| p.place(ctrl, nic)).collect()
    }

    fn reactors(v: &[Placed]) -> Vec<usize> {
        v.iter().map(Placed::reactor).collect()
    }

    /// Per-reactor counts of one controller's tickets.
    fn spread(v: &[Placed], n: usize) -> Vec<u32> {
        let mut s = vec![0; n];
        for p in v {
            s[p.reactor()] += 1;
        }
        s
    }

    #[test]
    fn one_reactor_takes_everything() {
        let p = flat(1);
        let a = connect(&p, 1, 4, None);
        let b = connect(&p, 2, 3, Some(0));
        assert_eq!(reactors(&a), [0, 0, 0, 0]);
        assert_eq!(reactors(&b), [0, 0, 0]);
        assert_eq!(p.io_queues(), [7]);
        drop(a);
        drop(b);
        assert_eq!(p.io_queues(), [0]);
        assert_eq!(p.controllers(), 0);
    }

    #[test]
    fn two_reactors_split_one_controller_in_half() {
        for k in [2, 4, 8, 16] {
            let p = flat(2);
            let q = connect(&p, 7, k, None);
            assert_eq!(spread(&q, 2), [k as u32 / 2, k as u32 / 2], "{k} queues");
            // Round-robin: consecutive queues alternate.
            for w in reactors(&q).windows(2) {
                assert_ne!(w[0], w[1]);
            }
        }
    }

    #[test]
    fn sixteen_reactors_round_robin() {
        let p = flat(16);
        let q = connect(&p, 1, 32, None);
        let r = reactors(&q);
        assert_eq!(&r[..16], (0..16).collect::<Vec<_>>().as_slice());
        assert_eq!(spread(&q, 16), vec![2; 16]);
        // A second controller with 8 queues lands on 8 distinct reactors.
        let q2 = connect(&p, 2, 8, None);
        let mut r2 = reactors(&q2);
        r2.sort_unstable();
        r2.dedup();
        assert_eq!(r2.len(), 8);
    }

    #[test]
    fn controllers_start_on_the_least_loaded_reactor() {
        // Odd queue counts: the second controller starts where the first
        // left fewer queues, so the totals even out.
        let p = flat(2);
        let a = connect(&p, 1, 3, None);
        assert_eq!(reactors(&a), [0, 1, 0]);
        let b = connect(&p, 2, 3, None);
        assert_eq!(reactors(&b), [1, 0, 1]);
        assert_eq!(p.io_queues(), [3, 3]);

        // 4 reactors, controllers of 1 queue each: one per reactor.
        let p = flat(4);
        let single: Vec<Placed> = (10..14).map(|c| p.place(c, None)).collect();
        assert_eq!(reactors(&single), [0, 1, 2, 3]);
    }

    #[test]
    fn interleaved_controllers_each_split_evenly() {
        let p = flat(2);
        let mut per: Vec<Vec<Placed>> = (0..4).map(|_| Vec::new()).collect();
        // Four controllers connect their 4 queues in turn: c0q1 c1q1 ... c3q4.
        for _ in 0..4 {
            for (c, v) in per.iter_mut().enumerate() {
                v.push(p.place(100 + c, None));
            }
        }
        for v in &per {
            assert_eq!(spread(v, 2), [2, 2]);
        }
        assert_eq!(p.io_queues(), [8, 8]);
        // Three reactors, two controllers of 3 queues interleaved.
        let p = flat(3);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            a.push(p.place(1, None));
            b.push(p.place(2, None));
        }
        assert_eq!(spread(&a, 3), [1, 1, 1]);
        assert_eq!(spread(&b, 3), [1, 1, 1]);
    }

    #[test]
    fn numa_prefers_the_nic_node() {
        // 16 reactors: 0-7 on node 0, 8-15 on node 1; the NIC is on node 1.
        let nodes: Vec<Option<u32>> = (0..16).map(|r| Some(if r < 8 { 0 } else { 1 })).collect();
        let p = Placement::new(nodes);
        let q = connect(&p, 1, 16, Some(1));
        let s = spread(&q, 16);
        assert_eq!(&s[..8], &[0; 8]);
        assert_eq!(&s[8..], &[2; 8]);
        // A connection over a device without a node may use every reactor;
        // it fills node 0 first (fewest queues).
        let v = connect(&p, 2, 8, None);
        let s = spread(&v, 16);
        assert_eq!(&s[..8], &[1; 8]);
        // A NIC on a node without reactors: all reactors are candidates.
        let w = connect(&p, 3, 16, Some(3));
        assert_eq!(spread(&w, 16), vec![1; 16]);
        let want: Vec<u32> = (0..16).map(|r| if r < 8 { 2 } else { 3 }).collect();
        assert_eq!(p.io_queues(), want);
    }

    #[test]
    fn unknown_reactor_nodes_are_all_equal() {
        // No sysfs node information: the NIC's node matches no reactor.
        let p = flat(4);
        let q = connect(&p, 1, 8, Some(1));
        assert_eq!(spread(&q, 4), [2, 2, 2, 2]);
    }

    #[test]
    fn teardown_returns_counts_and_refills_gaps() {
        let p = flat(2);
        let mut q = connect(&p, 1, 4, None);
        assert_eq!(p.io_queues(), [2, 2]);
        // The host drops one queue on reactor 1 and reconnects it: the
        // replacement goes back to reactor 1.
        let i = q.iter().position(|x| x.reactor() == 1).unwrap();
        q.remove(i);
        assert_eq!(p.io_queues(), [2, 1]);
        q.push(p.place(1, None));
        assert_eq!(spread(&q, 2), [2, 2]);
        drop(q);
        assert_eq!(p.io_queues(), [0, 0]);
        assert_eq!(p.controllers(), 0);
    }

    #[test]
    fn queues_that_stay_are_counted() {
        let p = flat(2);
        let a = p.place_at(1, 0);
        let b = p.place_at(1, 0);
        assert_eq!(p.io_queues(), [2, 0]);
        // The controller's next queues go to reactor 1 until it catches up.
        let c = connect(&p, 1, 2, None);
        assert_eq!(reactors(&c), [1, 1]);
        drop((a, b, c));
        assert_eq!(p.io_queues(), [0, 0]);
    }
}
