//! NVMe reservations with the Linux host: nvme-cli's resv-register/-acquire/-release/-report
//! in a QEMU guest (host A, tests/interop/resv.sh) against a second host, this test's
//! nvmf-host initiator (host B, another host identifier), through every action and all six
//! types; Write Exclusive held by B refuses A's writes; A's Preempt and Abort unregisters B,
//! whose I/O then conflicts and who gets the notification (AEN + log page 80h); a
//! reservation taken with PTPL survives an nvmfd restart. On 6.1 and 6.12 (`..._612`).
//! Opt-in with NVMFD_INTEROP=1; see crates/nvmf-interop/src/lib.rs and testbed/README.md.

use std::path::Path;
use std::time::Duration;

use nvmf_host::controller::{ConnectOptions, Controller};
use nvmf_host::queue::IoQueue;
use nvmf_host::trid::TransportId;
use nvmf_interop::*;
use nvmf_wire::command::Command;
use nvmf_wire::opcode::IoOpcode;
use nvmf_wire::status::Status;
use serde_json::json;

const GUEST_TIMEOUT: Duration = Duration::from_secs(300);
const NQN: &str = "nqn.2016-06.io.spdk:resv";
const KEY_B: u64 = 177;
const KEY_A: u64 = 161;

#[test]
fn reservations_kernel_host() {
    scenario(Kernel::from_env(), "reservations_kernel_host", "resv");
}

#[test]
fn reservations_kernel_host_612() {
    scenario(
        Kernel::Backports612,
        "reservations_kernel_host_612",
        "resv-612",
    );
}

fn config(port: u16, ptpl: &Path) -> serde_json::Value {
    let mut cfg = spdk_config(
        port,
        &[Malloc {
            name: "Malloc0",
            num_blocks: 32768,
            block_size: 512,
        }],
        &[Subsystem {
            nqn: NQN.into(),
            serial: "RESV0001".into(),
            model: "nvmfd resv".into(),
            allow_any_host: true,
            hosts: vec![],
            namespaces: vec![(1, "Malloc0")],
        }],
    );
    for sub in cfg["subsystems"].as_array_mut().unwrap() {
        for e in sub["config"].as_array_mut().unwrap() {
            if e["method"] == "nvmf_subsystem_add_ns" {
                e["params"]["namespace"]["ptpl_file"] = json!(ptpl.display().to_string());
            }
        }
    }
    cfg
}

/// Host B: its controller and one I/O queue.
struct HostB {
    ctrl: Controller,
    q: IoQueue,
}

fn host_b(port: u16) -> Result<HostB, String> {
    let trid = TransportId::tcp("127.0.0.1", &port.to_string(), NQN);
    let ctrl =
        Controller::connect(&ConnectOptions::new(trid).with_hostnqn(&host_nqn(OTHER_HOST_ID)))
            .map_err(|e| format!("host B connect: {e}"))?;
    let q = ctrl
        .create_io_queue(1, 16, 4096)
        .map_err(|e| format!("host B I/O queue: {e}"))?;
    Ok(HostB { ctrl, q })
}

/// One command on host B's I/O queue: `out` sent, `len` bytes of transfer; the status
/// and the buffer after it.
fn cmd(b: &mut HostB, c: Command, out: &[u8], len: u32) -> Result<(Status, Vec<u8>), String> {
    let slot = b.q.alloc().ok_or("no free slot")?;
    b.q.buf_mut(slot)[..out.len()].copy_from_slice(out);
    let r = b.q.execute(slot, c, len, Duration::from_secs(10));
    let buf = b.q.buf(slot)[..len as usize].to_vec();
    b.q.release(slot);
    r.map(|c| (c.status, buf)).map_err(|e| e.to_string())
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    let mut v = a.to_le_bytes().to_vec();
    v.extend_from_slice(&b.to_le_bytes());
    v
}

fn expect(what: &str, got: Status, want: Status) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: status {got:?}, expected {want:?}"))
    }
}

fn rw(b: &mut HostB, write: bool) -> Result<Status, String> {
    let op = if write {
        IoOpcode::Write
    } else {
        IoOpcode::Read
    };
    let mut c = Command::new(op as u8, 0);
    c.set_nsid(1).set_lba_range(64, 1);
    cmd(b, c, &[0x42; 512], 512).map(|(s, _)| s)
}

fn report(b: &mut HostB) -> Result<Vec<u8>, String> {
    let mut c = Command::new(IoOpcode::ReservationReport as u8, 0);
    c.set_nsid(1).set_cdw10(1024 / 4 - 1).set_cdw11(1);
    let (st, buf) = cmd(b, c, &[], 1024)?;
    expect("host B Reservation Report", st, Status::SUCCESS)?;
    Ok(buf)
}

const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr();

