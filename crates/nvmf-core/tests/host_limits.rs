//! Connect-time host limits, discovery keep-alive and Abort, driven through
//! `QueuePair::execute` / `poll` the way a transport drives them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_config::{
    derive_namespace_ids, AddressFamily, BdevConfig, BdevKind, ListenerConfig, NamespaceConfig,
    SubsystemConfig, TargetConfig, TransportConfig, TransportType, DISCOVERY_NQN,
};
use nvmf_core::{Exec, HostLimits, HostUsage, PortInfo, QueuePair, QueueState, Target};
use nvmf_wire::command::Command;
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::opcode::{AdminOpcode, FeatureId};
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::IntoBytes;

const NQN: &str = "nqn.2024-01.io.nvmfd:limits";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";

fn listener() -> ListenerConfig {
    ListenerConfig {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: "127.0.0.1".to_string(),
        trsvcid: "4420".to_string(),
    }
}

fn target() -> Arc<Target> {
    let ids = derive_namespace_ids(NQN, 1, "Null0", None);
    let mut s = SubsystemConfig::new(NQN);
    s.allow_any_host = true;
    s.namespaces = vec![NamespaceConfig {
        nsid: 1,
        bdev_name: "Null0".to_string(),
        nguid: ids.nguid,
        eui64: ids.eui64,
        uuid: ids.uuid,
        anagrpid: 1,
        ptpl_file: None,
    }];
    s.listeners = vec![listener()];
    let cfg = TargetConfig {
        bdevs: vec![BdevConfig {
            name: "Null0".to_string(),
            kind: BdevKind::Null,
            block_size: 4096,
            num_blocks: 1 << 20,
            uuid: None,
            file: None,
            rbd: None,
        }],
        transports: vec![TransportConfig::tcp_default()],
        subsystems: vec![s],
        discovery_listeners: vec![listener()],
        ..Default::default()
    };
    Target::from_config(&cfg).expect("target")
}

fn port() -> Arc<PortInfo> {
    Arc::new(PortInfo {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: "127.0.0.1".to_string(),
        trsvcid: "4420".to_string(),
        peer: "127.0.0.1:50000".parse::<SocketAddr>().unwrap(),
        tls: None,
        caps: nvmf_core::TransportCaps::MESSAGE_BASED,
    })
}

fn done(e: Exec) -> Completion {
    match e {
        Exec::Complete(c) => c,
        other => panic!("expected a completion, got {other:?}"),
    }
}

fn connect(
    t: &Arc<Target>,
    qid: u16,
    kato: u32,
    cntlid: u16,
    subnqn: &str,
    host: &str,
) -> (QueuePair, Completion) {
    let mut qp = QueuePair::new(t.clone(), port());
    let cmd = Command::connect(1, qid, 31, 0, kato);
    let mut data = ConnectData::new([7; 16], cntlid, subnqn, host)
        .as_bytes()
        .to_vec();
    let c = done(qp.execute(&cmd, &mut data));
    (qp, c)
}

fn admin(t: &Arc<Target>, subnqn: &str, host: &str, kato: u32) -> QueuePair {
    let (mut qp, c) = connect(t, 0, kato, 0xFFFF, subnqn, host);
    assert_eq!(c.status(), Status::SUCCESS, "admin connect {host}");
    let c = done(qp.execute(&Command::property_set(2, CC, false, 0x0046_0001), &mut []));
    assert_eq!(c.status(), Status::SUCCESS);
    qp
}

fn cntlid(qp: &QueuePair) -> u16 {
    qp.controller().unwrap().cntlid()
}

fn busy() -> Status {
    // Retryable: no DNR (the cap may clear).
    Status::CONNECT_CONTROLLER_BUSY
}

