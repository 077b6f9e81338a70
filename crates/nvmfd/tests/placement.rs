//! Queue placement over reactors on the real daemon (`nvmfd -m 0,1`, two
//! reactors): the I/O queues of one controller (4, then 8) end up split
//! exactly in half between the reactors whatever the kernel's SO_REUSEPORT
//! hash chose, several controllers connecting interleaved are each split
//! in half, I/O works on every queue right after it moved (verified
//! write + read, and Write Zeroes large enough to run on the helper pool,
//! whose completion must wake the reactor that now owns the queue), and
//! disconnecting brings every reactor's `current_io_qpairs` back to zero.
//! Namespace 2 is a file on io_uring: a moved queue submits to the ring of
//! its new reactor. Raw-socket queues pipeline commands behind their
//! Connect: the responses move with the queue, and a queue whose pipelined
//! command is still executing in the io_uring stays where it is. Counts are
//! read over the RPC socket (`nvmf_get_stats`,
//! `nvmf_subsystem_get_qpairs`).

#[path = "common/raw_sock.rs"]
mod raw_sock;
#[path = "../../nvmf-tcp/tests/common/mod.rs"]
mod tcp_common;

use nvmf_host::controller::{ConnectOptions, Controller};
use nvmf_host::queue::{IoCompletion, IoQueue};
use nvmf_host::trid::TransportId;
use nvmf_rpc::RpcClient;
use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::fabrics::ConnectData;
use nvmf_wire::status::Status;
use raw_sock::Sock;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tcp_common::host::{admin_up_nqn, init, Host, Resp, Wire, HOSTNQN};
use zerocopy::IntoBytes;

const NQN: &str = "nqn.2024-01.io.nvmfd:placement";
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Namespaces 1 (RAM) and 2 (file on io_uring): 4 MiB of 512-byte blocks.
const NS_BLOCKS: u64 = 8192;

/// A running nvmfd (nvmf-testkit's: killed on drop, config and socket
/// removed) with its file bdev's image (removed after it).
struct Daemon {
    nvmfd: nvmf_testkit::Daemon,
    port: u16,
    sock: PathBuf,
    img: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.nvmfd.kill();
        let _ = std::fs::remove_file(&self.img);
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn config(port: u16, img: &std::path::Path) -> String {
    let l =
        format!(r#"{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}"#);
    format!(
        r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":{NS_BLOCKS}}}}},
   {{"method":"bdev_uring_create","params":{{"name":"F0","filename":"{img}","block_size":512}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP","in_capsule_data_size":4096,"max_io_size":131072}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true,"serial_number":"NVMFDPLACE0001"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":2,"bdev_name":"F0"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{l}}}}}
 ]}}]}}"#,
        img = img.display()
    )
}

impl Daemon {
    /// `nvmfd -m 0,1 -c CFG -r SOCK ARGS`, ready to serve.
    fn start(args: &[&str]) -> Daemon {
        let img = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "nvmfd-placement-{}-{}.img",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(NS_BLOCKS * 512)
            .unwrap();
        let nvmfd = nvmf_testkit::Daemon::start_on_free_port(|port| {
            nvmf_testkit::Daemon::builder(config(port, &img))
                .args(["-m", "0,1", "--log-level", "info,nvmfd=debug"])
                .args(args)
                .listening(&[port])
                .ready_when(&format!("listening on 127.0.0.1:{port} (tcp)"))
                .ready_within(Duration::from_secs(10))
        });
        Daemon {
            port: nvmfd.port(),
            sock: nvmfd.rpc_socket.clone(),
            nvmfd,
            img,
        }
    }

    fn call(&self, method: &str, params: Value) -> Value {
        let mut c = RpcClient::connect(&self.sock, 50).expect("connect to the RPC socket");
        c.set_timeout(Some(Duration::from_secs(10))).unwrap();
        c.call(method, Some(&params))
            .unwrap_or_else(|e| panic!("{method}: {e:?}"))
    }

