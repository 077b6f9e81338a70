//! The RADOS primitives of gateway groups (`rbd::group`, issue 25; the
//! group itself is not built yet) against the suite's Ceph cluster, with
//! two librados connections standing for two gateways:
//! - a lease held by one member is refused to the other, renewed by its
//!   holder, and taken by the other once it expired unrenewed;
//! - a guarded write applies only at the version it was computed from
//!   (and a create only once);
//! - once a member has fenced another by its client address and written,
//!   the fenced member's writes fail and the fencer's data stays.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_backend::rbd::conn::{Conn, ConnSpec};
use nvmf_backend::rbd::group::{GroupObjects, LeaseError, WriteError};
use support::*;

fn member(c: &Cluster, label: &str) -> (Arc<Conn>, GroupObjects) {
    let conf = c.conf_path().to_string_lossy().into_owned();
    let conn = Conn::connect(&ConnSpec {
        label,
        config_file: Some(&conf),
        ..ConnSpec::default()
    })
    .expect("connect");
    let g = GroupObjects::open(&conn, POOL).expect("open the pool");
    (conn, g)
}

fn oid(what: &str) -> String {
    format!("nvmfd-test-{what}-{}", std::process::id())
}

#[test]
fn lease_is_exclusive_renewed_and_expires() {
    if skip() {
        return;
    }
    let c = cluster();
    let (_ca, a) = member(c, "gw-a");
    let (_cb, b) = member(c, "gw-b");
    let o = oid("lease");
    let d = Duration::from_secs(3);
    a.lease(&o, "gw", "a", d, false).expect("a takes the lease");
    assert_eq!(b.lease(&o, "gw", "b", d, false), Err(LeaseError::Held));
    // Renewed by its holder for 3 s more, twice: still refused to b.
    for _ in 0..2 {
        std::thread::sleep(Duration::from_secs(2));
        a.lease(&o, "gw", "a", d, true).expect("a renews");
        assert_eq!(b.lease(&o, "gw", "b", d, false), Err(LeaseError::Held));
    }
    // Not renewed: b gets it within the duration plus a margin.
    let t0 = Instant::now();
    loop {
        match b.lease(&o, "gw", "b", d, false) {
            Ok(()) => break,
            Err(LeaseError::Held) => {
                assert!(t0.elapsed() < Duration::from_secs(10), "never expired");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    let took = t0.elapsed();
    eprintln!("lease taken over {took:?} after the last renewal + 0 s");
    assert!(
        took >= Duration::from_secs(2),
        "taken before it expired: {took:?}"
    );
    assert_eq!(
        a.lease(&o, "gw", "a", d, true),
        Err(LeaseError::Held),
        "a lost it"
    );
    b.release(&o, "gw", "b").unwrap();
    a.lease(&o, "gw", "a", d, false)
        .expect("free again after release");
    a.release(&o, "gw", "a").unwrap();
}

#[test]
fn guarded_writes_apply_only_at_their_version() {
    if skip() {
        return;
    }
    let c = cluster();
    let (_ca, a) = member(c, "gw-a");
    let (_cb, b) = member(c, "gw-b");
    let o = oid("state");
    assert_eq!(a.read(&o).unwrap(), None);
    let v1 = a.write(&o, b"epoch 1", None).expect("create");
    assert_eq!(
        b.write(&o, b"epoch 1 too", None),
        Err(WriteError::Conflict),
        "create once"
    );
    let (data, v) = b.read(&o).unwrap().expect("exists");
    assert_eq!((data.as_slice(), v), (&b"epoch 1"[..], v1));
    // Both computed from v1: the first applies, the second conflicts.
    let v2 = b.write(&o, b"epoch 2 by b", Some(v1)).expect("b at v1");
    assert!(v2 > v1);
    assert_eq!(
        a.write(&o, b"epoch 2 by a", Some(v1)),
        Err(WriteError::Conflict)
    );
    let (data, v) = a.read(&o).unwrap().unwrap();
    assert_eq!((data.as_slice(), v), (&b"epoch 2 by b"[..], v2));
    // A larger object reads back whole.
    let big = vec![0x5Au8; 3 << 20];
    let v3 = a.write(&o, &big, Some(v2)).unwrap();
    assert_eq!(a.read(&o).unwrap(), Some((big, v3)));
    let out = c.rados(&["-p", POOL, "rm", &o]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_fenced_member_can_no_longer_write() {
    if skip() {
        return;
    }
    let c = cluster();
    let (_ca, a) = member(c, "gw-a");
    let (_cb, b) = member(c, "gw-b");
    let o = oid("fence");
    let v = a.write(&o, b"a was here", None).expect("a writes");
    let addr = a.client_address().expect("a's address");
    assert!(!addr.is_empty());
    b.fence(&addr, Duration::from_secs(600))
        .expect("b fences a");
    // b's first write after the fence: the OSD takes the OSD map with the
    // blocklist before it (an op carries its sender's map epoch), so from
    // here on a is refused. (A write of a's that reached the OSD before
    // this one would have been ordered before it; that is allowed.)
    let v2 = b
        .write(&o, b"b after the fence", Some(v))
        .expect("b writes");
    let t0 = Instant::now();
    let r = a.write(&o, b"stale write from a", Some(v2));
    eprintln!("fenced member's write: {r:?} after {:?}", t0.elapsed());
    assert!(matches!(r, Err(WriteError::Failed(_))), "{r:?}");
    assert_eq!(
        b.read(&o).unwrap(),
        Some((b"b after the fence".to_vec(), v2)),
        "the fenced write did not land"
    );
    let out = c.ceph(&["osd", "blocklist", "rm", &addr]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.rados(&["-p", POOL, "rm", &o]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
