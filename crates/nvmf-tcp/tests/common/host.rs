//! Test-only NVMe/TCP host: builds host PDUs with the nvmf-wire encoders,
//! parses what the target sends back into owned values, and runs the usual
//! command flows (in-capsule writes, R2T/H2CData writes, C2HData reads) over
//! any byte transport implementing `Wire` (an in-memory `Connection` in the
//! nvmf-tcp tests, a real socket in the nvmfd loopback tests).
#![allow(dead_code)]

use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CC, CC_EN, CNTLID_DYNAMIC, CSTS};
use nvmf_wire::pdu::{
    decode, encode_capsule_cmd, encode_h2c_data, encode_ic_req, DecodeOpts, Decoded, EncodeOpts,
    Pdu, PduError, Role, DATA_LAST,
};
use nvmf_wire::status::Status;
use zerocopy::IntoBytes;

pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
pub const DEFAULT_NQN: &str = "nqn.2024-01.io.nvmfd:default";

/// One PDU from the target, owned.
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    IcResp {
        hdgst: bool,
        ddgst: bool,
        cpda: u8,
        maxh2cdata: u32,
    },
    Cqe(Completion),
    C2H {
        cccid: u16,
        datao: u32,
        data: Vec<u8>,
        last: bool,
        success: bool,
        ddok: bool,
    },
    R2T {
        cccid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
    },
    Term {
        fes: u16,
        fei: u32,
        quoted: Vec<u8>,
    },
}

/// Host side PDU codec state.
#[derive(Debug, Clone)]
pub struct Host {
    pub eo: EncodeOpts,
    pub dopts: DecodeOpts,
    pub maxh2cdata: u32,
    next_cid: u16,
}

impl Default for Host {
    fn default() -> Self {
        Host::new()
    }
}

impl Host {
    pub fn new() -> Host {
        Host {
            eo: EncodeOpts::new(false, false),
            dopts: DecodeOpts::new(Role::Host),
            maxh2cdata: 4096,
            next_cid: 1,
        }
    }

    pub fn cid(&mut self) -> u16 {
        let c = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        c
    }

    pub fn icreq(&self, hdgst: bool, ddgst: bool) -> Vec<u8> {
        let mut v = Vec::new();
        encode_ic_req(&mut v, 0, hdgst, ddgst, 0);
        v
    }

    pub fn capsule(&self, cmd: &Command, data: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        encode_capsule_cmd(&mut v, &self.eo, cmd, data);
        v
    }

    pub fn h2c(&self, cccid: u16, ttag: u16, datao: u32, data: &[u8], last: bool) -> Vec<u8> {
        let mut v = Vec::new();
        let flags = if last { DATA_LAST } else { 0 };
        encode_h2c_data(&mut v, &self.eo, cccid, ttag, datao, data, flags);
        v
    }

    /// Decodes every complete PDU at the front of `buf` (removing them).
    pub fn parse(&self, buf: &mut Vec<u8>) -> Result<Vec<Resp>, PduError> {
        let mut out = Vec::new();
        let mut off = 0;
        loop {
            match decode(&buf[off..], &self.dopts)? {
                Decoded::Incomplete { .. } => break,
                Decoded::Pdu { len, pdu } => {
                    out.push(owned(&pdu));
                    off += len;
                }
            }
        }
        buf.drain(..off);
        Ok(out)
    }
}

fn owned(p: &Pdu<'_>) -> Resp {
    match *p {
        Pdu::IcResp(r) => Resp::IcResp {
            hdgst: r.hdgst_enabled(),
            ddgst: r.ddgst_enabled(),
            cpda: r.cpda(),
            maxh2cdata: r.maxh2cdata(),
        },
        Pdu::CapsuleResp(r) => Resp::Cqe(r.cqe),
        Pdu::C2HData {
            hdr,
            data,
            data_digest_ok,
        } => Resp::C2H {
            cccid: hdr.cccid(),
            datao: hdr.datao(),
            data: data.to_vec(),
            last: hdr.last(),
            success: hdr.success(),
            ddok: data_digest_ok,
        },
        Pdu::R2T(r) => Resp::R2T {
            cccid: r.cccid(),
            ttag: r.ttag(),
            r2to: r.r2to(),
            r2tl: r.r2tl(),
        },
        Pdu::C2HTermReq { hdr, data } => Resp::Term {
            fes: hdr.fes(),
            fei: hdr.fei(),
            quoted: data.to_vec(),
        },
        ref other => panic!("host got a host-to-controller PDU: {other:?}"),
    }
}