    /// `current_io_qpairs` of each poll group (reactor), in reactor order.
    fn io_qpairs(&self) -> Vec<u64> {
        let s = self.call("nvmf_get_stats", json!({}));
        s["poll_groups"]
            .as_array()
            .expect("poll_groups")
            .iter()
            .map(|g| g["current_io_qpairs"].as_u64().expect("current_io_qpairs"))
            .collect()
    }

    /// I/O queues of each controller per poll group: cntlid → thread →
    /// count (from `nvmf_subsystem_get_qpairs`).
    fn split(&self) -> HashMap<u64, HashMap<String, u64>> {
        let q = self.call("nvmf_subsystem_get_qpairs", json!({ "nqn": NQN }));
        let mut out: HashMap<u64, HashMap<String, u64>> = HashMap::new();
        for qp in q.as_array().expect("qpair list") {
            if qp["qid"].as_u64() == Some(0) {
                continue;
            }
            let cntlid = qp["cntlid"].as_u64().expect("cntlid");
            let thread = qp["thread"].as_str().expect("thread").to_string();
            *out.entry(cntlid).or_default().entry(thread).or_default() += 1;
        }
        out
    }

    /// Waits (10 s at most) until the reactors hold `total` I/O queues
    /// (a queue on its way between reactors is counted by neither).
    fn wait_total(&self, total: u64) -> Vec<u64> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.io_qpairs();
            if v.iter().sum::<u64>() == total {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "reactors hold {v:?} I/O queues, want {total} in all; log:\n{}",
                self.nvmfd.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn connect(&self, queues: u16) -> Controller {
        let trid = TransportId::tcp("127.0.0.1", &self.port.to_string(), NQN);
        let ctrl = Controller::connect(&ConnectOptions::new(trid)).expect("connect");
        let got = ctrl
            .set_num_queues(queues)
            .expect("Set Features Number of Queues");
        assert!(
            got >= queues,
            "target offers {got} I/O queues, want {queues}"
        );
        ctrl
    }
}

/// The bytes a queue writes in round `r`.
fn pattern(qid: u16, r: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 ^ (qid as u64) << 3 ^ r.wrapping_mul(131)) as u8)
        .collect()
}

fn wait(q: &mut IoQueue) -> IoCompletion {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        if let Some(c) = q.next_completion() {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "I/O on queue {} timed out",
            q.qid()
        );
        q.poll(Some(IO_TIMEOUT)).expect("queue failed");
    }
}

/// Right after its Connect (the queue may still be on its way to another
/// reactor): a burst of writes to this queue's own blocks, then the reads
/// back, verified, on namespace `nsid`. Every queue owns a distinct 64 KiB
/// region.
fn verified_io(q: &mut IoQueue, nsid: u32) {
    let qid = q.qid();
    let base = qid as u64 * 128;
    assert!(base + 128 <= NS_BLOCKS / 2);
    let mut slots = Vec::new();
    for k in 0..16u64 {
        let s = q.alloc().expect("free slot");
        q.buf_mut(s)[..4096].copy_from_slice(&pattern(qid, k, 4096));
        q.submit_write(s, nsid, base + k * 8, 8, 4096).unwrap();
        slots.push(s);
    }
    for _ in 0..16 {
        let c = wait(q);
        assert!(
            c.status.is_success(),
            "write on queue {qid}: {:?}",
            c.status
        );
        q.release(c.slot);
    }
    let mut lba_of = HashMap::new();
    for k in 0..16u64 {
        let s = q.alloc().expect("free slot");
        q.submit_read(s, nsid, base + k * 8, 8, 4096).unwrap();
        lba_of.insert(s, k);
    }
    for _ in 0..16 {
        let c = wait(q);
        assert!(c.status.is_success(), "read on queue {qid}: {:?}", c.status);
        let k = lba_of[&c.slot];
        assert!(
            q.buf(c.slot)[..4096] == pattern(qid, k, 4096)[..],
            "queue {qid}: block {k} read back wrong"
        );
        q.release(c.slot);
    }
}