#[test]
fn controllers_per_host_are_capped() {
    let t = target();
    t.set_host_limits(HostLimits {
        max_controllers: 0,
        max_controllers_per_host: 2,
        max_io_queues_per_host: 0,
        ..HostLimits::default()
    });
    let a1 = admin(&t, NQN, HOST_A, 0);
    let _a2 = admin(&t, NQN, HOST_A, 0);
    // Discovery controllers have their own budget (issue 23 finding 6).
    let _d = admin(&t, DISCOVERY_NQN, HOST_A, 0);
    let (q, c) = connect(&t, 0, 0, 0xFFFF, NQN, HOST_A);
    assert_eq!(c.status(), busy(), "third controller of host A");
    assert!(!c.status().dnr);
    assert!(!q.is_connected());
    assert_eq!(t.active_controllers(), 3);
    // Another host is not affected.
    let _b = admin(&t, NQN, HOST_B, 0);
    assert_eq!(t.host_usage(HOST_A).controllers, 2);
    // Host A gets its slot back when a controller goes.
    drop(a1);
    assert_eq!(t.host_usage(HOST_A).controllers, 1);
    let _a3 = admin(&t, NQN, HOST_A, 0);
    // The refusal is counted under its cap (`/metrics`).
    assert_eq!(
        t.limit_hits(),
        nvmf_core::LimitHits {
            controllers_per_host: 1,
            ..Default::default()
        }
    );
}

#[test]
fn controllers_in_total_are_capped() {
    let t = target();
    t.set_host_limits(HostLimits {
        max_controllers: 2,
        max_controllers_per_host: 0,
        max_io_queues_per_host: 0,
        ..HostLimits::default()
    });
    let a = admin(&t, NQN, HOST_A, 0);
    let _b = admin(&t, NQN, HOST_B, 0);
    let (_, c) = connect(&t, 0, 0, 0xFFFF, NQN, "nqn.2014-08.org.example:c");
    assert_eq!(c.status(), busy());
    drop(a);
    let _c = admin(&t, NQN, "nqn.2014-08.org.example:c", 0);
    assert_eq!(t.limit_hits().controllers, 1);
}

#[test]
fn io_queues_per_host_are_capped_across_controllers() {
    let t = target();
    t.set_host_limits(HostLimits {
        max_controllers: 0,
        max_controllers_per_host: 0,
        max_io_queues_per_host: 3,
        ..HostLimits::default()
    });
    let a1 = admin(&t, NQN, HOST_A, 0);
    let a2 = admin(&t, NQN, HOST_A, 0);
    let (c1, c2) = (cntlid(&a1), cntlid(&a2));
    let (q1, c) = connect(&t, 1, 0, c1, NQN, HOST_A);
    assert_eq!(c.status(), Status::SUCCESS);
    let (_q2, c) = connect(&t, 2, 0, c1, NQN, HOST_A);
    assert_eq!(c.status(), Status::SUCCESS);
    let (_q3, c) = connect(&t, 1, 0, c2, NQN, HOST_A);
    assert_eq!(c.status(), Status::SUCCESS);
    let (q4, c) = connect(&t, 2, 0, c2, NQN, HOST_A);
    assert_eq!(c.status(), busy(), "fourth I/O queue of host A");
    assert!(!q4.is_connected());
    assert_eq!(t.limit_hits().io_queues_per_host, 1);
    assert_eq!(
        t.host_usage(HOST_A),
        HostUsage {
            controllers: 2,
            io_queues: 3
        }
    );
    // The refused QID stays free: after another queue goes, it connects.
    drop(q1);
    let (_q4, c) = connect(&t, 2, 0, c2, NQN, HOST_A);
    assert_eq!(c.status(), Status::SUCCESS);
    // Host B has its own budget.
    let b = admin(&t, NQN, HOST_B, 0);
    let (_qb, c) = connect(&t, 1, 0, cntlid(&b), NQN, HOST_B);
    assert_eq!(c.status(), Status::SUCCESS);
    // Everything given back once the host is gone.
    drop((a1, a2, _q2, _q3, _q4));
    assert_eq!(t.host_usage(HOST_A), HostUsage::default());
}