/// A byte pipe to a target.
pub trait Wire {
    fn send(&mut self, bytes: &[u8]);
    /// The next PDU from the target (panics / fails the test if none comes).
    fn recv(&mut self, host: &Host) -> Resp;
}

/// ICReq → ICResp; switches the host codec to the negotiated digests.
pub fn init<W: Wire>(w: &mut W, host: &mut Host, hdgst: bool, ddgst: bool) -> Resp {
    w.send(&host.icreq(hdgst, ddgst));
    let r = w.recv(host);
    match r {
        Resp::IcResp {
            hdgst: h,
            ddgst: d,
            maxh2cdata,
            cpda,
        } => {
            assert_eq!((h, d), (hdgst, ddgst), "digests mirrored");
            assert_eq!(cpda, 0);
            assert!(maxh2cdata >= 4096 && maxh2cdata % 4 == 0);
            host.eo = EncodeOpts::new(h, d);
            host.dopts.hdgst = h;
            host.dopts.ddgst = d;
            host.dopts.max_data_len = 1 << 20;
            host.maxh2cdata = maxh2cdata;
        }
        ref other => panic!("expected ICResp, got {other:?}"),
    }
    r
}

/// How a command's host→controller data travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out<'a> {
    None,
    InCapsule(&'a [u8]),
    R2t(&'a [u8]),
}

/// Sends `cmd` (its SGL is set here) and runs the transfer to the end.
/// Returns the completion and the controller→host data (if `read_len` > 0).
pub fn exec<W: Wire>(
    w: &mut W,
    host: &Host,
    mut cmd: Command,
    out: Out<'_>,
    read_len: u32,
) -> (Completion, Vec<u8>) {
    let cid = cmd.cid();
    match out {
        Out::None => {
            cmd.set_sgl(SglDescriptor::transport(read_len));
            w.send(&host.capsule(&cmd, &[]));
        }
        Out::InCapsule(d) => {
            cmd.set_sgl(SglDescriptor::in_capsule(0, d.len() as u32));
            w.send(&host.capsule(&cmd, d));
        }
        Out::R2t(d) => {
            cmd.set_sgl(SglDescriptor::transport(d.len() as u32));
            w.send(&host.capsule(&cmd, &[]));
        }
    }
    let mut data = Vec::new();
    loop {
        match w.recv(host) {
            Resp::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => {
                assert_eq!(cccid, cid);
                let Out::R2t(d) = out else {
                    panic!("unexpected R2T")
                };
                let mut off = r2to as usize;
                let end = (r2to + r2tl) as usize;
                let mut bytes = Vec::new();
                while off < end {
                    let n = (end - off).min(host.maxh2cdata as usize);
                    bytes.extend(host.h2c(cid, ttag, off as u32, &d[off..off + n], off + n == end));
                    off += n;
                }
                w.send(&bytes);
            }
            Resp::C2H {
                cccid,
                datao,
                data: d,
                last,
                success,
                ddok,
            } => {
                assert_eq!(cccid, cid);
                assert!(ddok, "C2H data digest");
                assert_eq!(datao as usize, data.len());
                data.extend_from_slice(&d);
                if success {
                    assert!(last);
                    return (Completion::new(cid, 0, 0, Status::SUCCESS, 0), data);
                }
            }
            Resp::Cqe(c) => {
                assert_eq!(c.cid(), cid);
                return (c, data);
            }
            other => panic!("unexpected {other:?} while executing cid {cid}"),
        }
    }
}

/// Connect (admin when `qid` is 0). Returns the completion.
pub fn connect<W: Wire>(
    w: &mut W,
    host: &mut Host,
    qid: u16,
    sqsize: u16,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
) -> Completion {
    let cid = host.cid();
    let cmd = Command::connect(cid, qid, sqsize, 0, if qid == 0 { 30_000 } else { 0 });
    let cd = ConnectData::new([7; 16], cntlid, subnqn, hostnqn);
    exec(w, host, cmd, Out::InCapsule(cd.as_bytes()), 0).0
}

/// Admin queue bring-up: ICReq, Connect, CC.EN = 1, wait for CSTS.RDY.
/// Returns the controller ID.
pub fn admin_up<W: Wire>(w: &mut W, host: &mut Host, hdgst: bool, ddgst: bool) -> u16 {
    admin_up_nqn(w, host, hdgst, ddgst, DEFAULT_NQN)
}

/// `admin_up` to subsystem `subnqn`.
pub fn admin_up_nqn<W: Wire>(
    w: &mut W,
    host: &mut Host,
    hdgst: bool,
    ddgst: bool,
    subnqn: &str,
) -> u16 {
    init(w, host, hdgst, ddgst);
    let c = connect(w, host, 0, 31, CNTLID_DYNAMIC, subnqn, HOSTNQN);
    assert_eq!(c.status(), Status::SUCCESS, "admin connect");
    let cntlid = c.dw0() as u16;
    let cid = host.cid();
    let cc = CC_EN | (6 << 16) | (4 << 20);
    let set = Command::property_set(cid, CC, false, cc as u64);
    let (c, _) = exec(w, host, set, Out::None, 0);
    assert_eq!(c.status(), Status::SUCCESS, "property set CC");
    let cid = host.cid();
    let get = Command::property_get(cid, CSTS, false);
    let (c, _) = exec(w, host, get, Out::None, 0);
    assert_eq!(c.status(), Status::SUCCESS, "property get CSTS");
    assert_eq!(c.dw0() & 1, 1, "CSTS.RDY");
    cntlid
}

/// Identify Controller (CNS 1): returns the 4096-byte page.
pub fn identify_ctrl<W: Wire>(w: &mut W, host: &mut Host) -> Vec<u8> {
    let cid = host.cid();
    let mut cmd = Command::new(0x06, cid);
    cmd.set_cdw10(1);
    let (c, data) = exec(w, host, cmd, Out::None, 4096);
    assert_eq!(c.status(), Status::SUCCESS, "identify");
    assert_eq!(data.len(), 4096);
    data
}

/// NVM Write of `data` at `slba` (512-byte blocks).
pub fn write<W: Wire>(w: &mut W, host: &mut Host, slba: u64, data: &[u8], inline: bool) -> Status {
    let cid = host.cid();
    let mut cmd = Command::new(0x01, cid);
    cmd.set_nsid(1);
    cmd.set_lba_range(slba, (data.len() / 512) as u32);
    let out = if inline {
        Out::InCapsule(data)
    } else {
        Out::R2t(data)
    };
    exec(w, host, cmd, out, 0).0.status()
}

/// NVM Read of `len` bytes at `slba`.
pub fn read<W: Wire>(w: &mut W, host: &mut Host, slba: u64, len: usize) -> (Status, Vec<u8>) {
    let cid = host.cid();
    let mut cmd = Command::new(0x02, cid);
    cmd.set_nsid(1);
    cmd.set_lba_range(slba, (len / 512) as u32);
    let (c, d) = exec(w, host, cmd, Out::None, len as u32);
    (c.status(), d)
}

/// Deterministic test pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Get Log Page `lid`, `len` bytes from offset 0.
pub fn get_log_page<W: Wire>(w: &mut W, host: &mut Host, lid: u8, len: u32) -> (Status, Vec<u8>) {
    let cid = host.cid();
    let mut cmd = Command::new(0x02, cid);
    cmd.set_get_log_page(lid, len, 0);
    let (c, d) = exec(w, host, cmd, Out::None, len);
    (c.status(), d)
}
