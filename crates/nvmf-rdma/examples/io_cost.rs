//! Instructions per I/O of the two transports' state machines, side by side: 4 KiB reads of a
//! null namespace at queue depth 128 through an NVMe/RDMA queue (`RdmaQueue`, the device
//! played in memory: receives completed, WRITE and SEND completions returned, no data copied,
//! as a NIC's DMA costs the CPU nothing) or an NVMe/TCP connection (`nvmf_tcp::Connection`,
//! PDUs fed from memory, its output taken as if a socket had written it all). Neither counts
//! system calls, sockets or verbs doorbells: it is the target's own work per I/O, the part a
//! transport design decides. `tcpw`: 4 KiB writes with in-capsule data to a RAM disk
//! (malloc) over NVMe/TCP instead. Run it under callgrind twice with different counts and subtract
//! (BENCHMARKS.md, "NVMe/RDMA: instructions per I/O"):
//!
//!   valgrind --tool=callgrind target/release/examples/io_cost rdma 20000
//!   valgrind --tool=callgrind target/release/examples/io_cost rdma 120000

use std::sync::Arc;
use std::time::Duration;

use nvmf_config::{BdevKind, TransportType};
use nvmf_core::Target;
use nvmf_rdma::{RdmaQueue, RdmaQueueParams, Region, WorkCompletion, WorkRequest};
use nvmf_tcp::{Connection, TcpParams};
use nvmf_testkit::inproc;
use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::opcode::IoOpcode;
use nvmf_wire::pdu::{encode_capsule_cmd, encode_ic_req, EncodeOpts};
use nvmf_wire::zerocopy::IntoBytes;

const NQN: &str = "nqn.2024-01.io.nvmfd:cost";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000c0";
const QD: u16 = 128;

fn target(trtype: TransportType, kind: BdevKind) -> Arc<Target> {
    inproc::target(NQN, trtype, kind, 4096, 1 << 12)
}

fn read(cid: u16, slba: u64, sgl: SglDescriptor) -> Command {
    inproc::rw(IoOpcode::Read, cid, slba, 1, sgl)
}

/// The device side of an RdmaQueue: receives in posting order, completions for every
/// signaled work request.
struct Device {
    posted: std::collections::VecDeque<u64>,
    done: Vec<WorkCompletion>,
    work: Vec<WorkRequest>,
    responses: usize,
}

impl Device {
    fn run(&mut self, q: &mut RdmaQueue) {
        loop {
            self.work.clear();
            q.take_work(&mut self.work);
            if self.work.is_empty() {
                return;
            }
            for wr in &self.work {
                match *wr {
                    WorkRequest::Recv { wr_id, .. } => self.posted.push_back(wr_id),
                    WorkRequest::Read { wr_id, .. } => self.done.push(WorkCompletion {
                        wr_id,
                        ok: true,
                        byte_len: 0,
                    }),
                    WorkRequest::Write { .. } => {}
                    // the device answers a liveness probe; none comes while I/O flows
                    WorkRequest::Probe { wr_id } => self.done.push(WorkCompletion {
                        wr_id,
                        ok: true,
                        byte_len: 0,
                    }),
                    WorkRequest::Send { wr_id, .. } => {
                        self.responses += 1;
                        self.done.push(WorkCompletion {
                            wr_id,
                            ok: true,
                            byte_len: 0,
                        });
                    }
                }
            }
            for wc in self.done.drain(..) {
                q.on_completion(&wc, 0);
            }
        }
    }

    fn send(&mut self, q: &mut RdmaQueue, cmd: &Command, icd: &[u8]) {
        let wr_id = self.posted.pop_front().expect("a posted receive");
        let buf = q.region_mut(Region::Recv((wr_id & 0xffff) as u16));
        buf[..64].copy_from_slice(cmd.as_bytes());
        buf[64..64 + icd.len()].copy_from_slice(icd);
        q.on_completion(
            &WorkCompletion {
                wr_id,
                ok: true,
                byte_len: (64 + icd.len()) as u32,
            },
            0,
        );
    }
}

