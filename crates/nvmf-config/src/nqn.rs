//! Owns NVMe Qualified Name (NQN) validation, per the NVMe base spec
//! ("NVMe Qualified Names"): `nqn.yyyy-mm.<reverse domain>:<anything>`, the
//! UUID form `nqn.2014-08.org.nvmexpress:uuid:<uuid>`, at most 223 bytes.

use crate::ids::parse_uuid;

/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Longest NQN in bytes (the NQN fields are 256 bytes, NUL-terminated, but the spec caps names at 223).
pub const NQN_MAX_LEN: usize = 223;

const UUID_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// Checks that `nqn` is a valid NQN; the error says what is wrong.
pub fn validate_nqn(nqn: &str) -> Result<(), String> {
    if nqn.len() > NQN_MAX_LEN {
        return Err(format!(
            "NQN is {} bytes long, the limit is {NQN_MAX_LEN}",
            nqn.len()
        ));
    }
    if nqn == DISCOVERY_NQN {
        return Ok(());
    }
    if let Some(rest) = nqn.strip_prefix(UUID_PREFIX) {
        return parse_uuid(rest)
            .map(|_| ())
            .map_err(|e| format!("NQN \"{nqn}\" has the UUID form but {e}"));
    }
    let bad = |why: &str| Err(format!("invalid NQN \"{nqn}\": {why}"));
    let Some(rest) = nqn.strip_prefix("nqn.") else {
        return bad("must start with \"nqn.\"");
    };
    let date = rest.as_bytes();
    let date_ok = date.len() >= 8
        && date[..4].iter().all(u8::is_ascii_digit)
        && date[4] == b'-'
        && date[5..7].iter().all(u8::is_ascii_digit)
        && date[7] == b'.';
    if !date_ok {
        return bad("expected a date \"yyyy-mm.\" after \"nqn.\"");
    }
    let month = (date[5] - b'0') * 10 + (date[6] - b'0');
    if !(1..=12).contains(&month) {
        return bad("month must be 01..12");
    }
    let rest = &rest[8..];
    let Some((domain, user)) = rest.split_once(':') else {
        return bad("expected \":\" after the reverse domain name");
    };
    if domain.is_empty() {
        return bad("reverse domain name is empty");
    }
    for label in domain.split('.') {
        let b = label.as_bytes();
        let ok = !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-');
        if !ok {
            return bad(&format!("bad domain label \"{label}\""));
        }
    }
    if user.is_empty() {
        return bad("nothing after \":\"");
    }
    if user.chars().any(char::is_control) {
        return bad("contains a control character");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid() {
        for n in [
            DISCOVERY_NQN,
            "nqn.2016-06.io.spdk:cnode1",
            "nqn.2024-01.io.nvmfd:default",
            "nqn.2014-08.org.nvmexpress:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8",
            "nqn.2014-08.com.example:nvme:nvm-subsystem-sn-d78432",
        ] {
            validate_nqn(n).unwrap_or_else(|e| panic!("{n}: {e}"));
        }
    }

    #[test]
    fn invalid() {
        let long = format!("nqn.2016-06.io.spdk:{}", "x".repeat(210));
        for n in [
            "",
            "iqn.2016-06.io.spdk:cnode1",
            "nqn.16-06.io.spdk:cnode1",
            "nqn.2016-13.io.spdk:cnode1",
            "nqn.2016-06.io.spdk",
            "nqn.2016-06.io.spdk:",
            "nqn.2016-06.:x",
            "nqn.2016-06.io..spdk:x",
            "nqn.2016-06.io.-spdk:x",
            "nqn.2016-06.io.sp_dk:x",
            "nqn.2014-08.org.nvmexpress:uuid:not-a-uuid",
            long.as_str(),
        ] {
            assert!(validate_nqn(n).is_err(), "{n:?} accepted");
        }
    }
}
