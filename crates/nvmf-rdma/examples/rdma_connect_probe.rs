//! rdma_connect_probe: one NVMe/RDMA connect request with the private data given on the
//! command line, and what the target answered: for testing a target's checks of the RDMA_CM
//! connect private data from a real RDMA link (`tests/interop/nvmfd-rdma.sh`), and for seeing
//! what a target accepts.
//!
//!   rdma_connect_probe ADDR:PORT [--recfmt N] [--qid N] [--hrqsize N] [--hsqsize N]
//!                      [--cntlid N] [--expect-reject STS | --expect-accept] [--vanish]
//!                      [--timeout S]
//!   rdma_connect_probe ADDR:PORT --count N [--expect-accepted K] [--timeout S]
//!
//! `--count N`: N connect requests one after the other, every accepted one held open until
//! all were answered (a host over a connection cap): prints `accepted A, refused R` (refused:
//! rejected without NVMe/RDMA private data, the target's admission) and, with
//! `--expect-accepted K`, exits 0 only if exactly K were accepted and the rest refused.
//!
//! Prints `rejected: status STS (why)` with the NVMe/RDMA status from the reject's private
//! data, or `accepted: crqsize N`. With `--expect-*` the exit status says whether the answer
//! was the expected one (0) or not (1). `--vanish`: once accepted, exit at once without a
//! disconnect, as a host that crashed (the kernel tears the queue pair down). Defaults: an
//! admin queue of 32 entries (recfmt 0, qid 0, hrqsize 32, hsqsize 31, cntlid 0).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nvmf_rdma::client::{resolve, wait_event};
use nvmf_rdma::{
    available, CmEventKind, CompletionQueue, ConnParam, EventChannel, ProtectionDomain, QpCaps,
};
use nvmf_wire::rdma::{RdmaCmAccept, RdmaCmReject, RdmaCmRequest, RdmaCmStatus};
use nvmf_wire::zerocopy::{FromBytes, FromZeros, IntoBytes};

#[derive(PartialEq)]
enum Expect {
    Nothing,
    Reject(u16),
    Accept,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut req = RdmaCmRequest::new_zeroed();
    req.hrqsize.set(32);
    req.hsqsize.set(31);
    let mut addr: Option<SocketAddr> = None;
    let mut expect = Expect::Nothing;
    let mut vanish = false;
    let mut count: Option<u16> = None;
    let mut expect_accepted: Option<u16> = None;
    let mut timeout = Duration::from_secs(20);
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let num = |v: Option<&String>| v.and_then(|s| s.parse::<u16>().ok());
        let n = num(args.get(i + 1));
        match (a, n) {
            ("--recfmt", Some(v)) => req.recfmt.set(v),
            ("--qid", Some(v)) => req.qid.set(v),
            ("--hrqsize", Some(v)) => req.hrqsize.set(v),
            ("--hsqsize", Some(v)) => req.hsqsize.set(v),
            ("--cntlid", Some(v)) => req.cntlid.set(v),
            ("--expect-reject", Some(v)) => expect = Expect::Reject(v),
            ("--count", Some(v)) if v > 0 => count = Some(v),
            ("--expect-accepted", Some(v)) => expect_accepted = Some(v),
            ("--timeout", Some(v)) if v > 0 => timeout = Duration::from_secs(u64::from(v)),
            ("--expect-accept", _) => {
                expect = Expect::Accept;
                i += 1;
                continue;
            }
            ("--vanish", _) => {
                vanish = true;
                i += 1;
                continue;
            }
            (s, _) if !s.starts_with("--") && addr.is_none() => match s.parse() {
                Ok(x) => {
                    addr = Some(x);
                    i += 1;
                    continue;
                }
                Err(e) => return usage(&format!("bad address {s}: {e}")),
            },
            (s, _) => return usage(&format!("unexpected or incomplete argument {s}")),
        }
        i += 2;
    }
    let Some(addr) = addr else {
        return usage("the target's ADDR:PORT is required");
    };
    if let Err(e) = available() {
        eprintln!("rdma_connect_probe: {e}");
        return ExitCode::from(2);
    }
    if let Some(n) = count {
        return match probe_many(addr, &req, n, Instant::now() + timeout) {
            Err(e) => {
                eprintln!("rdma_connect_probe: {e}");
                ExitCode::from(2)
            }
            Ok((accepted, refused)) => {
                println!("accepted {accepted}, refused {refused}");
                match expect_accepted {
                    Some(k) if k != accepted || accepted + refused != n => {
                        eprintln!(
                            "rdma_connect_probe: expected {k} accepted and {} refused",
                            n - k
                        );
                        ExitCode::FAILURE
                    }
                    _ => ExitCode::SUCCESS,
                }
            }
        };
    }
    match probe(addr, &req, vanish, Instant::now() + timeout) {
        Err(e) => {
            eprintln!("rdma_connect_probe: {e}");
            ExitCode::from(2)
        }
        Ok(answer) => {
            let ok = match (&expect, &answer) {
                (Expect::Nothing, _) => true,
                (Expect::Accept, Answer::Accepted) => true,
                (Expect::Reject(want), Answer::Rejected(got)) => want == got,
                _ => false,
            };
            if ok {
                ExitCode::SUCCESS
            } else {
                eprintln!("rdma_connect_probe: not the expected answer");
                ExitCode::FAILURE
            }
        }
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!(
        "rdma_connect_probe: {why}\nusage: rdma_connect_probe ADDR:PORT [--recfmt N] [--qid N] \
         [--hrqsize N] [--hsqsize N] [--cntlid N] [--expect-reject STS | --expect-accept] \
         [--vanish] [--timeout S]\n       rdma_connect_probe ADDR:PORT --count N \
         [--expect-accepted K] [--timeout S]"
    );
    ExitCode::from(2)
}

