//! Zero-copy sends in the connection harness's model (`harness.rs`:
//! `ZcModel`): deterministic sessions whose reads go out in `MSG_ZEROCOPY`
//! calls that the model's kernel reports late and out of order, with the
//! slots' buffers read only then. A `Connection` that released (reused) a
//! slot before its calls were reported fails these: the late bytes differ
//! from those sent, the host's parsing or the read verification breaks.

use nvmf_fuzz::run_bytes;
use nvmf_fuzz::seeds::{op, Enc};

/// Writes then reads back 8 KiB ranges of the RAM namespace on I/O queue
/// slot 1 (`chunk`: its socket chunk size, which picks the zero-copy
/// mode), several reads queued while the host does not read, so that
/// their calls are outstanding together; writes to other blocks follow
/// while the reads' calls may still be unreported (their slots must not be
/// reused).
fn session(chunk: Option<u16>) -> Vec<u8> {
    let mut e = Enc::default();
    e.bool(false); // Input::c2h_success
    e.open(0, false, false, None).open(1, true, false, chunk);
    for i in 0..8u16 {
        e.io(1, op::IO_WRITE, false, i * 16, 15, true, None);
    }
    for round in 0..3u16 {
        e.reading(1, false);
        for i in 0..8u16 {
            e.io(
                1,
                op::IO_READ,
                false,
                ((i + round) % 8) * 16,
                15,
                false,
                None,
            );
        }
        e.reading(1, true);
        // Reads and writes interleaved: the writes' data lands in slots.
        for i in 0..4u16 {
            e.io(1, op::IO_READ, false, i * 16, 15, false, None);
            e.io(1, op::IO_WRITE, false, 256 + i * 16, 15, true, None);
        }
        // Null namespace reads (the shared zero buffer, 16 KiB).
        e.io(1, op::IO_READ, true, round, 3, false, None);
    }
    e.0
}

#[test]
fn reads_sent_zero_copy_verify_with_late_out_of_order_reports() {
    // Slot 1 with whole-buffer writes: zero-copy from 512 bytes.
    let r = run_bytes(&session(None)).expect("decodes");
    eprintln!("{r:?}");
    assert_eq!((r.io_connects, r.terms), (1, 0));
    assert!(r.zc_calls >= 3 * 13, "too few zero-copy calls: {r:?}");
    // 8 + 4 reads of 16 blocks and 4 null blocks per round.
    assert_eq!(r.verified_blocks, 3 * (12 * 16 + 4), "{r:?}");
}

#[test]
fn partial_zero_copy_calls_and_copied_reports() {
    // 3-byte writes: every slot goes out in many zero-copy calls (the
    // model reports about one in eight copied).
    let r = run_bytes(&session(Some(3))).expect("decodes");
    eprintln!("{r:?}");
    assert_eq!((r.io_connects, r.terms), (1, 0));
    assert!(r.zc_calls > 10_000 && r.zc_copied > 0, "{r:?}");
    assert_eq!(r.verified_blocks, 3 * (12 * 16 + 4), "{r:?}");
}

#[test]
fn zero_copy_turned_off_by_copied_reports_mid_slot() {
    // 1-byte writes, every report copied: the connection stops asking for
    // zero-copy after 64 copied calls in a row, in the middle of a slot
    // (the rest of it goes out copying, after the call that carried its
    // start).
    let r = run_bytes(&session(Some(1))).expect("decodes");
    eprintln!("{r:?}");
    assert_eq!((r.io_connects, r.terms), (1, 0));
    assert!(r.zc_calls >= 64 && r.zc_copied == r.zc_calls, "{r:?}");
    assert_eq!(r.verified_blocks, 3 * (12 * 16 + 4), "{r:?}");
}

/// Zero-copy turns off in the middle of a slot (64 copied reports): the
/// copying call that finishes it must release it (its zero-copy call was
/// already reported); the harness's checks panic if it stays parked.
#[test]
fn no_slot_stays_parked_after_zero_copy_turns_off() {
    let r = run_bytes(&session(Some(1))).expect("decodes");
    assert!(r.zc_calls >= 64, "{r:?}");
}

#[test]
fn zero_copy_always_keeps_going_when_copied() {
    // 2-byte writes: from 4 KiB, `always`, every report copied.
    let r = run_bytes(&session(Some(2))).expect("decodes");
    eprintln!("{r:?}");
    assert_eq!((r.io_connects, r.terms), (1, 0));
    assert!(r.zc_calls > 64 && r.zc_copied == r.zc_calls, "{r:?}");
    assert_eq!(r.verified_blocks, 3 * (12 * 16 + 4), "{r:?}");
}
