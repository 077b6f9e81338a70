//! Stable-toolchain replay of the NVMe/RDMA queue fuzzer: every committed
//! corpus file (`fuzz/seeds/rdma`, `fuzz/cmin/rdma`, `fuzz/regressions/rdma`)
//! and a fixed number of PRNG inputs go through the same `run_rdma_bytes`
//! the libFuzzer target calls (a broken invariant panics the test); each
//! hand-made seed must still reach its scenario.

use nvmf_fuzz::rdma::{run_rdma_bytes, RdmaReport};
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
        run_rdma_bytes(&bytes);
    }
    files.len()
}

#[test]
fn rdma_corpus_replays() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let seeds = replay_dir(&base.join("seeds/rdma"));
    let cmin = replay_dir(&base.join("cmin/rdma"));
    let regressions = replay_dir(&base.join("regressions/rdma"));
    eprintln!(
        "{seeds} seeds, {cmin} minimized-corpus and {regressions} regression inputs replayed"
    );
    assert!(seeds > 0, "no seed corpus found under {}", base.display());
}

#[test]
fn rdma_prng_cases_hold_and_reach_the_queue() {
    let cases: usize = std::env::var("NVMF_FUZZ_REPLAY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut rng = Rng(0x6e76_6d66_7264_6d61);
    let mut t = RdmaReport::default();
    let mut decoded = 0;
    for _ in 0..cases {
        let len = 16 + (rng.next() % 2000) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if let Some(p) = std::env::var_os("NVMF_FUZZ_DUMP") {
            // The case about to run (the last one written is the failing one).
            std::fs::write(p, &bytes).expect("dump");
        }
        if let Some(r) = run_rdma_bytes(&bytes) {
            decoded += 1;
            t.accepted += r.accepted;
            t.rejected += r.rejected;
            t.admin_connects += r.admin_connects;
            t.io_connects += r.io_connects;
            t.refused_connects += r.refused_connects;
            t.completions += r.completions;
            t.reads += r.reads;
            t.writes += r.writes;
            t.shared_capsules += r.shared_capsules;
            t.probes += r.probes;
            t.closed += r.closed;
            t.max_in_flight = t.max_in_flight.max(r.max_in_flight);
            t.verified_blocks += r.verified_blocks;
        }
    }
    eprintln!("{cases} cases, {decoded} decoded: {t:?}");
    assert!(
        decoded * 10 >= cases * 9,
        "only {decoded} of {cases} decoded"
    );
    assert!(t.admin_connects > 0 && t.io_connects > 0 && t.rejected > 0);
    assert!(t.reads > 0 && t.writes > 0 && t.completions > 0 && t.shared_capsules > 0);
    assert!(
        t.verified_blocks > 0,
        "no read was checked against the data model"
    );
}

/// Each hand-made RDMA seed still decodes into the session it was written
/// for and the committed copies are current.
#[test]
fn hand_made_rdma_seeds_reach_their_scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/rdma");
    for (name, bytes) in nvmf_fuzz::seeds::rdma::all() {
        let committed = std::fs::read(dir.join(name)).unwrap_or_default();
        assert!(
            committed == bytes,
            "{name} differs from fuzz/seeds/rdma/{name}: \
             cargo run -p nvmf-fuzz --example write_seeds"
        );
        let r = run_rdma_bytes(&bytes).expect("seed decodes");
        eprintln!("{name}: {r:?}");
        let ok = match name {
            "hand-rdma-io" => {
                r.admin_connects == 1
                    && r.io_connects == 1
                    && r.reads >= 2
                    && r.writes >= 3
                    && r.closed == 0
                    && r.verified_blocks == 50
            }
            "hand-rdma-srq" => {
                r.shared_capsules >= 20 && r.completions >= 18 && r.verified_blocks == 48
            }
            "hand-rdma-caw" => r.completions >= 6 && r.closed == 0 && r.verified_blocks == 1,
            // The mismatched Connect is refused; the queue that then gets
            // commands before any Connect closes.
            "hand-rdma-mismatch" => r.refused_connects == 1 && r.closed >= 1,
            "hand-rdma-any-order" => {
                r.max_in_flight >= 8 && r.verified_blocks >= 8 && r.closed >= 1
            }
            "hand-rdma-probe" => r.probes == 2 && r.closed >= 1,
            other => panic!("no expectation for seed {other}"),
        };
        assert!(ok, "seed {name} no longer reaches its scenario: {r:?}");
    }
}
