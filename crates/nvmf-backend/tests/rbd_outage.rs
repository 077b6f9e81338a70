//! The RBD backend while the cluster's only OSD is down: I/O stalls
//! rather than fails while the OSD restarts within the bounded
//! `rados_osd_op_timeout` (nvmfd's default, 20 s), and ends with a
//! retryable status (Namespace Not Ready, no DNR) once the timeout passes
//! (a bdev whose `config_param` sets it to 3 s); after the restart I/O
//! works again and the stalled write is there; the bdev deleted (dropped)
//! while its write is stalled does not wait, and closes once the write
//! completed. Its own test binary, so its own cluster (see
//! `support/mod.rs`): it stops the OSD, and no other test may use that
//! cluster meanwhile.

mod support;

use std::time::{Duration, Instant};

use nvmf_backend::rbd::RbdBackend;
use nvmf_backend::{Backend, BlockOp, CompletionSink, Submitted};
use nvmf_wire::status::Status;
use support::*;

/// Starts osd.0 again when dropped (also when the test fails midway).
struct OsdBack<'a>(&'a Cluster, bool);

impl Drop for OsdBack<'_> {
    fn drop(&mut self) {
        if !self.1 {
            let _ = self.0.start_osd(0);
        }
    }
}

#[test]
fn osd_down_stalls_then_times_out_retryably_and_recovers() {
    if skip() {
        return;
    }
    let c = cluster();
    let img = image(c, 8);
    let (mon, keyring) = (
        c.mon_addr().to_string(),
        c.keyring_path().to_string_lossy().into_owned(),
    );
    let own = |name: &str, extra: &[(&str, &str)]| {
        let mut p = vec![("mon_host", mon.as_str()), ("keyring", keyring.as_str())];
        p.extend_from_slice(extra);
        RbdBackend::open(&cfg(name, &img, None, &p)).expect("open")
    };
    let patient = own("patient", &[]);
    let short = own("short", &[("rados_osd_op_timeout", "3")]);
    let data = pattern(5, 4096);
    let op = BlockOp::Write {
        lba: 1,
        buf: &data,
        fua: false,
    };
    assert_eq!(run(&patient, op), Status::SUCCESS, "cluster healthy first");

    c.stop_osd(0).expect("stop osd.0");
    let mut back = OsdBack(c, false);
    let t0 = Instant::now();
    // The default timeout: this write waits for the OSD.
    let stalled = pattern(6, 4096);
    let psink = CompletionSink::new();
    let op = BlockOp::Write {
        lba: 2,
        buf: &stalled,
        fua: false,
    };
    assert_eq!(patient.submit(op, tag(1), &psink), Submitted::Pending);
    // The 3 s timeout: this one fails, retryably.
    let st = run(
        &short,
        BlockOp::Write {
            lba: 3,
            buf: &data,
            fua: false,
        },
    );
    let failed_after = t0.elapsed();
    eprintln!("osd down: short-timeout write ended after {failed_after:?} with {st:?}");
    assert_eq!(st, Status::NAMESPACE_NOT_READY, "retryable, no DNR");
    assert!(failed_after >= Duration::from_secs(2), "{failed_after:?}");
    assert!(
        psink.is_empty(),
        "the patient write did not wait for the OSD"
    );
    // Delete the bdev with that write stalled: the drop does not wait.
    let closed = patient.closed_flag();
    let t = Instant::now();
    drop(patient);
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "drop waited {:?}",
        t.elapsed()
    );
    assert!(!closed.load(std::sync::atomic::Ordering::Acquire));

    c.start_osd(0).expect("start osd.0");
    back.1 = true;
    let (got, _) = collect(&psink, 1);
    eprintln!(
        "osd back: the stalled write completed {:?} after submission",
        t0.elapsed()
    );
    assert_eq!(got[0].1, Status::SUCCESS, "a stall, not an error");
    assert!(t0.elapsed() < Duration::from_secs(20));
    let start = Instant::now();
    while !closed.load(std::sync::atomic::Ordering::Acquire) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "image never closed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(std::sync::Arc::strong_count(&psink), 1);
    let mut buf = vec![0u8; 4096];
    let op = BlockOp::Read {
        lba: 2,
        buf: &mut buf,
    };
    assert_eq!(run(&short, op), Status::SUCCESS, "I/O works again");
    assert!(buf == stalled, "the stalled write is there");
}