fn rdma_queue(t: &Arc<Target>, dev: &mut Device, qid: u16, cntlid: u16) -> RdmaQueue {
    let p = RdmaQueueParams {
        requests: inproc::rdma_request_params(4 << 20, Duration::from_secs(30)),
        entries: QD,
        read_depth: 16,
        shared_receives: false,
        connect: None,
    };
    let mut q = RdmaQueue::new(
        t.clone(),
        inproc::port(TransportType::Rdma, nvmf_rdma::CAPS),
        &p,
    );
    q.start();
    dev.run(&mut q);
    let data = ConnectData::new([1; 16], cntlid, NQN, HOST);
    let mut c = Command::connect(1, qid, QD - 1, 0, 0);
    c.set_sgl(SglDescriptor::in_capsule(0, 1024));
    dev.send(&mut q, &c, data.as_bytes());
    dev.run(&mut q);
    if qid == 0 {
        dev.send(
            &mut q,
            &Command::property_set(2, CC, false, 0x0046_0001),
            &[],
        );
        dev.run(&mut q);
    }
    q
}

fn run_rdma(n: u64) -> u64 {
    let t = target(TransportType::Rdma, BdevKind::Null);
    let mut dev = Device {
        posted: Default::default(),
        done: Vec::new(),
        work: Vec::new(),
        responses: 0,
    };
    let admin = rdma_queue(&t, &mut dev, 0, 0xFFFF);
    let cntlid = admin.queue().controller().expect("controller").cntlid();
    let mut io = rdma_queue(&t, &mut dev, 1, cntlid);
    dev.responses = 0;
    let mut issued = 0u64;
    while issued < n {
        for cid in 0..QD {
            let sgl = SglDescriptor::keyed(0x10000 + u64::from(cid) * 4096, 4096, 0x77, false);
            dev.send(&mut io, &read(cid, issued % 1000, sgl), &[]);
            issued += 1;
        }
        dev.run(&mut io);
    }
    dev.responses as u64
}

fn run_tcp(n: u64, write: bool) -> u64 {
    let kind = if write {
        BdevKind::Malloc
    } else {
        BdevKind::Null
    };
    let t = target(TransportType::Tcp, kind);
    let params = TcpParams::new(t.limits(), true);
    let opts = EncodeOpts::new(false, false);
    let drain = |c: &mut Connection| -> usize {
        let n = c.output_len();
        c.consume_output(n);
        n
    };
    let connect = |qid: u16, cntlid: u16| -> Connection {
        let mut c = Connection::new(
            t.clone(),
            inproc::port(TransportType::Tcp, nvmf_tcp::CAPS),
            &params,
        );
        let mut b = Vec::new();
        encode_ic_req(&mut b, 0, false, false, 0);
        let data = ConnectData::new([1; 16], cntlid, NQN, HOST);
        let mut cmd = Command::connect(1, qid, QD - 1, 0, 0);
        cmd.set_sgl(SglDescriptor::in_capsule(0, 1024));
        encode_capsule_cmd(&mut b, &opts, &cmd, data.as_bytes());
        if qid == 0 {
            encode_capsule_cmd(
                &mut b,
                &opts,
                &Command::property_set(2, CC, false, 0x0046_0001),
                &[],
            );
        }
        c.feed(&b);
        drain(&mut c);
        c
    };
    let admin = connect(0, 0xFFFF);
    let cntlid = admin.queue().controller().expect("controller").cntlid();
    let mut io = connect(1, cntlid);
    let mut batch = Vec::new();
    let payload = [0x5a; 4096];
    for cid in 0..QD {
        if write {
            let sgl = SglDescriptor::in_capsule(0, 4096);
            let c = inproc::rw(IoOpcode::Write, cid, u64::from(cid), 1, sgl);
            encode_capsule_cmd(&mut batch, &opts, &c, &payload);
        } else {
            let sgl = SglDescriptor::transport(4096);
            encode_capsule_cmd(&mut batch, &opts, &read(cid, u64::from(cid), sgl), &[]);
        }
    }
    let mut bytes = 0u64;
    let mut issued = 0u64;
    while issued < n {
        io.feed(&batch);
        issued += u64::from(QD);
        bytes += drain(&mut io) as u64;
    }
    if write {
        // One 24-byte CapsuleResp per write.
        bytes / 24
    } else {
        // 4096 bytes of data plus a C2HData header per read (SUCCESS flag: no response capsule).
        bytes / 4096
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "rdma".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let done = match which.as_str() {
        "rdma" => run_rdma(n),
        "tcp" => run_tcp(n, false),
        "tcpw" => run_tcp(n, true),
        other => {
            eprintln!("usage: io_cost rdma|tcp|tcpw [N]  (not {other:?})");
            std::process::exit(2);
        }
    };
    println!("{which}: {done} reads of 4 KiB completed");
}
