//! error.rs — the initiator's error type (`Error`) and the decoding of NVMe
//! status values into readable text. Every failure the library reports goes
//! through here, so a user sees "Connect Invalid Host" rather than a number.

use nvmf_wire::status::sct;
use nvmf_wire::Status;
use std::fmt;
use std::io;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An NVMe completion that did not succeed, with the command it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmeError {
    /// What was being done ("Connect", "Identify Controller", "Read", ...).
    pub op: &'static str,
    /// The decoded status.
    pub status: Status,
    /// Completion dword 0 (Connect puts the invalid parameter's location here).
    pub dw0: u32,
    /// True if the command was a Fabrics Connect (its command specific
    /// codes 80h-84h have their own meaning).
    pub connect: bool,
}

impl NvmeError {
    /// The status' name, using the Connect meaning for Connect commands.
    pub fn status_name(&self) -> &'static str {
        if self.connect {
            connect_status_name(self.status)
        } else {
            self.status.name()
        }
    }
}

impl fmt::Display for NvmeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} (sct {:#x}, sc {:#04x}{})",
            self.op,
            self.status_name(),
            self.status.sct,
            self.status.sc,
            if self.status.dnr {
                ", do not retry"
            } else {
                ""
            }
        )?;
        if self.connect && plain(self.status) == Status::CONNECT_INVALID_PARAMETERS {
            // dw0: IPO (15:0) byte offset of the bad field, IATTR (bit 16)
            // set if it is in the Connect data rather than the SQE (as the
            // Linux and SPDK targets, and nvmf-wire's helper, send it).
            let ipo = self.dw0 & 0xffff;
            let in_data = (self.dw0 >> 16) & 1 != 0;
            let what = if in_data {
                match ipo {
                    0..=15 => "hostid",
                    16..=17 => "cntlid",
                    256..=511 => "subnqn (no such subsystem here?)",
                    512..=767 => "hostnqn",
                    _ => "connect data",
                }
            } else {
                match ipo {
                    40..=41 => "recfmt",
                    42..=43 => "qid",
                    44..=45 => "sqsize",
                    46 => "cattr",
                    48..=51 => "kato",
                    _ => "command",
                }
            };
            write!(
                f,
                "; invalid field: {what} at byte {ipo} of the {}",
                if in_data { "Connect data" } else { "command" }
            )?;
        }
        Ok(())
    }
}

/// Everything that can go wrong in the initiator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The TCP connection could not be opened.
    #[error("cannot connect to {addr}: {err}{hint}", hint = connect_hint(err))]
    Connect { addr: String, err: io::Error },
    /// Socket I/O failed after the connection was up.
    #[error("{what}: {err}")]
    Io { what: &'static str, err: io::Error },
    /// The target closed the connection.
    #[error("connection closed by the target{0}")]
    Closed(String),
    /// The target sent a C2HTermReq.
    #[error("target terminated the connection: {reason} (fes {fes:#x}, fei {fei})")]
    Terminated {
        fes: u16,
        fei: u32,
        reason: &'static str,
    },
    /// The target broke the NVMe/TCP protocol (we sent an H2CTermReq).
    #[error("protocol error from the target: {0}")]
    Protocol(String),
    /// A command completed with an error status.
    #[error("{0}")]
    Nvme(NvmeError),
    /// Nothing happened for too long.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The TLS handshake failed or TLS could not be set up (wrong key or
    /// identity, a target that does not speak TLS on that port, a timeout).
    #[error("TLS: {0}")]
    Tls(String),
    /// NVMe/RDMA could not be used or the RDMA connection failed (no
    /// rdma-core or device, a reject with its NVMe/RDMA status, ...).
    #[error("{0}")]
    Rdma(String),
    /// A caller mistake (bad transport ID, I/O too large, ...).
    #[error("invalid argument: {0}")]
    InvalidArg(String),
}

impl Error {
    /// The NVMe status, if this is a command failure.
    pub fn nvme_status(&self) -> Option<Status> {
        match self {
            Error::Nvme(e) => Some(e.status),
            _ => None,
        }
    }
    pub(crate) fn io(what: &'static str, source: io::Error) -> Error {
        Error::Io { what, err: source }
    }
}

fn connect_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => " (is a target listening on that address and port?)",
        io::ErrorKind::TimedOut => " (no answer; is the address reachable?)",
        _ => "",
    }
}

/// The status without its DNR/More bits, for comparisons.
pub(crate) fn plain(s: Status) -> Status {
    Status::new(s.sct, s.sc)
}

// TODO(wire): `Status::name()` cannot tell the Fabrics Connect meanings of
// command specific codes 80h-84h from the I/O command meanings (it returns
// "Attempted Write to Read Only Range / Connect Invalid Parameters"); a
// `Status::name_for_fabrics()` (or a name taking the opcode) in nvmf-wire
// would make this helper unnecessary.
/// Name of a status returned to a Fabrics Connect command.
pub fn connect_status_name(s: Status) -> &'static str {
    if s.sct == sct::COMMAND_SPECIFIC {
        match s.sc {
            0x80 => return "Connect Incompatible Format",
            0x81 => return "Connect Controller Busy",
            0x82 => return "Connect Invalid Parameters",
            0x83 => return "Connect Restart Discovery",
            0x84 => return "Connect Invalid Host",
            _ => {}
        }
    }
    s.name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_names() {
        let e = NvmeError {
            op: "Connect",
            status: Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
            dw0: (1 << 16) | 256,
            connect: true,
        };
        let s = Error::Nvme(e).to_string();
        assert!(s.contains("Connect Invalid Parameters"), "{s}");
        assert!(s.contains("subnqn"), "{s}");
        let e = NvmeError {
            op: "Connect",
            status: Status::CONNECT_INVALID_HOST,
            dw0: 0,
            connect: true,
        };
        assert!(Error::Nvme(e).to_string().contains("Connect Invalid Host"));
        let e = NvmeError {
            op: "Read",
            status: Status::LBA_OUT_OF_RANGE,
            dw0: 0,
            connect: false,
        };
        assert_eq!(
            Error::Nvme(e).to_string(),
            "Read failed: LBA Out of Range (sct 0x0, sc 0x80)"
        );
    }

    #[test]
    fn refused_hint() {
        let e = Error::Connect {
            addr: "127.0.0.1:1".into(),
            err: io::Error::from(io::ErrorKind::ConnectionRefused),
        };
        assert!(e.to_string().contains("is a target listening"));
    }
}
