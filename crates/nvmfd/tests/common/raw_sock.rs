//! The raw-socket NVMe/TCP host shared by loopback.rs, hostile_hosts.rs and
//! hostile_memory.rs: [`Sock`], a `TcpStream` that speaks nvmf-tcp's test
//! codec (`tcp_common::host`, its `Wire` trait) to a real nvmfd (the daemon
//! itself is started with nvmf-testkit). It needs `tcp_common`: a test file
//! that uses it declares
//! `#[path = "../../nvmf-tcp/tests/common/mod.rs"] mod tcp_common;` and
//! `#[path = "common/raw_sock.rs"] mod raw_sock;`.
#![allow(dead_code)]

use crate::tcp_common::host::{Host, Resp, Wire};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A raw NVMe/TCP host socket: PDUs from nvmfd are decoded by the test
/// codec and handed out one at a time.
pub struct Sock {
    pub s: TcpStream,
    buf: Vec<u8>,
    parsed: VecDeque<Resp>,
}

impl Sock {
    /// Wraps an already connected stream (its timeouts left as they are).
    pub fn new(s: TcpStream) -> Sock {
        Sock {
            s,
            buf: Vec::new(),
            parsed: VecDeque::new(),
        }
    }

    /// Connects to nvmfd on 127.0.0.1:`port` with `timeout` for reads and
    /// writes and Nagle off.
    pub fn connect(port: u16, timeout: Duration) -> Sock {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to nvmfd");
        s.set_read_timeout(Some(timeout)).unwrap();
        s.set_write_timeout(Some(timeout)).unwrap();
        s.set_nodelay(true).unwrap();
        Sock::new(s)
    }
}

impl Wire for Sock {
    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("send to nvmfd");
    }

    fn recv(&mut self, host: &Host) -> Resp {
        loop {
            if let Some(r) = self.parsed.pop_front() {
                return r;
            }
            let got = host.parse(&mut self.buf).expect("nvmfd output decodes");
            self.parsed.extend(got);
            if !self.parsed.is_empty() {
                continue;
            }
            let mut tmp = [0u8; 65536];
            match self.s.read(&mut tmp) {
                Ok(0) => panic!("nvmfd closed the connection"),
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) => panic!("reading from nvmfd: {e}"),
            }
        }
    }
}
