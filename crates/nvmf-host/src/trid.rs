//! trid.rs — SPDK-style transport ID strings:
//! `trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:NQN`
//! (trtype TCP or RDMA).
//! Parsing (`TransportId::parse` / `FromStr`) and printing (`Display`).
//! Keys are case-insensitive and may be written `key:value` or `key=value`;
//! only the first separator splits, so NQNs with colons are fine.

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// Well-known NQN of the discovery subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Address family of `traddr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdrFam {
    Ipv4,
    Ipv6,
}

/// The fabric of a transport ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrType {
    #[default]
    Tcp,
    /// NVMe/RDMA (RoCE, iWARP, InfiniBand; needs rdma-core and a device at run time).
    Rdma,
}

/// Where a subsystem is: transport, address, port, NQN (+ optional host NQN
/// and namespace, which SPDK's perf also accepts in the string).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportId {
    pub trtype: TrType,
    pub adrfam: AdrFam,
    pub traddr: String,
    pub trsvcid: String,
    pub subnqn: String,
    pub hostnqn: Option<String>,
    pub nsid: Option<u32>,
}

impl TransportId {
    /// A TCP transport ID.
    pub fn tcp(traddr: &str, trsvcid: &str, subnqn: &str) -> TransportId {
        TransportId {
            trtype: TrType::Tcp,
            adrfam: if traddr.contains(':') {
                AdrFam::Ipv6
            } else {
                AdrFam::Ipv4
            },
            traddr: traddr.to_string(),
            trsvcid: trsvcid.to_string(),
            subnqn: subnqn.to_string(),
            hostnqn: None,
            nsid: None,
        }
    }

    /// Parse an SPDK transport ID string. `trtype` is TCP (default) or
    /// RDMA; `traddr` is required; `trsvcid` defaults to 4420 and
    /// `subnqn` to the discovery NQN.
    pub fn parse(s: &str) -> Result<TransportId> {
        let bad = |m: String| Error::InvalidArg(format!("transport ID '{s}': {m}"));
        let mut trtype = None;
        let mut adrfam = None;
        let mut traddr = None;
        let mut trsvcid = None;
        let mut subnqn = None;
        let mut hostnqn = None;
        let mut nsid = None;
        for word in s.split_whitespace() {
            let Some(sep) = word.find([':', '=']) else {
                return Err(bad(format!("'{word}' is not key:value")));
            };
            let (key, value) = (&word[..sep], &word[sep + 1..]);
            if value.is_empty() {
                return Err(bad(format!("'{key}' has no value")));
            }
            match key.to_ascii_lowercase().as_str() {
                "trtype" => trtype = Some(value.to_string()),
                "adrfam" => adrfam = Some(value.to_string()),
                "traddr" => traddr = Some(value.to_string()),
                "trsvcid" => trsvcid = Some(value.to_string()),
                "subnqn" => subnqn = Some(value.to_string()),
                "hostnqn" => hostnqn = Some(value.to_string()),
                "ns" | "nsid" => {
                    nsid = Some(
                        value
                            .parse::<u32>()
                            .map_err(|_| bad(format!("ns '{value}' is not a number")))?,
                    )
                }
                // Accepted by SPDK, meaningless here.
                "priority" | "alt_traddr" | "hostaddr" | "hostsvcid" => {}
                other => return Err(bad(format!("unknown key '{other}'"))),
            }
        }
        let trtype = match trtype {
            None => TrType::Tcp,
            Some(t) if t.eq_ignore_ascii_case("tcp") => TrType::Tcp,
            Some(t) if t.eq_ignore_ascii_case("rdma") => TrType::Rdma,
            Some(t) => return Err(bad(format!("trtype '{t}' is not supported (TCP or RDMA)"))),
        };
        let traddr = traddr.ok_or_else(|| bad("traddr is missing".into()))?;
        let adrfam = match adrfam.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None => {
                if traddr.contains(':') {
                    AdrFam::Ipv6
                } else {
                    AdrFam::Ipv4
                }
            }
            Some("ipv4") => AdrFam::Ipv4,
            Some("ipv6") => AdrFam::Ipv6,
            Some(o) => return Err(bad(format!("adrfam '{o}' is not IPv4 or IPv6"))),
        };
        let trsvcid = trsvcid.unwrap_or_else(|| "4420".into());
        if trsvcid.parse::<u16>().is_err() {
            return Err(bad(format!("trsvcid '{trsvcid}' is not a port number")));
        }
        Ok(TransportId {
            trtype,
            adrfam,
            traddr,
            trsvcid,
            subnqn: subnqn.unwrap_or_else(|| DISCOVERY_NQN.into()),
            hostnqn,
            nsid,
        })
    }

    /// `host:port` for `TcpStream::connect` / the RDMA address resolution
    /// (IPv6 addresses bracketed).
    pub fn socket_addr_string(&self) -> String {
        if self.traddr.contains(':') && !self.traddr.starts_with('[') {
            format!("[{}]:{}", self.traddr, self.trsvcid)
        } else {
            format!("{}:{}", self.traddr, self.trsvcid)
        }
    }
}

