//! filename.rs — the fio `--filename` syntax of the nvmf engine: which
//! subsystem and namespace one fio "file" is, and how to connect to it.
//!
//! ```text
//! trtype=tcp traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2024-01.io.nvmfd\:default ns=1 [hostnqn=NQN] [hdgst=1] [ddgst=1]
//!   [tls_key=/path/to/psk [tls_identity=0|1]]
//! trtype=rdma traddr=10.77.0.1 trsvcid=4420 subnqn=nqn.2024-01.io.nvmfd\:default ns=1 [hostnqn=NQN]
//! ```
//!
//! Words are separated by blanks; each is `key=value` (`key:value` also parses,
//! but fio splits its filename option on ':' so a ':' must be written `\:`,
//! which fio turns back into ':' before the engine sees the name). `traddr`
//! and `subnqn` are required, `trsvcid` defaults to 4420, `ns` to 1,
//! `trtype` is tcp (the default) or rdma (NVMe/RDMA: the same queues over
//! rdma_cm; needs rdma-core and an RDMA device when the job opens its files).
//! NVMe/TCP only: `hdgst`/`ddgst` (0 or 1, default 0) ask
//! for header/data digests, `tls_key` names a file holding a TLS PSK
//! (`NVMeTLSkey-1:xx:...:`, mode 0600) to connect with TLS 1.3 (`tls_identity`:
//! the PSK identity version, default 1). Everything but these is the transport ID
//! syntax of nvmf-host (trid.rs), parsed there.

use nvmf_host::trid::TrType;
use nvmf_host::{TransportId, DISCOVERY_NQN};

/// One parsed fio filename.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub trid: TransportId,
    pub nsid: u32,
    pub hdr_digest: bool,
    pub data_digest: bool,
    /// Key file for TLS 1.3 (None: clear text).
    pub tls_key: Option<String>,
    /// PSK identity version offered with `tls_key`.
    pub tls_identity: u8,
}

/// The syntax, for error messages.
pub const SYNTAX: &str =
    "expected 'trtype=tcp|rdma traddr=ADDR trsvcid=PORT subnqn=NQN ns=N' (write each ':' in the NQN as '\\:')";

fn digest_flag(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "0" | "false" | "no" => Ok(false),
        "1" | "true" | "yes" => Ok(true),
        _ => Err(format!("{key}={value}: expected 0 or 1")),
    }
}

