//! The discovery log page (log 70h) as one host sees it.
//!
//! Owns which records a host gets: one per (NVM subsystem the host may
//! connect to, listener of that subsystem), then one "current discovery
//! subsystem" record (subtype 3) for the address the host used, as nvmet
//! does. Wildcard listen addresses are reported as the address the host
//! reached, so the host can connect to them. Each record carries its
//! transport's TSAS: for TCP the security type (TLS on listeners that
//! require it), for RDMA the queue pair type, provider and connection
//! manager (reliable connected, not specified, RDMA CM), as nvmet and SPDK
//! report them.

use nvmf_config::{AddressFamily, ListenerConfig, TransportType, DISCOVERY_NQN};
use nvmf_wire::log::{
    DiscoveryLogEntry, DiscoveryLogHeader, ADRFAM_IPV4, ADRFAM_IPV6, SUBTYPE_CURRENT_DISCOVERY,
    SUBTYPE_NVM, TREQ_DISABLE_SQFLOW, TREQ_SECURE_CHANNEL_NOT_SPECIFIED,
    TREQ_SECURE_CHANNEL_REQUIRED, TRTYPE_RDMA, TRTYPE_TCP, TSAS_TCP_SECTYPE_TLS13,
};
use nvmf_wire::rdma::RdmaTsas;
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

/// The transport specific parts of a record: for TCP, a listener that
/// requires TLS gets TREQ "required" and TSAS security type TLS 1.3 (as
/// nvmet's `addr_tsas=tls1.3`, `addr_treq=required`); an RDMA record gets
/// the RDMA TSAS (TLS is a TCP matter: `tls` is ignored for RDMA).
fn transport_specific(
    mut e: DiscoveryLogEntry,
    trtype: TransportType,
    tls: bool,
) -> DiscoveryLogEntry {
    match trtype {
        TransportType::Tcp => {
            if tls {
                e.treq = TREQ_TLS;
                e.tsas[0] = TSAS_TCP_SECTYPE_TLS13;
            }
        }
        TransportType::Rdma => e.tsas = RdmaTsas::rdma_cm().to_bytes(),
    }
    e
}

