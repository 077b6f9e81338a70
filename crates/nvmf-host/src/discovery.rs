//! discovery.rs — the Discovery log page (Get Log Page 70h) from the host
//! side: reading it consistently (header, entries, header again until the
//! generation counter is stable), the owned `DiscoveryLog`/`DiscoveryEntry`
//! form, and the text `nvme discover` prints for it (TCP security type, RDMA
//! TSAS).

use crate::controller::Controller;
use crate::error::{Error, Result};
use nvmf_wire::log::{
    DiscoveryLogEntry, DiscoveryLogHeader, ADRFAM_FC, ADRFAM_IB, ADRFAM_IPV4, ADRFAM_IPV6,
    EFLAGS_DUPRETINFO, EFLAGS_EPCSD, EFLAGS_NCC, SUBTYPE_CURRENT_DISCOVERY, SUBTYPE_DISCOVERY,
    SUBTYPE_NVM, TREQ_DISABLE_SQFLOW, TRTYPE_FC, TRTYPE_LOOP, TRTYPE_RDMA, TRTYPE_TCP,
};
use nvmf_wire::rdma::{
    RdmaTsas, RDMA_CMS_RDMA_CM, RDMA_PRTYPE_IB, RDMA_PRTYPE_IWARP, RDMA_PRTYPE_NOT_SPECIFIED,
    RDMA_PRTYPE_ROCE, RDMA_PRTYPE_ROCEV2, RDMA_QPTYPE_RELIABLE_CONNECTED,
    RDMA_QPTYPE_RELIABLE_DATAGRAM,
};
use nvmf_wire::zerocopy::FromBytes;
use nvmf_wire::LogPageId;
use std::fmt::Write as _;

const HDR: usize = 1024;
const ENTRY: usize = 1024;
/// Refuse logs claiming more records than this (a broken target).
const MAX_RECORDS: u64 = 4096;
/// Re-reads when the generation counter changes under us.
const MAX_TRIES: usize = 10;

/// One discovery log record, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: u16,
    pub cntlid: u16,
    pub asqsz: u16,
    pub eflags: u16,
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// TCP security type (TSAS byte 0).
    pub sectype: u8,
    /// The RDMA TSAS of an RDMA record (`None` for other transports).
    pub rdma: Option<RdmaTsas>,
}

impl DiscoveryEntry {
    pub(crate) fn from_wire(e: &DiscoveryLogEntry) -> DiscoveryEntry {
        DiscoveryEntry {
            trtype: e.trtype,
            adrfam: e.adrfam,
            subtype: e.subtype,
            treq: e.treq,
            portid: e.portid.get(),
            cntlid: e.cntlid.get(),
            asqsz: e.asqsz.get(),
            eflags: e.eflags.get(),
            trsvcid: e.trsvcid().to_string(),
            subnqn: e.subnqn().to_string(),
            traddr: e.traddr().to_string(),
            sectype: e.tsas[0],
            rdma: (e.trtype == TRTYPE_RDMA).then(|| RdmaTsas::from_bytes(&e.tsas)),
        }
    }
}

/// The whole discovery log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryLog {
    pub genctr: u64,
    pub entries: Vec<DiscoveryEntry>,
}

impl Controller {
    /// Read the discovery log (the controller should be a discovery
    /// controller). Reads the header, then all records, then the header
    /// again, and starts over if the generation counter moved.
    pub fn discovery_log(&self) -> Result<DiscoveryLog> {
        let lid = LogPageId::Discovery as u8;
        let mut hdr = [0u8; HDR];
        for _ in 0..MAX_TRIES {
            self.get_log_page(lid, 0, 0, &mut hdr)?;
            let h = DiscoveryLogHeader::read_from_bytes(&hdr[..]).expect("1024 bytes");
            let (genctr, numrec) = (h.genctr.get(), h.numrec.get());
            if numrec > MAX_RECORDS {
                return Err(Error::Protocol(format!(
                    "discovery log claims {numrec} records"
                )));
            }
            let mut entries = Vec::with_capacity(numrec as usize);
            if numrec > 0 {
                let mut buf = vec![0u8; numrec as usize * ENTRY];
                self.get_log_page(lid, 0, HDR as u64, &mut buf)?;
                for chunk in buf.chunks_exact(ENTRY) {
                    let e = DiscoveryLogEntry::read_from_bytes(chunk).expect("1024 bytes");
                    entries.push(DiscoveryEntry::from_wire(&e));
                }
            }
            self.get_log_page(lid, 0, 0, &mut hdr)?;
            let again = DiscoveryLogHeader::read_from_bytes(&hdr[..]).expect("1024 bytes");
            if again.genctr.get() == genctr && again.numrec.get() == numrec {
                return Ok(DiscoveryLog { genctr, entries });
            }
        }
        Err(Error::Timeout(format!(
            "discovery log kept changing over {MAX_TRIES} reads"
        )))
    }
}