/// Median time of Write Zeroes over 512 KiB (more than the 256 KiB a
/// reactor zeroes inline: runs on the helper pool, whose completion wakes
/// the queue's owner). A queue whose wake-up still pointed at the reactor
/// it came from would see each completion only on its owner's 100 ms tick.
fn helper_zeroes_median(q: &mut IoQueue) -> Duration {
    let mut lat = Vec::new();
    for _ in 0..9 {
        let s = q.alloc().expect("free slot");
        let t = Instant::now();
        q.submit_write_zeroes(s, 1, NS_BLOCKS / 2, 1024, false)
            .unwrap();
        let c = wait(q);
        lat.push(t.elapsed());
        assert!(c.status.is_success(), "write zeroes: {:?}", c.status);
        q.release(c.slot);
    }
    lat.sort_unstable();
    lat[lat.len() / 2]
}

#[test]
fn one_controller_queues_split_in_half() {
    let d = Daemon::start(&[]);
    for n in [4u16, 8] {
        let ctrl = d.connect(n);
        let mut queues: Vec<IoQueue> = (1..=n)
            .map(|qid| {
                ctrl.create_io_queue(qid, 32, 4096)
                    .expect("create I/O queue")
            })
            .collect();
        // I/O at once, while the queues may still be moving.
        for q in &mut queues {
            verified_io(q, 1);
            verified_io(q, 2);
        }
        let per = d.wait_total(n as u64);
        assert_eq!(
            per,
            vec![n as u64 / 2; 2],
            "{n} queues of one controller; log:\n{}",
            d.nvmfd.logs()
        );
        let split = d.split();
        assert_eq!(split.len(), 1);
        for (cntlid, threads) in &split {
            assert!(
                threads.len() == 2 && threads.values().all(|&k| k == n as u64 / 2),
                "controller {cntlid}: {threads:?}"
            );
        }
        // Every queue still works after the move; helper completions
        // reach the reactor that owns the queue now.
        for q in &mut queues {
            verified_io(q, 1);
            verified_io(q, 2);
            let m = helper_zeroes_median(q);
            eprintln!("{n} queues: queue {} Write Zeroes median {m:?}", q.qid());
            assert!(
                m < Duration::from_millis(30),
                "queue {}: Write Zeroes on the helper pool took {m:?} (median)",
                q.qid()
            );
        }
        drop(queues);
        drop(ctrl);
        let per = d.wait_total(0);
        assert_eq!(per, [0, 0]);
    }
    assert!(
        d.nvmfd.logged("I/O queue placed on reactor 1") && d.nvmfd.logged("taken over"),
        "no placement / hand-over logged:\n{}",
        d.nvmfd.logs()
    );
}

#[test]
fn interleaved_controllers_each_split_in_half() {
    let d = Daemon::start(&[]);
    const CTRLS: usize = 4;
    const QUEUES: u16 = 4;
    let mut ctrls: Vec<Controller> = (0..CTRLS).map(|_| d.connect(QUEUES)).collect();
    // c0q1 c1q1 c2q1 c3q1 c0q2 ...
    let mut queues: Vec<Vec<IoQueue>> = (0..CTRLS).map(|_| Vec::new()).collect();
    for qid in 1..=QUEUES {
        for (c, ctrl) in ctrls.iter().enumerate() {
            queues[c].push(
                ctrl.create_io_queue(qid, 16, 4096)
                    .expect("create I/O queue"),
            );
        }
    }
    let total = (CTRLS * QUEUES as usize) as u64;
    let per = d.wait_total(total);
    assert_eq!(per, [total / 2, total / 2]);
    let split = d.split();
    assert_eq!(split.len(), CTRLS);
    for (cntlid, threads) in &split {
        assert!(
            threads.len() == 2 && threads.values().all(|&k| k == QUEUES as u64 / 2),
            "controller {cntlid}: its {QUEUES} I/O queues are split {threads:?}"
        );
    }
    for q in queues.iter_mut().flatten() {
        verified_io(q, 1);
    }
    // One controller goes: the others keep their halves.
    queues.remove(0);
    drop(ctrls.remove(0));
    let per = d.wait_total(total - QUEUES as u64);
    assert_eq!(per, [(total - QUEUES as u64) / 2; 2]);
    drop(queues);
    drop(ctrls);
    let per = d.wait_total(0);
    assert_eq!(per, [0, 0]);
}