/// Parse a fio filename of the nvmf engine.
pub fn parse(name: &str) -> Result<Target, String> {
    let bad = |m: String| format!("filename '{name}': {m}; {SYNTAX}");
    let mut rest: Vec<&str> = Vec::new();
    let (mut hdr_digest, mut data_digest) = (false, false);
    let (mut tls_key, mut tls_identity) = (None, 1u8);
    let mut has_subnqn = false;
    for word in name.split_whitespace() {
        let (key, value) = match word.find(['=', ':']) {
            Some(i) => (&word[..i], &word[i + 1..]),
            None => return Err(bad(format!("'{word}' is not key=value"))),
        };
        match key.to_ascii_lowercase().as_str() {
            "hdgst" | "hdr_digest" => hdr_digest = digest_flag(key, value).map_err(bad)?,
            "ddgst" | "data_digest" => data_digest = digest_flag(key, value).map_err(bad)?,
            "tls_key" if !value.is_empty() => tls_key = Some(value.to_string()),
            "tls_identity" => {
                tls_identity = match value {
                    "0" => 0,
                    "1" => 1,
                    _ => return Err(bad(format!("tls_identity={value}: expected 0 or 1"))),
                }
            }
            "trtype"
                if !["tcp", "rdma"]
                    .iter()
                    .any(|t| value.eq_ignore_ascii_case(t)) =>
            {
                return Err(bad(format!(
                    "trtype '{value}' is not supported (tcp or rdma)"
                )))
            }
            k => {
                if k == "subnqn" {
                    has_subnqn = true;
                }
                rest.push(word);
            }
        }
    }
    if rest.is_empty() {
        return Err(bad("empty".into()));
    }
    let trid = TransportId::parse(&rest.join(" ")).map_err(|e| bad(e.to_string()))?;
    if !has_subnqn || trid.subnqn == DISCOVERY_NQN {
        return Err(bad(
            "subnqn (the NQN of an NVM subsystem) is required".into()
        ));
    }
    if trid.trtype == TrType::Rdma {
        let tcp_only = [
            (hdr_digest, "hdgst"),
            (data_digest, "ddgst"),
            (tls_key.is_some(), "tls_key"),
        ];
        if let Some((_, k)) = tcp_only.iter().find(|(on, _)| *on) {
            return Err(bad(format!(
                "{k} is an NVMe/TCP option; not with trtype=rdma"
            )));
        }
    }
    let nsid = trid.nsid.unwrap_or(1);
    if nsid == 0 || nsid == u32::MAX {
        return Err(bad(format!("ns={nsid} is not a namespace ID")));
    }
    Ok(Target {
        trid,
        nsid,
        hdr_digest,
        data_digest,
        tls_key,
        tls_identity,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_name_parses() {
        let t = parse(
            "trtype=tcp adrfam=ipv4 traddr=127.0.0.1 trsvcid=4521 subnqn=nqn.2024-01.io.nvmfd:default ns=2 ddgst=1",
        )
        .unwrap();
        assert_eq!(t.trid.traddr, "127.0.0.1");
        assert_eq!(t.trid.trsvcid, "4521");
        assert_eq!(t.trid.subnqn, "nqn.2024-01.io.nvmfd:default");
        assert_eq!(t.nsid, 2);
        assert!(t.data_digest && !t.hdr_digest);
        assert_eq!((t.tls_key.as_deref(), t.tls_identity), (None, 1));
        let t = parse("traddr=10.0.0.1 subnqn=nqn.x tls_key=/etc/k tls_identity=0").unwrap();
        assert_eq!((t.tls_key.as_deref(), t.tls_identity), (Some("/etc/k"), 0));
    }

    #[test]
    fn rdma_names_parse() {
        let t =
            parse("trtype=rdma traddr=10.77.0.1 trsvcid=4421 subnqn=nqn.2024-01.io.nvmfd:r ns=3")
                .unwrap();
        assert_eq!(t.trid.trtype, TrType::Rdma);
        assert_eq!(
            (t.trid.traddr.as_str(), t.trid.trsvcid.as_str(), t.nsid),
            ("10.77.0.1", "4421", 3)
        );
        assert!(!t.hdr_digest && !t.data_digest && t.tls_key.is_none());
        // case-insensitive, IPv6, digests off said explicitly
        let t = parse("trtype=RDMA traddr=fd00::1 subnqn=nqn.x hdgst=0").unwrap();
        assert_eq!(t.trid.trtype, TrType::Rdma);
        assert_eq!(t.trid.adrfam, nvmf_host::trid::AdrFam::Ipv6);
        // tcp stays the default
        assert_eq!(
            parse("traddr=10.0.0.1 subnqn=nqn.x").unwrap().trid.trtype,
            TrType::Tcp
        );
    }

    #[test]
    fn defaults_port_and_namespace() {
        let t = parse("traddr=10.0.0.1 subnqn=nqn.x").unwrap();
        assert_eq!(t.trid.trsvcid, "4420");
        assert_eq!(t.nsid, 1);
    }

    #[test]
    fn bad_names_say_what_is_wrong() {
        for (name, want) in [
            ("", "empty"),
            ("/dev/nvme0n1", "is not key=value"),
            ("traddr=127.0.0.1", "subnqn"),
            ("traddr=127.0.0.1 subnqn=nqn.x trtype=fc", "tcp or rdma"),
            (
                "trtype=rdma traddr=127.0.0.1 subnqn=nqn.x hdgst=1",
                "hdgst is an NVMe/TCP option",
            ),
            (
                "trtype=RDMA traddr=127.0.0.1 subnqn=nqn.x tls_key=/k",
                "tls_key is an NVMe/TCP option",
            ),
            ("traddr=127.0.0.1 subnqn=nqn.x ns=0", "not a namespace ID"),
            ("traddr=127.0.0.1 subnqn=nqn.x ns=abc", "ns"),
            ("traddr=127.0.0.1 subnqn=nqn.x hdgst=2", "expected 0 or 1"),
            ("traddr=127.0.0.1 subnqn=nqn.x color=red", "color"),
            (
                "traddr=127.0.0.1 subnqn=nqn.x tls_identity=2",
                "expected 0 or 1",
            ),
        ] {
            let e = parse(name).unwrap_err();
            assert!(e.contains(want), "{name:?}: {e}");
            assert!(
                e.contains("trtype=tcp|rdma traddr="),
                "{name:?} lacks the syntax: {e}"
            );
        }
    }
}