fn trtype_code(t: TransportType) -> u8 {
    match t {
        TransportType::Tcp => TRTYPE_TCP,
        TransportType::Rdma => TRTYPE_RDMA,
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
            entries.push(transport_specific(
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
                l.trtype,
                tls,
            ));
        }
    }
    entries.push(transport_specific(
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
        port.trtype,
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

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_config::TargetConfig;
    use nvmf_wire::log::{ADRFAM_IPV4, ADRFAM_IPV6, TREQ_SECURE_CHANNEL_REQUIRED};
    use nvmf_wire::rdma::{
        RDMA_CMS_RDMA_CM, RDMA_PRTYPE_NOT_SPECIFIED, RDMA_QPTYPE_RELIABLE_CONNECTED,
    };
    use nvmf_wire::zerocopy::FromBytes;
    use std::sync::Arc;

    const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

    /// Subsystem NQN listening on TCP 10.0.0.1:4420 (TLS), RDMA on the
    /// same address and port, and RDMA on fd00::1:4421.
    fn target() -> Arc<Target> {
        let l = |t: &str, a: &str, s: &str, secure: bool| {
            format!(
                r#"{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}",
                "secure_channel":{secure},
                "listen_address":{{"trtype":"{t}","traddr":"{a}","trsvcid":"{s}"}}}}}}"#
            )
        };
        let cfg = format!(
            r#"{{"subsystems":[
            {{"subsystem":"bdev","config":[{{"method":"bdev_malloc_create",
                "params":{{"name":"Malloc0","num_blocks":64,"block_size":512}}}}]}},
            {{"subsystem":"nvmf","config":[
                {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
                {{"method":"nvmf_create_transport","params":{{"trtype":"RDMA"}}}},
                {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true}}}},
                {}, {}, {}]}}]}}"#,
            l("TCP", "10.0.0.1", "4420", true),
            l("RDMA", "10.0.0.1", "4420", false),
            l("RDMA", "fd00::1", "4421", false),
        );
        let cfg = TargetConfig::from_json_str(&cfg).expect("config");
        let t = Target::from_config(&cfg).expect("target");
        t.set_tls(Arc::new(crate::tls::load_tls(&cfg).expect("TLS table")));
        t
    }

    fn port(trtype: TransportType) -> PortInfo {
        PortInfo {
            trtype,
            adrfam: AddressFamily::Ipv4,
            traddr: "10.0.0.1".into(),
            trsvcid: "4420".into(),
            peer: "10.0.0.2:50000".parse().unwrap(),
            tls: None,
            caps: crate::transport::TransportCaps::MESSAGE_BASED,
        }
    }

    fn records(page: &[u8]) -> Vec<DiscoveryLogEntry> {
        let hdr = DiscoveryLogHeader::read_from_bytes(&page[..RECORD]).unwrap();
        assert_eq!(page.len(), RECORD * (1 + hdr.numrec.get() as usize));
        page[RECORD..]
            .chunks(RECORD)
            .map(|c| DiscoveryLogEntry::read_from_bytes(c).unwrap())
            .collect()
    }

    fn rdma_tsas() -> [u8; 256] {
        let mut t = [0u8; 256];
        t[0] = RDMA_QPTYPE_RELIABLE_CONNECTED;
        t[1] = RDMA_PRTYPE_NOT_SPECIFIED;
        t[2] = RDMA_CMS_RDMA_CM;
        t
    }

    #[test]
    fn rdma_listeners_get_trtype_rdma_and_the_rdma_tsas() {
        let t = target();
        let e = records(&discovery_log(&t, "nqn.host", &port(TransportType::Tcp)));
        assert_eq!(e.len(), 4);
        // TCP with TLS: TREQ required, TSAS TLS 1.3.
        assert_eq!(e[0].trtype, TRTYPE_TCP);
        assert_eq!(e[0].treq & 3, TREQ_SECURE_CHANNEL_REQUIRED);
        assert_eq!(e[0].tsas[0], TSAS_TCP_SECTYPE_TLS13);
        // RDMA on the same address and port: never TLS, the RDMA TSAS.
        assert_eq!(e[1].trtype, TRTYPE_RDMA);
        assert_eq!(e[1].adrfam, ADRFAM_IPV4);
        assert_eq!(e[1].subtype, SUBTYPE_NVM);
        assert_eq!(e[1].treq, TREQ);
        assert_eq!(e[1].traddr(), "10.0.0.1");
        assert_eq!(e[1].trsvcid(), "4420");
        assert_eq!(e[1].subnqn(), NQN);
        assert_eq!(e[1].tsas, rdma_tsas());
        assert_eq!(e[2].trtype, TRTYPE_RDMA);
        assert_eq!(e[2].adrfam, ADRFAM_IPV6);
        assert_eq!(e[2].traddr(), "fd00::1");
        assert_eq!(e[2].trsvcid(), "4421");
        assert_eq!(e[2].tsas, rdma_tsas());
        // The current discovery record follows the port asked through.
        assert_eq!(e[3].trtype, TRTYPE_TCP);
        assert_eq!(e[3].subtype, SUBTYPE_CURRENT_DISCOVERY);
        assert_eq!(e[3].tsas, [0u8; 256]);

        let e = records(&discovery_log(&t, "nqn.host", &port(TransportType::Rdma)));
        assert_eq!(e[3].trtype, TRTYPE_RDMA);
        assert_eq!(e[3].subtype, SUBTYPE_CURRENT_DISCOVERY);
        assert_eq!(e[3].treq, TREQ);
        assert_eq!(e[3].tsas, rdma_tsas());
    }
}