// ------------------------------------------------- pipelined after Connect

/// A raw NVMe/TCP I/O queue whose Connect is followed, in the same write,
/// by more commands: they are processed by the reactor that accepted the
/// connection, and their responses (possibly not all written yet) move with
/// the queue.
fn pipelined_queue(
    d: &Daemon,
    cntlid: u16,
    qid: u16,
    tail: &dyn Fn(&Host) -> Vec<u8>,
) -> (Sock, Host) {
    // A small receive buffer: the target cannot write all responses before
    // the host reads, so output is still queued when the queue moves.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(16 * 1024).unwrap();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], d.port).into();
    sock.connect(&addr.into()).expect("connect to nvmfd");
    let stream: std::net::TcpStream = sock.into();
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_nodelay(true).unwrap();
    let mut s = Sock::new(stream);
    let mut h = Host::new();
    init(&mut s, &mut h, false, false);
    let mut cmd = Command::connect(h.cid(), qid, 127, 0, 0);
    let cd = ConnectData::new([7; 16], cntlid, NQN, HOSTNQN);
    cmd.set_sgl(SglDescriptor::in_capsule(0, 1024));
    let mut bytes = h.capsule(&cmd, cd.as_bytes());
    bytes.extend(tail(&h));
    s.send(&bytes);
    match s.recv(&h) {
        Resp::Cqe(c) => assert_eq!(c.status(), Status::SUCCESS, "Connect of queue {qid}"),
        other => panic!("queue {qid}: expected the Connect response, got {other:?}"),
    }
    (s, h)
}