#[test]
fn number_of_queues_offers_what_the_host_may_still_connect() {
    let t = target();
    t.set_host_limits(HostLimits {
        max_controllers: 0,
        max_controllers_per_host: 0,
        max_io_queues_per_host: 3,
        ..HostLimits::default()
    });
    let set_queues = |qp: &mut QueuePair, n: u32| {
        let mut cmd = Command::new(AdminOpcode::SetFeatures as u8, 6);
        cmd.set_cdw10(FeatureId::NumberOfQueues as u32)
            .set_cdw11((n - 1) | ((n - 1) << 16));
        let c = done(qp.execute(&cmd, &mut []));
        assert_eq!(c.status(), Status::SUCCESS);
        (c.dw0() & 0xFFFF) + 1
    };
    let mut a1 = admin(&t, NQN, HOST_A, 0);
    assert_eq!(set_queues(&mut a1, 8), 3);
    let c1 = cntlid(&a1);
    let (_q1, c) = connect(&t, 1, 0, c1, NQN, HOST_A);
    assert_eq!(c.status(), Status::SUCCESS);
    let (_q2, c) = connect(&t, 2, 0, c1, NQN, HOST_A);
    assert_eq!(c.status(), Status::SUCCESS);
    let mut a2 = admin(&t, NQN, HOST_A, 0);
    assert_eq!(set_queues(&mut a2, 8), 1, "one queue left for host A");
    let (_q3, c) = connect(&t, 1, 0, cntlid(&a2), NQN, HOST_A);
    assert_eq!(c.status(), Status::SUCCESS);
    // Nothing left: still 1 offered (the field cannot say 0), Connect refuses.
    let mut a3 = admin(&t, NQN, HOST_A, 0);
    assert_eq!(set_queues(&mut a3, 8), 1);
    let (_, c) = connect(&t, 1, 0, cntlid(&a3), NQN, HOST_A);
    assert_eq!(c.status(), busy());
    // Another host gets its full budget.
    let mut b = admin(&t, NQN, HOST_B, 0);
    assert_eq!(set_queues(&mut b, 8), 3);
}

fn poll(qp: &mut QueuePair, now: Instant) -> (QueueState, Vec<Completion>) {
    let mut got = Vec::new();
    let st = qp.poll(now, &mut |c| got.push(c));
    (st, got)
}

#[test]
fn discovery_controller_with_kato_0_is_reaped() {
    let t = target();
    t.set_discovery_kato_ms(2000);
    let mut d = admin(&t, DISCOVERY_NQN, HOST_A, 0);
    assert_eq!(d.controller().unwrap().kato_ms(), 2000);
    // Set Features Keep Alive Timer 0 cannot switch it off either.
    let mut cmd = Command::new(AdminOpcode::SetFeatures as u8, 5);
    cmd.set_cdw10(FeatureId::KeepAliveTimer as u32).set_cdw11(0);
    assert_eq!(done(d.execute(&cmd, &mut [])).status(), Status::SUCCESS);
    assert_eq!(d.controller().unwrap().kato_ms(), 2000);
    let now = Instant::now();
    assert_eq!(
        poll(&mut d, now + Duration::from_millis(1500)).0,
        QueueState::Open
    );
    assert!(matches!(
        poll(&mut d, now + Duration::from_millis(2600)).0,
        QueueState::Close { .. }
    ));

    // An NVM controller may run without keep-alive (TCP keepalive is the
    // transport's backstop).
    let mut n = admin(&t, NQN, HOST_A, 0);
    assert_eq!(done(n.execute(&cmd, &mut [])).status(), Status::SUCCESS);
    assert_eq!(n.controller().unwrap().kato_ms(), 0);
    assert_eq!(
        poll(&mut n, now + Duration::from_secs(3600)).0,
        QueueState::Open
    );
}

fn abort(qp: &mut QueuePair, sqid: u16, cid: u16) -> Completion {
    let mut cmd = Command::new(AdminOpcode::Abort as u8, 99);
    cmd.set_cdw10(u32::from(sqid) | (u32::from(cid) << 16));
    done(qp.execute(&cmd, &mut []))
}

#[test]
fn abort_completes_an_outstanding_aer() {
    let t = target();
    let mut a = admin(&t, NQN, HOST_A, 0);
    for cid in [40u16, 41] {
        let e = a.execute(
            &Command::new(AdminOpcode::AsyncEventRequest as u8, cid),
            &mut [],
        );
        assert_eq!(e, Exec::Pending);
    }
    // Unknown CID, or a command on an I/O queue: not aborted (bit 0 set).
    let c = abort(&mut a, 0, 7);
    assert_eq!((c.status(), c.dw0() & 1), (Status::SUCCESS, 1));
    let c = abort(&mut a, 1, 41);
    assert_eq!((c.status(), c.dw0() & 1), (Status::SUCCESS, 1));
    // The AER with CID 41: aborted.
    let c = abort(&mut a, 0, 41);
    assert_eq!((c.status(), c.dw0() & 1), (Status::SUCCESS, 0));
    let (st, got) = poll(&mut a, Instant::now());
    assert_eq!(st, QueueState::Open);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].cid(), 41);
    assert_eq!(got[0].status(), Status::ABORTED_BY_REQUEST);
    // Once only; the other AER is still outstanding and serves an event.
    let c = abort(&mut a, 0, 41);
    assert_eq!(c.dw0() & 1, 1);
    assert!(poll(&mut a, Instant::now()).1.is_empty());
    let c = abort(&mut a, 0, 40);
    assert_eq!(c.dw0() & 1, 0);
    let got = poll(&mut a, Instant::now()).1;
    assert_eq!(got.iter().map(|c| c.cid()).collect::<Vec<_>>(), vec![40]);
}

