//! Rough loopback load generator for nvmfd (not a benchmark of record):
//! one raw NVMe/TCP I/O queue, QD random 4 KiB reads (or writes with
//! `--write`), for N seconds; prints IOPS. Start nvmfd first, e.g.
//! `nvmfd -m 0` then `cargo run --release --example loopback_perf -- 4420 32 5`.

#[path = "../../nvmf-tcp/tests/common/host.rs"]
mod host;

use host::*;
use nvmf_wire::command::{Command, SglDescriptor};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

struct Sock {
    s: TcpStream,
    buf: Vec<u8>,
    parsed: std::collections::VecDeque<Resp>,
}

impl Wire for Sock {
    fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }
    fn recv(&mut self, h: &Host) -> Resp {
        loop {
            if let Some(r) = self.parsed.pop_front() {
                return r;
            }
            let got = h.parse(&mut self.buf).unwrap();
            self.parsed.extend(got);
            if !self.parsed.is_empty() {
                continue;
            }
            let mut tmp = vec![0u8; 1 << 20];
            let n = self.s.read(&mut tmp).unwrap();
            assert!(n > 0, "closed");
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }
}

fn open(port: u16) -> Sock {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_nodelay(true).unwrap();
    Sock {
        s,
        buf: Vec::new(),
        parsed: Default::default(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(4420);
    let qd: u16 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(32);
    let secs: u64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(5);
    let is_write = args.iter().any(|a| a == "--write");
    let nblocks: u64 = 1 << 20; // first 512 MiB of the namespace (512-byte blocks)

    let mut admin = open(port);
    let mut ah = Host::new();
    let cntlid = admin_up(&mut admin, &mut ah, false, false);
    let mut io = open(port);
    let mut h = Host::new();
    init(&mut io, &mut h, false, false);
    let c = connect(&mut io, &mut h, 1, 127, cntlid, DEFAULT_NQN, HOSTNQN);
    assert!(c.status().is_success());

    let payload = vec![0xa5u8; 4096];
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut next = |cid: u16| -> Vec<u8> {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let lba = (x % (nblocks / 8)) * 8;
        let mut cmd = Command::new(if is_write { 0x01 } else { 0x02 }, cid);
        cmd.set_nsid(1);
        cmd.set_lba_range(lba, 8);
        if is_write {
            cmd.set_sgl(SglDescriptor::in_capsule(0, 4096));
            h.capsule(&cmd, &payload)
        } else {
            cmd.set_sgl(SglDescriptor::transport(4096));
            h.capsule(&cmd, &[])
        }
    };
    let mut out = Vec::new();
    for cid in 0..qd {
        out.extend(next(cid));
    }
    io.send(&out);
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut done: u64 = 0;
    let h2 = {
        let mut t = Host::new();
        t.dopts.max_data_len = 1 << 20;
        t
    };
    let mut tmp = vec![0u8; 1 << 20];
    loop {
        let n = io.s.read(&mut tmp).unwrap();
        assert!(n > 0);
        io.buf.extend_from_slice(&tmp[..n]);
        let resps = h2.parse(&mut io.buf).unwrap();
        out.clear();
        for r in resps {
            if let Resp::Cqe(c) = r {
                assert!(c.status().is_success());
                done += 1;
                if Instant::now() < end {
                    out.extend(next(c.cid()));
                }
            }
        }
        if !out.is_empty() {
            io.send(&out);
        } else if Instant::now() >= end {
            break;
        }
    }
    let el = start.elapsed().as_secs_f64();
    println!(
        "{} 4KiB loopback: {:.0} IOPS ({} I/Os in {:.2}s, QD {})",
        if is_write { "write" } else { "randread" },
        done as f64 / el,
        done,
        el,
        qd
    );
}