/// Name of a transport type, as nvme-cli prints it.
pub fn trtype_str(t: u8) -> String {
    match t {
        TRTYPE_RDMA => "rdma".into(),
        TRTYPE_FC => "fc".into(),
        TRTYPE_TCP => "tcp".into(),
        TRTYPE_LOOP => "loop".into(),
        o => format!("unrecognized ({o})"),
    }
}

/// Name of an address family, as nvme-cli prints it.
pub fn adrfam_str(a: u8) -> String {
    match a {
        ADRFAM_IPV4 => "ipv4".into(),
        ADRFAM_IPV6 => "ipv6".into(),
        ADRFAM_IB => "infiniband".into(),
        ADRFAM_FC => "fibre-channel".into(),
        0 => "pci".into(),
        254 => "loop".into(),
        o => format!("unrecognized ({o})"),
    }
}

/// Name of a subsystem type, as nvme-cli prints it.
pub fn subtype_str(s: u8) -> String {
    match s {
        SUBTYPE_DISCOVERY => "discovery subsystem referral".into(),
        SUBTYPE_NVM => "nvme subsystem".into(),
        SUBTYPE_CURRENT_DISCOVERY => "current discovery subsystem".into(),
        o => format!("unrecognized ({o})"),
    }
}

/// Transport requirements, as nvme-cli prints them.
pub fn treq_str(t: u8) -> String {
    let mut s = match t & 0x3 {
        0 => "not specified".to_string(),
        1 => "required".to_string(),
        2 => "not required".to_string(),
        _ => "reserved".to_string(),
    };
    if t & TREQ_DISABLE_SQFLOW != 0 {
        s.push_str(", sq flow control disable supported");
    }
    s
}

