//! Stable-toolchain replay of the whole-connection fuzz harness: every
//! committed corpus file (`fuzz/seeds/connection`, `fuzz/cmin/connection`,
//! `fuzz/regressions/connection`)
//! and a fixed number of inputs from a deterministic PRNG go through the
//! same `run_bytes` the libFuzzer target calls. A broken invariant panics
//! the test; the PRNG cases must also reach the core (Connect, R2T, C2H).

use nvmf_fuzz::{run_bytes, Report};
use std::path::Path;

/// splitmix64: a fixed stream of case bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn add(total: &mut Report, r: &Report) {
    total.admin_connects += r.admin_connects;
    total.io_connects += r.io_connects;
    total.completions += r.completions;
    total.r2ts += r.r2ts;
    total.c2h += r.c2h;
    total.terms += r.terms;
    total.digests += r.digests;
    total.verified_blocks += r.verified_blocks;
    total.direct_h2c += r.direct_h2c;
    total.closed += r.closed;
    total.zc_calls += r.zc_calls;
    total.zc_copied += r.zc_copied;
}

fn replay_dir(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut files: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    files.sort();
    for f in &files {
        let bytes = std::fs::read(f).expect("corpus file");
        eprintln!("replaying {}", f.display());
        run_bytes(&bytes);
    }
    files.len()
}

#[test]
fn corpus_replays() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let seeds = replay_dir(&base.join("seeds/connection"));
    let cmin = replay_dir(&base.join("cmin/connection"));
    let regressions = replay_dir(&base.join("regressions/connection"));
    eprintln!(
        "{seeds} seeds, {cmin} minimized-corpus and {regressions} regression inputs replayed"
    );
    assert!(seeds > 0, "no seed corpus found under {}", base.display());
}

#[test]
fn prng_cases_hold_and_reach_the_core() {
    let cases: usize = std::env::var("NVMF_FUZZ_REPLAY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let mut rng = Rng(0x6e76_6d66_667a_7a01);
    let mut total = Report::default();
    let (mut decoded, mut connected) = (0, 0);
    for _ in 0..cases {
        let len = 32 + (rng.next() % 3000) as usize;
        let bytes = rng.bytes(len);
        if let Some(r) = run_bytes(&bytes) {
            decoded += 1;
            if r.admin_connects > 0 {
                connected += 1;
            }
            add(&mut total, &r);
        }
    }
    eprintln!("{cases} cases, {decoded} decoded, {connected} with an admin Connect: {total:?}");
    // Structure-aware input must get most cases past ICReq and Connect,
    // and the usual data flows must show up.
    assert!(
        decoded * 10 >= cases * 9,
        "only {decoded} of {cases} decoded"
    );
    assert!(
        connected * 2 >= decoded,
        "only {connected} of {decoded} connected"
    );
    assert!(total.io_connects > 0 && total.r2ts > 0 && total.c2h > 0 && total.completions > 0);
    assert!(
        total.verified_blocks > 0,
        "no read was checked against the data model"
    );
    assert!(
        total.zc_calls > 0 && total.zc_copied > 0,
        "no zero-copy send calls (or none reported copied)"
    );
}

/// Each hand-made seed still decodes into the session it was written for
/// (the encoder in `seeds.rs` mirrors the input types) and the committed
/// copies are current.
#[test]
fn hand_made_seeds_reach_their_scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/connection");
    for (name, bytes) in nvmf_fuzz::seeds::all() {
        let committed = std::fs::read(dir.join(name)).unwrap_or_default();
        assert!(
            committed == bytes,
            "{name} differs from fuzz/seeds/connection/{name}: \
             cargo run -p nvmf-fuzz --example write_seeds"
        );
        let r = run_bytes(&bytes).expect("seed decodes");
        eprintln!("{name}: {r:?}");
        let ok = match name {
            "hand-admin" => r.admin_connects == 1 && r.completions >= 7 && r.c2h >= 3,
            "hand-io-incapsule" => {
                r.io_connects == 1 && r.c2h >= 1 && r.completions >= 6 && r.verified_blocks == 4
            }
            "hand-r2t" => r.r2ts >= 2 && r.c2h >= 2 && r.terms == 0 && r.verified_blocks == 68,
            // The read's data goes zero-copy (slot 1) and may reach the
            // host only after the last write to its first 4 blocks was
            // sent: the model then skips those blocks.
            "hand-digests" => {
                r.digests == 2
                    && r.r2ts >= 1
                    && r.c2h >= 1
                    && r.terms == 0
                    && matches!(r.verified_blocks, 124 | 128)
                    && r.zc_calls >= 1
            }
            "hand-partial-direct" => r.direct_h2c >= 1 && r.terms == 0 && r.verified_blocks == 256,
            "hand-aer-kato" => r.closed >= 1 && r.terms == 0 && r.admin_connects == 2,
            "hand-stalled-reader" => r.io_connects == 2 && r.closed >= 1,
            "hand-discovery" => r.admin_connects == 1 && r.c2h >= 2 && r.terms == 0,
            "hand-termreq" => r.r2ts >= 1 && r.closed >= 1 && r.terms == 0,
            // register, acquire, write, report (C2HData), release, read back
            "hand-reservation" => {
                r.io_connects == 1
                    && r.completions >= 6
                    && r.c2h >= 2
                    && r.terms == 0
                    && r.verified_blocks == 1
            }
            // write, fused pair (miscompare), lone second, read back
            "hand-caw" => {
                r.io_connects == 1
                    && r.completions >= 6
                    && r.terms == 0
                    && r.fused_failures >= 3
                    && r.verified_blocks == 1
            }
            // ANA log page (C2HData) + Identify (C2HData) + a read of the
            // non-optimized group that completes
            "hand-ana" => r.c2h >= 3 && r.completions >= 3 && r.terms == 0,
            other => panic!("no expectation for seed {other}"),
        };
        assert!(ok, "seed {name} no longer reaches its scenario: {r:?}");
    }
}