impl FromStr for TransportId {
    type Err = Error;
    fn from_str(s: &str) -> Result<TransportId> {
        TransportId::parse(s)
    }
}

impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fam = match self.adrfam {
            AdrFam::Ipv4 => "IPv4",
            AdrFam::Ipv6 => "IPv6",
        };
        let tr = match self.trtype {
            TrType::Tcp => "TCP",
            TrType::Rdma => "RDMA",
        };
        write!(
            f,
            "trtype:{tr} adrfam:{fam} traddr:{} trsvcid:{} subnqn:{}",
            self.traddr, self.trsvcid, self.subnqn
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_spdk_style() {
        let t = TransportId::parse(
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2024-01.io.nvmfd:default",
        )
        .unwrap();
        assert_eq!(t.traddr, "127.0.0.1");
        assert_eq!(t.trsvcid, "4420");
        assert_eq!(t.subnqn, "nqn.2024-01.io.nvmfd:default");
        assert_eq!(t.adrfam, AdrFam::Ipv4);
        assert_eq!(t.socket_addr_string(), "127.0.0.1:4420");
        let back = TransportId::parse(&t.to_string()).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn defaults_and_equals() {
        let t = TransportId::parse("TRTYPE=tcp traddr=::1 ns=2").unwrap();
        assert_eq!(t.adrfam, AdrFam::Ipv6);
        assert_eq!(t.subnqn, DISCOVERY_NQN);
        assert_eq!(t.trsvcid, "4420");
        assert_eq!(t.nsid, Some(2));
        assert_eq!(t.socket_addr_string(), "[::1]:4420");
    }

    #[test]
    fn errors() {
        for s in [
            "traddr",
            "trsvcid:4420",
            "traddr:1.2.3.4 trsvcid:99999",
            "traddr:1.2.3.4 foo:bar",
            "traddr:1.2.3.4 adrfam:IB",
        ] {
            assert!(TransportId::parse(s).is_err(), "{s}");
        }
        let e = TransportId::parse("trtype:FC traddr:1.2.3.4").unwrap_err();
        assert!(e.to_string().contains("'FC' is not supported"), "{e}");
    }

    #[test]
    fn rdma_both_families() {
        let t =
            TransportId::parse("trtype:rdma traddr:10.1.0.1 trsvcid:4420 subnqn:nqn.x").unwrap();
        assert_eq!(t.trtype, TrType::Rdma);
        assert_eq!(t.adrfam, AdrFam::Ipv4);
        assert_eq!(TransportId::parse(&t.to_string()).unwrap(), t);
        assert!(t.to_string().starts_with("trtype:RDMA adrfam:IPv4"));
        let t = TransportId::parse("trtype:RDMA adrfam:IPv6 traddr:fd00::1").unwrap();
        assert_eq!((t.trtype, t.adrfam), (TrType::Rdma, AdrFam::Ipv6));
        assert_eq!(t.socket_addr_string(), "[fd00::1]:4420");
        assert_eq!(
            TransportId::parse("traddr:1.2.3.4").unwrap().trtype,
            TrType::Tcp
        );
    }
}
