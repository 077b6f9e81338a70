//! CRC32C (Castagnoli) digests used by NVMe/TCP for header and data digests.
//! Backed by the `crc32c` crate, which uses SSE4.2 / ARMv8 CRC instructions
//! when the CPU has them. On the wire a digest is 4 bytes, little-endian.

/// Size of a header or data digest on the wire.
pub const DIGEST_LEN: usize = 4;

/// CRC32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continue a CRC32C: `crc32c_append(crc32c(a), b) == crc32c(a ++ b)`.
/// Start from 0 for an empty prefix.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        // 32 bytes of zeros (RFC 3720 test vector).
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
    }

    #[test]
    fn append_matches_whole() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for split in [0, 1, 3, 64, 999, 1000] {
            let c = crc32c_append(crc32c(&data[..split]), &data[split..]);
            assert_eq!(c, crc32c(&data));
        }
        assert_eq!(crc32c_append(0, &data), crc32c(&data));
    }
}
