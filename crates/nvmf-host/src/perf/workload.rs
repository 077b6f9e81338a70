//! perf/workload.rs — what `nvmf perf` sends and how it checks it: the
//! access patterns (`Workload`), the xorshift PRNG that picks LBAs, and the
//! verify pattern (every block carries its LBA and a generation tag, plus a
//! stream derived from both) with its checker (`Mismatch`).

/// Access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Read,
    Write,
    RandRead,
    RandWrite,
    /// Sequential mix of reads and writes (`read_pct` reads).
    Rw,
    /// Random mix of reads and writes (`read_pct` reads).
    RandRw,
}

impl Workload {
    pub fn parse(s: &str) -> Option<Workload> {
        Some(match s {
            "read" => Workload::Read,
            "write" => Workload::Write,
            "randread" => Workload::RandRead,
            "randwrite" => Workload::RandWrite,
            "rw" | "readwrite" => Workload::Rw,
            "randrw" => Workload::RandRw,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::RandRead => "randread",
            Workload::RandWrite => "randwrite",
            Workload::Rw => "rw",
            Workload::RandRw => "randrw",
        }
    }
    pub fn is_random(self) -> bool {
        matches!(
            self,
            Workload::RandRead | Workload::RandWrite | Workload::RandRw
        )
    }
    /// Percentage of reads given the mix setting.
    pub fn read_pct(self, mix: u32) -> u32 {
        match self {
            Workload::Read | Workload::RandRead => 100,
            Workload::Write | Workload::RandWrite => 0,
            Workload::Rw | Workload::RandRw => mix.min(100),
        }
    }
}

/// One block whose content was not what was last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub lba: u64,
    /// LBA and tag words found in the block (the tag is seed << 32 | generation).
    pub found_lba: u64,
    pub found_tag: u64,
    pub expected_tag: u64,
    /// First differing byte within the block.
    pub offset: usize,
}

/// xorshift64* generator.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed | 1)
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in 0..n (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[inline]
fn pattern_seed(lba: u64, tag: u64) -> u64 {
    (lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ tag.rotate_left(23)) | 1
}

/// Fill one block: word 0 = LBA, word 1 = tag, the rest a stream derived
/// from both.
#[inline]
pub fn fill_block(b: &mut [u8], lba: u64, tag: u64) {
    let mut x = pattern_seed(lba, tag);
    for (k, w) in b.chunks_exact_mut(8).enumerate() {
        let v = match k {
            0 => lba,
            1 => tag,
            _ => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            }
        };
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// Check one block; None if it holds what `fill_block(lba, tag)` wrote.
#[inline]
pub fn check_block(b: &[u8], lba: u64, tag: u64) -> Option<Mismatch> {
    let mut x = pattern_seed(lba, tag);
    for (k, w) in b.chunks_exact(8).enumerate() {
        let v = match k {
            0 => lba,
            1 => tag,
            _ => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            }
        };
        let got = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        if got != v {
            let word = |i: usize| {
                b.get(i * 8..i * 8 + 8)
                    .map_or(0, |s| u64::from_le_bytes(s.try_into().expect("8")))
            };
            let diff = (got ^ v).trailing_zeros() as usize / 8;
            return Some(Mismatch {
                lba,
                found_lba: word(0),
                found_tag: word(1),
                expected_tag: tag,
                offset: k * 8 + diff,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_round_trip_and_mismatch() {
        let mut b = vec![0u8; 512];
        fill_block(&mut b, 77, 0x1234_0000_0005);
        assert!(check_block(&b, 77, 0x1234_0000_0005).is_none());
        let m = check_block(&b, 77, 0x1234_0000_0006).unwrap();
        assert_eq!(m.found_lba, 77);
        assert_eq!(m.found_tag, 0x1234_0000_0005);
        assert_eq!(m.offset, 8);
        let m = check_block(&b, 78, 0x1234_0000_0005).unwrap();
        assert_eq!(m.offset, 0);
        b[300] ^= 0x10;
        assert_eq!(check_block(&b, 77, 0x1234_0000_0005).unwrap().offset, 300);
    }

    #[test]
    fn rng_below_in_range() {
        let mut r = XorShift::new(42);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[r.below(10) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    #[test]
    fn workload_names() {
        for w in ["read", "write", "randread", "randwrite", "rw", "randrw"] {
            assert_eq!(Workload::parse(w).unwrap().name(), w);
        }
        assert_eq!(Workload::RandRw.read_pct(70), 70);
        assert_eq!(Workload::Write.read_pct(70), 0);
    }
}