enum Answer {
    Rejected(u16),
    Accepted,
}

/// What must stay alive while a connection is held; the tuple drops in
/// field order: the id (with its queue pair) first, the event channel last.
type Held = (
    nvmf_rdma::CmId,
    std::sync::Arc<CompletionQueue>,
    std::sync::Arc<ProtectionDomain>,
    EventChannel,
);

/// One connect request with `req` as private data, sent.
fn connect_once(addr: SocketAddr, req: &RdmaCmRequest, deadline: Instant) -> Result<Held, String> {
    let ch = EventChannel::new().map_err(|e| e.to_string())?;
    let mut id = ch.create_id(1).map_err(|e| e.to_string())?;
    let dev = resolve(&ch, &id, addr, deadline)?;
    let pd = ProtectionDomain::new(dev).map_err(|e| e.to_string())?;
    let cq = CompletionQueue::new(dev, 16).map_err(|e| e.to_string())?;
    id.create_qp(
        &pd,
        &cq,
        &cq,
        QpCaps {
            send_depth: 4,
            recv_depth: 4,
            send_sge: 1,
            recv_sge: 1,
            max_inline: 0,
        },
    )
    .map_err(|e| e.to_string())?;
    id.connect(&ConnParam {
        private_data: req.as_bytes(),
        responder_resources: 4,
        initiator_depth: 4,
        ..ConnParam::default()
    })
    .map_err(|e| e.to_string())?;
    Ok((id, cq, pd, ch))
}

/// `n` connect requests, each accepted one held until all were answered:
/// (accepted, refused without NVMe/RDMA data). A reject with NVMe/RDMA
/// data is an error (the request itself was wrong).
fn probe_many(
    addr: SocketAddr,
    req: &RdmaCmRequest,
    n: u16,
    deadline: Instant,
) -> Result<(u16, u16), String> {
    let mut held = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..n {
        let held_one = connect_once(addr, req, deadline)?;
        let ev = wait_event(&held_one.3, deadline, "the target's answer")?;
        match ev.kind {
            CmEventKind::Established => {
                accepted += 1;
                held.push(held_one);
            }
            CmEventKind::Rejected if ev.private_data.get(..4).is_none_or(|b| b == [0; 4]) => {
                refused += 1;
            }
            other => {
                return Err(format!(
                    "connection {i}: unexpected answer {other:?} (status {}, private data {:?})",
                    ev.status,
                    ev.private_data.get(..4)
                ))
            }
        }
    }
    for (id, ..) in &held {
        let _ = id.disconnect();
    }
    Ok((accepted, refused))
}

fn probe(
    addr: SocketAddr,
    req: &RdmaCmRequest,
    vanish: bool,
    deadline: Instant,
) -> Result<Answer, String> {
    // One binding: the tuple drops in its field order (the id first).
    let held = connect_once(addr, req, deadline)?;
    let (id, ch) = (&held.0, &held.3);
    let ev = wait_event(ch, deadline, "the target's answer")?;
    match ev.kind {
        CmEventKind::Rejected => {
            let Some(rej) = ev
                .private_data
                .get(..4)
                .and_then(|b| RdmaCmReject::read_from_bytes(b).ok())
            else {
                return Err(format!(
                    "rejected without NVMe/RDMA reject data (status {})",
                    ev.status
                ));
            };
            let sts = rej.sts.get();
            let why = RdmaCmStatus::from_code(sts).map_or("unknown status", |s| s.describe());
            println!("rejected: status {sts} ({why})");
            Ok(Answer::Rejected(sts))
        }
        CmEventKind::Established => {
            let crq = ev
                .private_data
                .get(..32)
                .and_then(|b| RdmaCmAccept::read_from_bytes(b).ok())
                .map_or(0, |a| a.crqsize.get());
            println!("accepted: crqsize {crq}");
            if vanish {
                println!("vanishing without a disconnect");
                std::process::exit(0);
            }
            let _ = id.disconnect();
            Ok(Answer::Accepted)
        }
        other => Err(format!(
            "unexpected answer {other:?} (status {})",
            ev.status
        )),
    }
}
