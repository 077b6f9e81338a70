//! The discovery log page (log 70h) as one host sees it.
//!
//! Owns which records a host gets: one per (NVM subsystem the host may
//! connect to, listener of that subsystem), then one "current discovery
//! subsystem" record (subtype 3) for the address the host used, as nvmet
//! does. Wildcard listen addresses are reported as the address the host
//! reached, so the host can connect to them.

use nvmf_config::{AddressFamily, ListenerConfig, TransportType, DISCOVERY_NQN};
use nvmf_wire::log::{
    DiscoveryLogEntry, DiscoveryLogHeader, ADRFAM_IPV4, ADRFAM_IPV6, SUBTYPE_CURRENT_DISCOVERY,
    SUBTYPE_NVM, TREQ_DISABLE_SQFLOW, TREQ_SECURE_CHANNEL_NOT_SPECIFIED,
    TREQ_SECURE_CHANNEL_REQUIRED, TRTYPE_TCP, TSAS_TCP_SECTYPE_TLS13,
};
use nvmf_wire::zerocopy::{FromZeros, IntoBytes};

use crate::queue::PortInfo;
use crate::target::Target;

/// Size of the header and of each record.
pub const RECORD: usize = 1024;

/// TREQ of a clear-text listener's record: secure channel "not specified"
/// and the host may disable SQ flow control. The kernel target sends the
/// same value, and nvme-cli 2.3 cannot name the "not required" variant.
pub const TREQ: u8 = TREQ_SECURE_CHANNEL_NOT_SPECIFIED | TREQ_DISABLE_SQFLOW;
/// TREQ of a listener that requires TLS (`secure_channel`): "required".
pub const TREQ_TLS: u8 = TREQ_SECURE_CHANNEL_REQUIRED | TREQ_DISABLE_SQFLOW;

/// A record for a listener that requires TLS: TREQ "required", TSAS
/// security type TLS 1.3 (as nvmet's `addr_tsas=tls1.3`, `addr_treq=required`).
fn secure(mut e: DiscoveryLogEntry, on: bool) -> DiscoveryLogEntry {
    if on {
        e.treq = TREQ_TLS;
        e.tsas[0] = TSAS_TCP_SECTYPE_TLS13;
    }
    e
}

fn trtype_code(t: TransportType) -> u8 {
    match t {
        TransportType::Tcp => TRTYPE_TCP,
    }
}

fn adrfam_code(a: AddressFamily) -> u8 {
    match a {
        AddressFamily::Ipv4 => ADRFAM_IPV4,
        AddressFamily::Ipv6 => ADRFAM_IPV6,
    }
}

/// True for listen addresses that mean "every local address".
pub fn is_wildcard(addr: &str) -> bool {
    matches!(addr, "" | "0.0.0.0" | "::" | "[::]")
}

/// The address to report for a listener: its own, or the one the host
/// reached when the listener is a wildcard of the same family.
fn report_addr<'a>(l: &'a ListenerConfig, port: &'a PortInfo) -> &'a str {
    if is_wildcard(&l.traddr) && l.adrfam == port.adrfam && !is_wildcard(&port.traddr) {
        &port.traddr
    } else {
        &l.traddr
    }
}

/// The whole discovery log for `hostnqn` connected through `port`: header
/// plus records.
pub fn discovery_log(target: &Target, hostnqn: &str, port: &PortInfo) -> Vec<u8> {
    let asqsz = target.limits().max_aq_depth;
    let mut entries: Vec<DiscoveryLogEntry> = Vec::new();
    for sub in target.subsystems() {
        if !sub.host_allowed(hostnqn) {
            continue;
        }
        for l in sub.listeners() {
            let tls = target.tls().is_secure(&l.traddr, &l.trsvcid);
            entries.push(secure(
                DiscoveryLogEntry::new(
                    trtype_code(l.trtype),
                    adrfam_code(l.adrfam),
                    SUBTYPE_NVM,
                    TREQ,
                    target.port_id(&l.trsvcid, &l.traddr),
                    asqsz,
                    &l.trsvcid,
                    sub.nqn(),
                    report_addr(&l, port),
                ),
                tls,
            ));
        }
    }
    entries.push(secure(
        DiscoveryLogEntry::new(
            trtype_code(port.trtype),
            adrfam_code(port.adrfam),
            SUBTYPE_CURRENT_DISCOVERY,
            TREQ,
            target.port_id(&port.trsvcid, &port.traddr),
            asqsz,
            &port.trsvcid,
            DISCOVERY_NQN,
            &port.traddr,
        ),
        port.tls.is_some(),
    ));

    let mut hdr = DiscoveryLogHeader::new_zeroed();
    hdr.genctr.set(target.discovery_generation());
    hdr.numrec.set(entries.len() as u64);
    hdr.recfmt.set(0);

    let mut page = Vec::with_capacity(RECORD * (1 + entries.len()));
    page.extend_from_slice(hdr.as_bytes());
    for e in &entries {
        page.extend_from_slice(e.as_bytes());
    }
    page
}