#[test]
fn discovery_controllers_never_use_up_the_nvm_controllers() {
    // Issue 23 finding 6: discovery controllers counted against
    // --max-controllers (and lived 120 s when idle), so an anonymous flood
    // of discovery sessions locked every host out of new NVM controllers.
    // Now they have their own pool, which evicts its oldest when full.
    let t = target();
    t.set_host_limits(HostLimits {
        max_controllers: 2,
        max_controllers_per_host: 0,
        max_io_queues_per_host: 0,
        max_discovery_controllers: 4,
        max_unauthenticated_controllers: 4,
    });
    let flood: Vec<QueuePair> = (0..12)
        .map(|i| {
            admin(
                &t,
                DISCOVERY_NQN,
                &format!("nqn.2014-08.org.example:flood{i}"),
                0,
            )
        })
        .collect();
    let _a = admin(&t, NQN, HOST_A, 0);
    let _b = admin(&t, NQN, HOST_B, 0);
    // The pool holds 4: the 8 oldest were evicted, their queues close.
    let usage = t.pool_usage();
    assert_eq!(usage.discovery_evicted, 8);
    let now = Instant::now();
    let mut kept = Vec::new();
    for (i, mut q) in flood.into_iter().enumerate() {
        let closes = matches!(q.poll(now, &mut |_| {}), QueueState::Close { .. });
        assert_eq!(
            closes,
            i < 8,
            "discovery controller {i}: the 8 oldest close"
        );
        if !closes {
            kept.push(q);
        }
    }
    assert_eq!(t.pool_usage().discovery, 4);
    // A discovery controller for a real host still gets in (evicting).
    let _d = admin(&t, DISCOVERY_NQN, HOST_B, 0);
    assert_eq!(t.pool_usage().discovery_evicted, 9);
}

#[test]
fn an_io_queue_must_come_from_its_controllers_host_identifier() {
    // Issue 23 finding 7: the Host Identifier of an I/O-queue Connect was
    // never compared with the controller's.
    let t = target();
    let a = admin(&t, NQN, HOST_A, 0);
    let mut qp = QueuePair::new(t.clone(), port());
    let cmd = Command::connect(1, 1, 31, 0, 0);
    let mut data = ConnectData::new([8; 16], cntlid(&a), NQN, HOST_A)
        .as_bytes()
        .to_vec();
    let c = done(qp.execute(&cmd, &mut data));
    assert_eq!(c.status(), Status::CONNECT_INVALID_HOST);
    assert!(!qp.is_connected());
    assert_eq!(t.host_usage(HOST_A).io_queues, 0);
    // The same with the controller's Host Identifier connects.
    let (_q, c) = connect(&t, 1, 0, cntlid(&a), NQN, HOST_A);
    assert_eq!(c.status(), Status::SUCCESS);
}

#[test]
fn a_taken_queue_id_is_refused_without_dnr() {
    // Issue 23 finding 3 (at the least): a QID already connected is refused
    // retryably, so a host whose reconnect races its old queue's teardown
    // (or another host holding it) is not given up for good.
    let t = target();
    let a = admin(&t, NQN, HOST_A, 0);
    let (_q1, c) = connect(&t, 1, 0, cntlid(&a), NQN, HOST_A);
    assert_eq!(c.status(), Status::SUCCESS);
    let (q2, c) = connect(&t, 1, 0, cntlid(&a), NQN, HOST_A);
    assert_eq!(c.status().sc, Status::CONNECT_INVALID_PARAMETERS.sc);
    assert!(!c.status().dnr, "retryable");
    assert!(!q2.is_connected());
}
