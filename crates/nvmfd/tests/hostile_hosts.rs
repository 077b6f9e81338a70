//! Hostile and broken hosts against the real `nvmfd` binary: a storm of
//! connections and controllers from one host beyond every cap while a
//! bystander host does verified 4 KiB I/O at queue depth 1 (its latency
//! before and during the storm compared), a discovery controller with
//! KATO 0 that goes silent, and an NVM controller with KATO 0 whose peer
//! goes half-open (a network namespace + veth pair whose host end goes down
//! without a FIN or RST).

#[path = "common/raw_sock.rs"]
mod raw_sock;
#[path = "../../nvmf-tcp/tests/common/mod.rs"]
mod tcp_common;

use nvmf_host::{ConnectOptions, Controller, IoQueue, TransportId};
use nvmf_testkit::{bins::nvmfd_command, free_port, p99};
use nvmf_wire::command::Command;
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CNTLID_DYNAMIC};
use nvmf_wire::status::Status;
use raw_sock::Sock;
use std::io::{ErrorKind, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tcp_common::host::*;
use zerocopy::IntoBytes;

const IO_TIMEOUT: Duration = Duration::from_secs(5);
const STORM_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5707a000-0000-0000-0000-00000000000a";
const BYSTANDER: &str = "nqn.2014-08.org.nvmexpress:uuid:b7575a00-0000-0000-0000-00000000000b";
const FRESH_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f7e54000-0000-0000-0000-00000000000c";

// ---------------------------------------------------------------- daemon

/// A running nvmfd (nvmf-testkit's: killed on drop, config and RPC socket
/// removed).
struct Daemon {
    nvmfd: nvmf_testkit::Daemon,
    port: u16,
}

impl std::ops::Deref for Daemon {
    type Target = nvmf_testkit::Daemon;
    fn deref(&self) -> &nvmf_testkit::Daemon {
        &self.nvmfd
    }
}

/// The test target of `tcp_common::config_json`, listening on `addr`.
fn config_on(addr: &str, port: u16) -> String {
    config_json(port).replace(
        "\"traddr\":\"127.0.0.1\"",
        &format!("\"traddr\":\"{addr}\""),
    )
}

use tcp_common::config_json;

impl Daemon {
    /// Starts nvmfd on one core listening on `addr`, with extra arguments.
    fn start(addr: &str, args: &[&str]) -> Daemon {
        let nvmfd = nvmf_testkit::Daemon::start_on_free_port(|port| {
            nvmf_testkit::Daemon::builder(config_on(addr, port))
                .args(["-m", "0"])
                .args(args)
                .listening(&[port])
                .ready_when(&format!("listening on {addr}:{port} (tcp)"))
                .ready_within(Duration::from_secs(10))
        });
        let port = nvmfd.port();
        Daemon { nvmfd, port }
    }

    /// Waits up to `limit` for a log line containing `needle`.
    fn wait_log_for(&self, needle: &str, limit: Duration) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.logged(needle) {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    fn count_log(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }
}

// ---------------------------------------------------------------- raw host

/// A TCP connection from `src` (any port) to `dst`.
fn tcp_from(src: Ipv4Addr, dst: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    s.bind(&SocketAddr::new(IpAddr::V4(src), 0).into())?;
    s.connect_timeout(&dst.into(), IO_TIMEOUT)?;
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(true)?;
    Ok(s)
}

fn sock_from(src: Ipv4Addr, dst: SocketAddr) -> Sock {
    Sock::new(tcp_from(src, dst).expect("connect to nvmfd"))
}

/// ICReq, then Fabrics Connect of `qid` (admin: a new controller) with `kato`.
fn connect_queue(
    w: &mut Sock,
    qid: u16,
    kato: u32,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
) -> Completion {
    let mut host = Host::new();
    init(w, &mut host, false, false);
    let cid = host.cid();
    let cmd = Command::connect(cid, qid, 31, 0, kato);
    let cd = ConnectData::new([7; 16], cntlid, subnqn, hostnqn);
    exec(w, &host, cmd, Out::InCapsule(cd.as_bytes()), 0).0
}

/// Closes our side and waits (5 s at most) until nvmfd has closed its side
/// too, so the connection no longer counts against any cap.
fn close_and_wait(mut s: Sock) {
    let _ = s.s.shutdown(std::net::Shutdown::Write);
    s.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 4096];
    while let Ok(n) = s.s.read(&mut b) {
        if n == 0 {
            break;
        }
    }
}

/// Whether nvmfd closed (or reset) this freshly accepted connection within
/// `wait`, rather than keeping it.
fn closed_by_target(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

// ---------------------------------------------------------------- bystander

/// A host doing verified 4 KiB write + read at queue depth 1.
struct Bystander {
    _ctrl: Controller,
    q: IoQueue,
    round: u64,
}

impl Bystander {
    fn connect(port: u16, hostnqn: &str) -> nvmf_host::Result<Bystander> {
        let trid = TransportId::tcp("127.0.0.1", &port.to_string(), DEFAULT_NQN);
        let ctrl = Controller::connect(&ConnectOptions::new(trid).with_hostnqn(hostnqn))?;
        let q = ctrl.create_io_queue(1, 4, 4096)?;
        Ok(Bystander {
            _ctrl: ctrl,
            q,
            round: 0,
        })
    }

    fn wait(&mut self) -> nvmf_host::queue::IoCompletion {
        let deadline = Instant::now() + IO_TIMEOUT;
        loop {
            if let Some(c) = self.q.next_completion() {
                return c;
            }
            assert!(Instant::now() < deadline, "bystander I/O timed out");
            self.q.poll(Some(IO_TIMEOUT)).expect("bystander queue");
        }
    }

    /// One write and one read of the same 4 KiB, verified. Returns the
    /// latency of each.
    fn round(&mut self) -> [Duration; 2] {
        self.round += 1;
        // 1 MiB namespace of 512-byte blocks: 256 slots of 4 KiB.
        let lba = (self.round % 256) * 8;
        let data = pattern(self.round, 4096);
        let slot = self.q.alloc().expect("free slot");
        self.q.buf_mut(slot)[..4096].copy_from_slice(&data);
        let t = Instant::now();
        self.q.submit_write(slot, 1, lba, 8, 4096).unwrap();
        let c = self.wait();
        let w = t.elapsed();
        assert_eq!(c.status, Status::SUCCESS, "bystander write");
        self.q.buf_mut(slot)[..4096].fill(0);
        let t = Instant::now();
        self.q.submit_read(slot, 1, lba, 8, 4096).unwrap();
        let c = self.wait();
        let r = t.elapsed();
        assert_eq!(c.status, Status::SUCCESS, "bystander read");
        assert!(
            self.q.buf(slot)[..4096] == data[..],
            "bystander read back other data (round {})",
            self.round
        );
        self.q.release(slot);
        [w, r]
    }

    /// Rounds for `d`; returns every latency.
    fn run_for(&mut self, d: Duration) -> Vec<Duration> {
        let mut lat = Vec::new();
        let start = Instant::now();
        while start.elapsed() < d {
            lat.extend(self.round());
        }
        lat
    }
}

fn busy() -> Status {
    Status::CONNECT_CONTROLLER_BUSY
}

// ---------------------------------------------------------------- storm

const MAX_CONN_PER_HOST: usize = 16;
const MAX_CTRL_PER_HOST: usize = 4;
const MAX_IOQ_PER_HOST: usize = 8;
const LOG_RATE: usize = 5;

#[derive(Debug, Default)]
struct StormReport {
    flood_refused: usize,
    flood_kept: usize,
    busy_answers: usize,
}

/// The storm host: fills its caps (checking each over-limit answer), then
/// keeps knocking until `stop`.
fn storm(addr: SocketAddr, stop: Arc<AtomicBool>) -> StormReport {
    let a2 = Ipv4Addr::new(127, 0, 0, 2);
    let a3 = Ipv4Addr::new(127, 0, 0, 3);
    let mut held: Vec<Sock> = Vec::new();
    // Controllers: the cap, then Connect Controller Busy (retryable).
    let mut cntlids = Vec::new();
    for i in 0..MAX_CTRL_PER_HOST + 2 {
        let mut s = sock_from(a2, addr);
        let c = connect_queue(&mut s, 0, 30_000, CNTLID_DYNAMIC, DEFAULT_NQN, STORM_HOST);
        if i < MAX_CTRL_PER_HOST {
            assert_eq!(
                c.status(),
                Status::SUCCESS,
                "controller {i} of the storm host"
            );
            cntlids.push(c.dw0() as u16);
            held.push(s);
        } else {
            assert_eq!(c.status(), busy(), "controller {i} over the per-host cap");
            close_and_wait(s);
        }
    }
    // I/O queues (all on the first controller): the cap, then Busy.
    for qid in 1..=(MAX_IOQ_PER_HOST as u16 + 2) {
        let mut s = sock_from(a2, addr);
        let c = connect_queue(&mut s, qid, 0, cntlids[0], DEFAULT_NQN, STORM_HOST);
        if (qid as usize) <= MAX_IOQ_PER_HOST {
            assert_eq!(c.status(), Status::SUCCESS, "I/O queue {qid}");
            held.push(s);
        } else {
            assert_eq!(c.status(), busy(), "I/O queue {qid} over the per-host cap");
            close_and_wait(s);
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    // Connections that never send ICReq: up to the per-address cap they
    // are kept, beyond it closed at once.
    let room = MAX_CONN_PER_HOST - held.len();
    let mut idle: Vec<TcpStream> = (0..room + 6).map(|_| tcp_from(a2, addr).unwrap()).collect();
    let mut refused = 0;
    for s in idle.iter_mut() {
        if closed_by_target(s, Duration::from_millis(500)) {
            refused += 1;
        }
    }
    assert_eq!(
        refused, 6,
        "connections over the per-address cap of {MAX_CONN_PER_HOST}"
    );

    // Then knock until told to stop: a connection flood from the same
    // address (refused at accept) and controller / I/O queue Connects of
    // the same host NQN from another address (Connect Controller Busy).
    let mut r = StormReport::default();
    let stop2 = stop.clone();
    let prober = std::thread::spawn(move || {
        let mut n = 0;
        while !stop2.load(Ordering::Relaxed) {
            let mut s = sock_from(a3, addr);
            let c = connect_queue(&mut s, 0, 30_000, CNTLID_DYNAMIC, DEFAULT_NQN, STORM_HOST);
            assert_eq!(
                c.status(),
                busy(),
                "controller over the cap during the storm"
            );
            let mut s = sock_from(a3, addr);
            let c = connect_queue(&mut s, 9, 0, cntlids[0], DEFAULT_NQN, STORM_HOST);
            assert_eq!(
                c.status(),
                busy(),
                "I/O queue over the cap during the storm"
            );
            n += 2;
        }
        n
    });
    while !stop.load(Ordering::Relaxed) {
        match tcp_from(a2, addr) {
            Ok(mut s) => {
                if closed_by_target(&mut s, Duration::from_millis(200)) {
                    r.flood_refused += 1;
                } else {
                    r.flood_kept += 1;
                }
            }
            Err(_) => r.flood_refused += 1,
        }
    }
    r.busy_answers = prober.join().expect("prober");
    drop(idle);
    drop(held);
    r
}

#[test]
fn storm_of_connections_and_controllers_spares_a_bystander() {
    let d = Daemon::start(
        "127.0.0.1",
        &[
            "--max-connections-per-host",
            &MAX_CONN_PER_HOST.to_string(),
            "--max-controllers-per-host",
            &MAX_CTRL_PER_HOST.to_string(),
            "--max-io-queues-per-host",
            &MAX_IOQ_PER_HOST.to_string(),
            "--log-rate",
            &LOG_RATE.to_string(),
        ],
    );
    let addr: SocketAddr = format!("127.0.0.1:{}", d.port).parse().unwrap();
    let test_start = Instant::now();

    let mut by = Bystander::connect(d.port, BYSTANDER).expect("bystander connects");
    by.run_for(Duration::from_millis(300)); // warm up
    let before = by.run_for(Duration::from_secs(2));

    let stop = Arc::new(AtomicBool::new(false));
    let storm_started = Instant::now();
    let st = {
        let stop = stop.clone();
        std::thread::spawn(move || storm(addr, stop))
    };
    let during = by.run_for(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let report = st.join().expect("the storm host saw a wrong answer");
    let storm_secs = storm_started.elapsed().as_secs_f64();

    let (p_before, p_during) = (p99(&mut before.clone()), p99(&mut during.clone()));
    eprintln!(
        "bystander: {} ops before, p99 {:?}; {} ops during the storm, p99 {:?}; storm: {report:?}",
        before.len(),
        p_before,
        during.len(),
        p_during
    );
    assert!(report.flood_refused > 50, "{report:?}");
    assert!(report.busy_answers > 10, "{report:?}");
    // Latency: within a small factor of before (plus 1 ms for a shared,
    // loaded test machine: quiet, p99 goes from ~80 us to ~200 us).
    assert!(
        p_during <= p_before * 5 + Duration::from_millis(1),
        "bystander p99 {p_during:?} during the storm vs {p_before:?} before"
    );
    assert!(
        during.len() * 4 >= before.len(),
        "bystander throughput collapsed: {} ops in 4 s vs {} in 2 s",
        during.len(),
        before.len()
    );

    // Each over-limit answer is logged, rate-limited.
    assert!(d.logged("refused: limit of 16 connections from this address"));
    assert!(d.logged("connect refused (Controller Busy): host limit of 4 controllers"));
    assert!(d.logged("host limit of 8 I/O queues"));
    assert!(d.logged("suppressed"), "no suppressed-lines report");
    let refused_lines = d.count_log("refused: limit of");
    let budget = LOG_RATE * (storm_secs.ceil() as usize + 2);
    assert!(
        refused_lines <= budget,
        "{refused_lines} refusal lines for {} refusals (budget {budget})",
        report.flood_refused
    );
    let busy_lines = d.count_log("refused (Controller Busy)");
    assert!(
        busy_lines <= budget,
        "{busy_lines} Connect refusal lines for {} refusals (budget {budget})",
        report.busy_answers
    );
    assert!(d.logged("similar host error messages"));

    // Afterwards: a fresh host is served, and the storm host's caps are
    // free again once its connections are gone.
    let mut fresh = Bystander::connect(d.port, FRESH_HOST).expect("fresh host connects");
    fresh.run_for(Duration::from_millis(200));
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut again = Vec::new();
    while again.len() < MAX_CTRL_PER_HOST {
        match Bystander::connect(d.port, STORM_HOST) {
            Ok(b) => again.push(b),
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "storm host not admitted again: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    by.run_for(Duration::from_millis(100));
    assert!(test_start.elapsed() < Duration::from_secs(60));
}

#[test]
fn total_connection_cap_refuses_at_accept_whatever_the_address() {
    let d = Daemon::start("127.0.0.1", &["--max-connections", "3"]);
    let addr: SocketAddr = format!("127.0.0.1:{}", d.port).parse().unwrap();
    let mut kept: Vec<TcpStream> = [1u8, 2, 3]
        .iter()
        .map(|&h| tcp_from(Ipv4Addr::new(127, 0, 0, h), addr).unwrap())
        .collect();
    for s in kept.iter_mut() {
        assert!(
            !closed_by_target(s, Duration::from_millis(300)),
            "under the cap"
        );
    }
    let mut over = tcp_from(Ipv4Addr::new(127, 0, 0, 4), addr).unwrap();
    assert!(
        closed_by_target(&mut over, Duration::from_secs(2)),
        "4th connection kept"
    );
    assert!(d
        .wait_log_for(
            "refused: limit of 3 connections in total",
            Duration::from_secs(2)
        )
        .is_some());
    // One goes: there is room again.
    let s = kept.pop().unwrap();
    close_and_wait(Sock::new(s));
    std::thread::sleep(Duration::from_millis(50));
    let mut again = tcp_from(Ipv4Addr::new(127, 0, 0, 4), addr).unwrap();
    assert!(!closed_by_target(&mut again, Duration::from_millis(300)));
}

// ---------------------------------------------------------------- logging

/// nvmfd's stderr is a pipe nobody reads (a stuck log collector): once the
/// pipe is full, a reactor writing its log lines synchronously would block
/// for good. With the non-blocking writer (and no rate limit at all) a
/// connection flood that logs far more than the pipe holds leaves the
/// reactor serving.
#[test]
fn stuck_stderr_never_stalls_the_reactor() {
    use std::process::Stdio;
    let port = free_port();
    let cfg = std::env::temp_dir().join(format!("nvmfd-hostile-stuck-{}.json", std::process::id()));
    std::fs::write(&cfg, config_on("127.0.0.1", port)).unwrap();
    let sock =
        std::env::temp_dir().join(format!("nvmfd-hostile-stuck-{}.sock", std::process::id()));
    let mut child = nvmfd_command()
        .args([
            "-c",
            cfg.to_str().unwrap(),
            "-m",
            "0",
            "--log-rate",
            "0",
            "-r",
        ])
        .arg(&sock)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nvmfd");
    struct Kill(std::process::Child, [PathBuf; 2]);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            for p in &self.1 {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    // Held, never read.
    let _stderr = child.stderr.take();
    let _guard = Kill(child, [cfg, sock]);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nvmfd never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ~2 log lines of ~130 bytes per connection: 3000 connections log
    // several times the 64 KiB a pipe holds.
    for _ in 0..3000 {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .expect("connect (did the reactor stop accepting?)");
        drop(s);
    }
    let t = Instant::now();
    let mut by = Bystander::connect(port, BYSTANDER).expect("served while stderr is stuck");
    let lat = by.run_for(Duration::from_millis(300));
    assert!(!lat.is_empty());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
}

// ---------------------------------------------------------------- liveness

#[test]
fn silent_discovery_controller_with_kato_0_is_reaped() {
    let d = Daemon::start("127.0.0.1", &["--discovery-kato-ms", "1000"]);
    let addr: SocketAddr = format!("127.0.0.1:{}", d.port).parse().unwrap();
    let mut s = sock_from(Ipv4Addr::LOCALHOST, addr);
    let c = connect_queue(
        &mut s,
        0,
        0,
        CNTLID_DYNAMIC,
        "nqn.2014-08.org.nvmexpress.discovery",
        STORM_HOST,
    );
    assert_eq!(c.status(), Status::SUCCESS);
    let t = Instant::now();
    // Silent from now on: nvmfd must close the connection after ~1 s
    // (KATO rounded up to whole seconds, checked on the 100 ms tick).
    s.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 256];
    let closed = loop {
        match s.s.read(&mut b) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break false
            }
            Err(_) => break true,
        }
    };
    let took = t.elapsed();
    assert!(
        closed,
        "discovery controller not reaped within 5 s:\n{}",
        d.logs()
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "reaped after {took:?}"
    );
    assert!(d
        .wait_log_for("active_controllers=0", Duration::from_secs(2))
        .is_some());
    assert!(d.logged("keep-alive timeout"), "{}", d.logs());
}

/// A network namespace with a veth pair: `TARGET_IP` in this namespace,
/// `HOST_IP` inside the namespace. Removed on drop (also on panic).
struct NetNs {
    name: String,
    veth: String,
    /// Third octet of the 10.231.x.0/30 subnet (distinct per test process).
    net: u32,
}

fn ip(args: &[&str]) -> std::io::Result<std::process::Output> {
    std::process::Command::new("ip").args(args).output()
}

fn ip_ok(args: &[&str]) {
    let o = ip(args).expect("running ip(8)");
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

impl NetNs {
    fn create(tag: u32) -> NetNs {
        let ns = NetNs {
            name: format!("nvmfd-ho-{tag}"),
            veth: format!("nvt{tag}"),
            net: tag % 250,
        };
        let peer = format!("nvh{tag}");
        let _ = ip(&["netns", "del", &ns.name]);
        let _ = ip(&["link", "del", &ns.veth]);
        ip_ok(&["netns", "add", &ns.name]);
        ip_ok(&[
            "link", "add", &ns.veth, "type", "veth", "peer", "name", &peer,
        ]);
        ip_ok(&["link", "set", &peer, "netns", &ns.name]);
        ip_ok(&[
            "addr",
            "add",
            &format!("{}/30", ns.target_ip()),
            "dev",
            &ns.veth,
        ]);
        ip_ok(&["link", "set", &ns.veth, "up"]);
        let n = ns.name.clone();
        ip_ok(&[
            "-n",
            &n,
            "addr",
            "add",
            &format!("{}/30", ns.host_ip()),
            "dev",
            &peer,
        ]);
        ip_ok(&["-n", &n, "link", "set", &peer, "up"]);
        ip_ok(&["-n", &n, "link", "set", "lo", "up"]);
        ns
    }

    fn target_ip(&self) -> String {
        format!("10.231.{}.1", self.net)
    }

    fn host_ip(&self) -> String {
        format!("10.231.{}.2", self.net)
    }

    fn peer(&self) -> String {
        self.veth.replace("nvt", "nvh")
    }

    /// Runs `f` on a thread that has entered the namespace (sockets it
    /// creates live there and stay usable from any thread).
    fn inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let fd = std::fs::File::open(&path).expect("netns handle");
            use std::os::fd::AsRawFd;
            // SAFETY: setns on a valid namespace descriptor; it affects
            // only this thread, which ends after `f`.
            let rc = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("thread in the namespace")
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.veth]);
    }
}

#[test]
fn half_open_peer_of_a_kato_0_controller_is_torn_down() {
    if std::process::Command::new("ip").arg("-V").output().is_err() {
        panic!("ip(8) (iproute2) is needed for this test: apt-get install iproute2");
    }
    let ns = NetNs::create(std::process::id() % 100_000);
    let target_ip = ns.target_ip();
    // Keepalive probes after 1 s idle, every 1 s, 2 of them: the peer is
    // declared gone after ~3 s (TCP_USER_TIMEOUT = idle + interval × probes).
    let d = Daemon::start(
        &target_ip,
        &[
            "--tcp-keepalive-idle-s",
            "1",
            "--tcp-keepalive-interval-s",
            "1",
            "--tcp-keepalive-probes",
            "2",
        ],
    );
    let addr: SocketAddr = format!("{target_ip}:{}", d.port).parse().unwrap();
    let host_ip: Ipv4Addr = ns.host_ip().parse().unwrap();
    // An NVM controller with KATO 0 (no keep-alive) and one I/O queue,
    // from inside the namespace.
    let (admin, io) = ns.inside(move || {
        let mut a = sock_from(host_ip, addr);
        let c = connect_queue(&mut a, 0, 0, CNTLID_DYNAMIC, DEFAULT_NQN, STORM_HOST);
        assert_eq!(c.status(), Status::SUCCESS, "admin connect with KATO 0");
        let mut q = sock_from(host_ip, addr);
        let c2 = connect_queue(&mut q, 1, 0, c.dw0() as u16, DEFAULT_NQN, STORM_HOST);
        assert_eq!(c2.status(), Status::SUCCESS, "I/O queue connect");
        (a, q)
    });
    d.wait_log("active_controllers=1");
    // Still there after several keepalive rounds while the peer answers.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        !d.logged("controller destroyed"),
        "a live peer lost its controller:\n{}",
        d.logs()
    );
    // The peer vanishes: no FIN, no RST, just silence.
    let t = Instant::now();
    ip_ok(&["-n", &ns.name, "link", "set", &ns.peer(), "down"]);
    let took = d.wait_log_for("active_controllers=0", Duration::from_secs(15));
    let logs = d.logs();
    assert!(
        took.is_some(),
        "controller of the half-open peer not torn down within 15 s:\n{logs}"
    );
    eprintln!("half-open peer detected after {:?}", t.elapsed());
    assert!(
        logs.contains("peer unreachable (TCP keepalive / user timeout expired)"),
        "{logs}"
    );
    assert!(
        logs.contains("closed (admin queue, controller torn down)"),
        "{logs}"
    );
    drop((admin, io));
}

#[test]
fn a_dead_reactor_stops_the_daemon_with_an_error() {
    // Issue 23: a reactor thread that dies (a panic outside every
    // connection's guard; injected in debug builds on reactor 1's first
    // accept) used to end silently, leaving its queues dead in a daemon that
    // still looked alive. Now the daemon logs which reactor died and why and
    // exits non-zero at once, for its supervisor to restart it.
    let port = free_port();
    let mut nvmfd = nvmf_testkit::Daemon::builder(config_json(port))
        .args(["-m", "0,1"])
        .env("NVMFD_DEBUG_PANIC_REACTOR", "1")
        .listening(&[port])
        .ready_within(Duration::from_secs(10))
        .start();
    // The kernel spreads connections over the reactors' SO_REUSEPORT
    // listeners by their addresses: one of 40 lands on reactor 1 (all on
    // reactor 0: odds of 2^-40).
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut socks = Vec::new();
    for _ in 0..40 {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            socks.push(s);
        }
        if !nvmfd.running() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = nvmfd.wait_exit(Duration::from_secs(15)).unwrap_or_else(|| {
        panic!(
            "nvmfd still running after reactor 1 died:\n{}",
            nvmfd.logs()
        )
    });
    assert!(!status.success(), "exit status {status}:\n{}", nvmfd.logs());
    let logs = nvmfd.logs();
    assert!(
        logs.contains(
            "reactor 1 died: internal error (panic): injected by NVMFD_DEBUG_PANIC_REACTOR"
        ),
        "{logs}"
    );
}