/// Entry flags, as nvme-cli prints them.
pub fn eflags_str(f: u16) -> String {
    let mut parts = Vec::new();
    if f & EFLAGS_DUPRETINFO != 0 {
        parts.push("duplicate discovery information");
    }
    if f & EFLAGS_EPCSD != 0 {
        parts.push("explicit discovery connections");
    }
    if f & EFLAGS_NCC != 0 {
        parts.push("no cdc connectivity");
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// TCP security type, as nvme-cli prints it.
pub fn sectype_str(s: u8) -> String {
    match s {
        0 => "none".into(),
        1 => "tls".into(),
        2 => "tls13".into(),
        o => format!("unrecognized ({o})"),
    }
}

/// RDMA provider type, as nvme-cli prints it.
pub fn rdma_prtype_str(p: u8) -> String {
    match p {
        RDMA_PRTYPE_NOT_SPECIFIED => "not specified".into(),
        RDMA_PRTYPE_IB => "infiniband".into(),
        RDMA_PRTYPE_ROCE => "roce".into(),
        RDMA_PRTYPE_ROCEV2 => "roce-v2".into(),
        RDMA_PRTYPE_IWARP => "iwarp".into(),
        o => format!("unrecognized ({o})"),
    }
}

/// RDMA queue pair service type, as nvme-cli prints it.
pub fn rdma_qptype_str(q: u8) -> String {
    match q {
        RDMA_QPTYPE_RELIABLE_CONNECTED => "connected".into(),
        RDMA_QPTYPE_RELIABLE_DATAGRAM => "datagram".into(),
        o => format!("unrecognized ({o})"),
    }
}

/// RDMA connection management service, as nvme-cli prints it.
pub fn rdma_cms_str(c: u8) -> String {
    match c {
        RDMA_CMS_RDMA_CM => "rdma-cm".into(),
        o => format!("unrecognized ({o})"),
    }
}

/// The log as `nvme discover` prints it.
pub fn format_nvme_cli(log: &DiscoveryLog) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nDiscovery Log Number of Records {}, Generation counter {}",
        log.entries.len(),
        log.genctr
    );
    for (i, e) in log.entries.iter().enumerate() {
        let _ = writeln!(s, "=====Discovery Log Entry {i}======");
        let _ = writeln!(s, "trtype:  {}", trtype_str(e.trtype));
        let _ = writeln!(s, "adrfam:  {}", adrfam_str(e.adrfam));
        let _ = writeln!(s, "subtype: {}", subtype_str(e.subtype));
        let _ = writeln!(s, "treq:    {}", treq_str(e.treq));
        let _ = writeln!(s, "portid:  {}", e.portid);
        let _ = writeln!(s, "trsvcid: {}", e.trsvcid);
        let _ = writeln!(s, "subnqn:  {}", e.subnqn);
        let _ = writeln!(s, "traddr:  {}", e.traddr);
        let _ = writeln!(s, "eflags:  {}", eflags_str(e.eflags));
        if e.trtype == TRTYPE_TCP {
            let _ = writeln!(s, "sectype: {}", sectype_str(e.sectype));
        }
        if let Some(t) = &e.rdma {
            let _ = writeln!(s, "rdma_prtype: {}", rdma_prtype_str(t.prtype));
            let _ = writeln!(s, "rdma_qptype: {}", rdma_qptype_str(t.qptype));
            let _ = writeln!(s, "rdma_cms:    {}", rdma_cms_str(t.cms));
            let _ = writeln!(s, "rdma_pkey: {:#06x}", t.pkey.get());
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_nvme_cli() {
        let log = DiscoveryLog {
            genctr: 3,
            entries: vec![DiscoveryEntry {
                trtype: TRTYPE_TCP,
                adrfam: ADRFAM_IPV4,
                subtype: SUBTYPE_NVM,
                treq: 2,
                portid: 1,
                cntlid: 0xffff,
                asqsz: 32,
                eflags: 0,
                trsvcid: "4420".into(),
                subnqn: "nqn.2024-01.io.nvmfd:default".into(),
                traddr: "127.0.0.1".into(),
                sectype: 0,
                rdma: None,
            }],
        };
        let s = format_nvme_cli(&log);
        assert!(s.contains("Discovery Log Number of Records 1, Generation counter 3"));
        assert!(s.contains("subtype: nvme subsystem\n"));
        assert!(s.contains("treq:    not required\n"));
        assert!(s.contains("subnqn:  nqn.2024-01.io.nvmfd:default\n"));
        assert!(s.contains("sectype: none\n"));
    }

    #[test]
    fn rdma_records_print_their_tsas() {
        let mut wire = DiscoveryLogEntry::new(
            TRTYPE_RDMA,
            ADRFAM_IPV4,
            SUBTYPE_NVM,
            0,
            1,
            32,
            "4420",
            "nqn.2016-06.io.spdk:cnode1",
            "192.168.100.8",
        );
        wire.tsas = RdmaTsas::rdma_cm().to_bytes();
        let e = DiscoveryEntry::from_wire(&wire);
        assert_eq!(e.rdma, Some(RdmaTsas::rdma_cm()));
        let s = format_nvme_cli(&DiscoveryLog {
            genctr: 1,
            entries: vec![e],
        });
        assert!(s.contains("trtype:  rdma\n"), "{s}");
        assert!(!s.contains("sectype"), "{s}");
        assert!(
            s.contains(
                "rdma_prtype: not specified\nrdma_qptype: connected\nrdma_cms:    rdma-cm\nrdma_pkey: 0x0000\n"
            ),
            "{s}"
        );
        // A TCP record has no RDMA TSAS.
        let tcp = DiscoveryLogEntry::new(
            TRTYPE_TCP,
            ADRFAM_IPV4,
            SUBTYPE_NVM,
            0,
            1,
            32,
            "4420",
            "nqn.2016-06.io.spdk:cnode1",
            "192.168.100.8",
        );
        assert_eq!(DiscoveryEntry::from_wire(&tcp).rdma, None);
        assert_eq!(rdma_prtype_str(4), "roce-v2");
        assert_eq!(rdma_qptype_str(9), "unrecognized (9)");
    }
}