/// Collects responses until `n` commands completed: cid → (status, data).
fn collect(s: &mut Sock, h: &Host, n: usize) -> HashMap<u16, (Status, Vec<u8>)> {
    let mut done: HashMap<u16, (Status, Vec<u8>)> = HashMap::new();
    let mut data: HashMap<u16, Vec<u8>> = HashMap::new();
    while done.len() < n {
        match s.recv(h) {
            Resp::Cqe(c) => {
                let d = data.remove(&c.cid()).unwrap_or_default();
                done.insert(c.cid(), (c.status(), d));
            }
            Resp::C2H {
                cccid,
                datao,
                data: bytes,
                success,
                ..
            } => {
                let buf = data.entry(cccid).or_default();
                assert_eq!(datao as usize, buf.len(), "C2H data in order");
                buf.extend_from_slice(&bytes);
                if success {
                    let d = data.remove(&cccid).unwrap_or_default();
                    done.insert(cccid, (Status::SUCCESS, d));
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    done
}

/// Each of 8 queues pipelines, behind its Connect, 32 in-capsule 4 KiB
/// writes over its own 128 KiB and 40 reads of all of it (5 MiB of read
/// data, more than the socket buffers hold, before the host reads
/// anything): the queues still split in half, the queues that moved carried
/// queued output, and every response arrives, in order, with the right
/// data. (8 queues: the kernel's hash alone rarely matches the placement
/// for all of them, so some queues move.)
#[test]
fn pipelined_commands_move_with_the_queue() {
    const READS: u16 = 40;
    const QUEUES: u16 = 8;
    let d = Daemon::start(&[]);
    let mut admin = Sock::connect(d.port, IO_TIMEOUT);
    let mut ah = Host::new();
    let cntlid = admin_up_nqn(&mut admin, &mut ah, false, false, NQN);
    let mut queues = Vec::new();
    for qid in 1..=QUEUES {
        let base = qid as u64 * 256;
        let tail = |h: &Host| {
            let mut v = Vec::new();
            for k in 0..32u16 {
                let mut w = Command::new(0x01, 100 + k);
                w.set_nsid(1).set_lba_range(base + k as u64 * 8, 8);
                w.set_sgl(SglDescriptor::in_capsule(0, 4096));
                v.extend(h.capsule(&w, &pattern(qid, k as u64, 4096)));
            }
            for k in 0..READS {
                let mut r = Command::new(0x02, 200 + k);
                r.set_nsid(1).set_lba_range(base, 256);
                r.set_sgl(SglDescriptor::transport(128 * 1024));
                v.extend(h.capsule(&r, &[]));
            }
            v
        };
        queues.push((qid, pipelined_queue(&d, cntlid, qid, &tail)));
    }
    for (qid, (s, h)) in &mut queues {
        let done = collect(s, h, 32 + READS as usize);
        for k in 0..32u16 {
            assert_eq!(done[&(100 + k)].0, Status::SUCCESS, "queue {qid} write {k}");
        }
        let expect: Vec<u8> = (0..32).flat_map(|k| pattern(*qid, k, 4096)).collect();
        for k in 0..READS {
            let (st, data) = &done[&(200 + k)];
            assert_eq!(*st, Status::SUCCESS, "queue {qid} read {k}");
            assert!(*data == expect, "queue {qid} read {k}: wrong data");
        }
    }
    assert_eq!(d.wait_total(QUEUES as u64), [QUEUES as u64 / 2; 2]);
    let logs = d.nvmfd.logs();
    let handed: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("handing the I/O queue"))
        .collect();
    eprintln!("{}", handed.join("\n"));
    let carried = handed
        .iter()
        .filter(|l| !l.contains(" with 0 bytes"))
        .count();
    assert!(
        carried > 0 || handed.is_empty(),
        "no queue moved with output queued; log:\n{}",
        d.nvmfd.logs()
    );
    drop(queues);
    drop(admin);
    assert_eq!(d.wait_total(0), [0, 0]);
}

/// A queue with a command still executing in its reactor's io_uring when
/// its Connect completes (a read of the file namespace, pipelined behind
/// the Connect) is not moved: the command completes where it was
/// submitted.
#[test]
fn queue_with_a_command_executing_stays() {
    let d = Daemon::start(&[]);
    let mut admin = Sock::connect(d.port, IO_TIMEOUT);
    let mut ah = Host::new();
    let cntlid = admin_up_nqn(&mut admin, &mut ah, false, false, NQN);
    let mut queues = Vec::new();
    for qid in 1..=4u16 {
        let tail = |h: &Host| {
            let mut r = Command::new(0x02, 300);
            r.set_nsid(2).set_lba_range(0, 8);
            r.set_sgl(SglDescriptor::transport(4096));
            h.capsule(&r, &[])
        };
        let (mut s, h) = pipelined_queue(&d, cntlid, qid, &tail);
        let done = collect(&mut s, &h, 1);
        assert_eq!(done[&300].0, Status::SUCCESS, "queue {qid}: file read");
        assert_eq!(done[&300].1.len(), 4096);
        queues.push((s, h));
    }
    d.wait_total(4);
    assert!(
        d.nvmfd
            .logged("I/O queue stays: a command pipelined behind its Connect is executing"),
        "no queue stayed for its executing command; log:\n{}",
        d.nvmfd.logs()
    );
    assert!(
        !d.nvmfd.logged("taken over"),
        "a queue moved:\n{}",
        d.nvmfd.logs()
    );
    // They work where they are.
    for (qid, (s, h)) in queues.iter_mut().enumerate() {
        let mut r = Command::new(0x02, 301);
        r.set_nsid(2).set_lba_range(0, 8);
        r.set_sgl(SglDescriptor::transport(4096));
        s.send(&h.capsule(&r, &[]));
        let done = collect(s, h, 1);
        assert_eq!(
            done[&301].0,
            Status::SUCCESS,
            "queue {}: second read",
            qid + 1
        );
    }
}