/// Host B registers and takes Write Exclusive; arms an AER.
fn b_holds_we(b: &mut HostB) -> Result<(), String> {
    let mut c = Command::new(IoOpcode::ReservationRegister as u8, 0);
    c.set_nsid(1);
    let (st, _) = cmd(b, c, &keys(0, KEY_B), 16)?;
    expect("host B register", st, Status::SUCCESS)?;
    let mut c = Command::new(IoOpcode::ReservationAcquire as u8, 0);
    c.set_nsid(1).set_cdw10(1 << 8);
    let (st, _) = cmd(b, c, &keys(KEY_B, 0), 16)?;
    expect("host B acquire Write Exclusive", st, Status::SUCCESS)?;
    expect("host B write as holder", rw(b, true)?, Status::SUCCESS)?;
    b.ctrl.arm_async_event().map_err(|e| e.to_string())
}

/// After host A's Preempt and Abort: B's reads and writes conflict (Exclusive Access, B
/// no longer registered), and B was told (AEN, then log page 80h: registration preempted).
fn b_preempted(b: &mut HostB) -> Result<(), String> {
    expect("host B write after preempt", rw(b, true)?, CONFLICT)?;
    expect("host B read after preempt", rw(b, false)?, CONFLICT)?;
    let mut aen = None;
    for _ in 0..50 {
        aen = b.ctrl.poll_async_event().map_err(|e| e.to_string())?;
        if aen.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let aen = aen.ok_or("host B got no asynchronous event for its preempted registration")?;
    if aen.dw0 != 6 | (0x80 << 16) {
        return Err(format!(
            "host B's event {:#x} is not 'reservation log page available'",
            aen.dw0
        ));
    }
    let mut log = [0u8; 64];
    b.ctrl
        .get_log_page(0x80, 0xFFFF_FFFF, 0, &mut log)
        .map_err(|e| e.to_string())?;
    if log[8] != 1 || u32::from_le_bytes(log[12..16].try_into().unwrap()) != 1 {
        return Err(format!(
            "log page 80h is not 'registration preempted' for namespace 1: {:?}",
            &log[..16]
        ));
    }
    let page = report(b)?;
    if (page[4], page[5]) != (2, 1) {
        return Err(format!(
            "report after preempt: rtype {} regctl {}, expected 2 and 1",
            page[4], page[5]
        ));
    }
    Ok(())
}

/// After the restart: A's Write Exclusive is back; B (not registered) reads but cannot write.
fn b_after_restart(port: u16) -> Result<(), String> {
    let mut b = host_b(port)?;
    expect(
        "host B read after restart",
        rw(&mut b, false)?,
        Status::SUCCESS,
    )?;
    expect("host B write after restart", rw(&mut b, true)?, CONFLICT)?;
    let page = report(&mut b)?;
    let hostid = nvmf_host::controller::hostid_from_nqn(&host_nqn(HOST_ID));
    if (page[4], page[5], page[9]) != (1, 1, 1) || page[66] != 1 || page[80..96] != hostid {
        return Err(format!(
            "report after restart: rtype {} regctl {} ptpls {} holder {:?}",
            page[4],
            page[5],
            page[9],
            &page[80..96]
        ));
    }
    Ok(())
}

fn scenario(kernel: Kernel, test: &str, work: &str) {
    let Some(_serial) = begin(test) else {
        return;
    };
    let dir = work_dir(work);
    let port = free_port();
    let ptpl = dir.join("ns1.ptpl.json");
    let _ = std::fs::remove_file(&ptpl);
    let cfg = config(port, &ptpl);
    let mut nvmfd = Some(Nvmfd::start(&dir, &cfg, port));
    let mut b: Option<HostB> = None;
    let mut env = vec![
        ("PORT", port.to_string()),
        ("NQN", NQN.to_string()),
        ("HOSTNQN", host_nqn(HOST_ID)),
        ("HOSTID", HOST_ID.to_string()),
    ];
    env.push(("KEY_A", KEY_A.to_string()));
    let run = run_guest_on(
        kernel,
        &dir,
        "resv.sh",
        &[port],
        &env,
        GUEST_TIMEOUT,
        |name, _| {
            let r = match name {
                "b-holds-we" => host_b(port).and_then(|mut h| {
                    let r = b_holds_we(&mut h);
                    b = Some(h);
                    r
                }),
                "b-preempted" => match b.as_mut() {
                    Some(h) => b_preempted(h),
                    None => Err("host B is not connected".into()),
                },
                "restart" => {
                    // Host B leaves; nvmfd stops (SIGTERM) and starts again on the same
                    // configuration; the guest's controller reconnects.
                    b = None;
                    drop(nvmfd.take());
                    let d = Nvmfd::start(&dir, &cfg, port);
                    let r = d.wait_active_controllers(1, Duration::from_secs(30));
                    nvmfd = Some(d);
                    r
                }
                "b-after-restart" => b_after_restart(port),
                other => Err(format!("unknown checkpoint {other}")),
            };
            match r {
                Ok(()) => "ok".into(),
                Err(e) => e,
            }
        },
    );
    drop(b);
    let mut nvmfd = nvmfd.expect("nvmfd");
    let mut host_failures = Vec::new();
    let log = nvmfd.log();
    if !ptpl.exists() {
        host_failures.push(format!("no PTPL file at {}", ptpl.display()));
    }
    if log.contains("panicked") {
        host_failures.push("nvmfd panicked".into());
    }
    finish(test, &run, &mut nvmfd, &host_failures);
}
