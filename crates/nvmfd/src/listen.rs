//! Listen sockets: resolving a configured listen address and binding one
//! nonblocking `SO_REUSEPORT` listener per reactor for it, so that every
//! reactor accepts connections for itself (the kernel spreads them; queue
//! placement in `placement.rs` may then move I/O queues). NVMe/TCP only:
//! NVMe/RDMA listeners belong to reactor 0's RDMA port (`rdma.rs`).

use anyhow::{anyhow, Context, Result};
use nvmf_config::{AddressFamily, ListenerConfig, TransportType};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{SocketAddr, ToSocketAddrs};

/// One configured listen address, resolved.
#[derive(Debug, Clone)]
pub struct ListenAddr {
    pub cfg: ListenerConfig,
    pub addr: SocketAddr,
}

impl ListenAddr {
    pub fn resolve(cfg: &ListenerConfig) -> Result<ListenAddr> {
        if cfg.trtype == TransportType::Rdma {
            return Err(anyhow!(
                "NVMe/RDMA listener {}:{}: not a TCP listen address (the RDMA reactor serves it)",
                cfg.traddr,
                cfg.trsvcid
            ));
        }
        let port: u16 = cfg.trsvcid.parse().map_err(|_| {
            anyhow!(
                "listener {}: trsvcid {:?} is not a port",
                cfg.traddr,
                cfg.trsvcid
            )
        })?;
        let want_v6 = cfg.adrfam == AddressFamily::Ipv6;
        let addrs: Vec<SocketAddr> = (cfg.traddr.as_str(), port)
            .to_socket_addrs()
            .with_context(|| format!("resolving listen address {}:{}", cfg.traddr, cfg.trsvcid))?
            .collect();
        let addr = addrs
            .iter()
            .find(|a| a.is_ipv6() == want_v6)
            .or(addrs.first())
            .copied()
            .ok_or_else(|| anyhow!("listen address {} resolves to nothing", cfg.traddr))?;
        Ok(ListenAddr {
            cfg: cfg.clone(),
            addr,
        })
    }
}

/// Fails if something already listens on `addr`. SO_REUSEPORT would
/// otherwise let a second nvmfd (same user) silently share the port with
/// the first; this probe binds without it first.
pub fn check_free(addr: SocketAddr) -> std::io::Result<()> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())
}

/// TCP congestion control set on every listen socket (`--tcp-congestion`);
/// accepted sockets inherit it. Set once at start, before any listener.
static CONGESTION: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets `--tcp-congestion` for all listeners after checking that the kernel
/// accepts `name` on a socket (it must be loaded and, for unprivileged
/// processes, in net.ipv4.tcp_allowed_congestion_control).
pub fn set_congestion(name: &str) -> Result<()> {
    let probe = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    probe.set_tcp_congestion(name.as_bytes()).map_err(|e| {
        anyhow!(
            "--tcp-congestion {name}: {e} (available: {}; allowed: {})",
            sysctl("tcp_available_congestion_control"),
            sysctl("tcp_allowed_congestion_control")
        )
    })?;
    let _ = CONGESTION.set(name.to_string());
    Ok(())
}

/// The system's default congestion control, if readable.
pub fn default_congestion() -> String {
    sysctl("tcp_congestion_control")
}

fn sysctl(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// A nonblocking TCP listener on `addr` with SO_REUSEADDR and SO_REUSEPORT.
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    if let Some(cc) = CONGESTION.get() {
        sock.set_tcp_congestion(cc.as_bytes())?;
    }
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    Ok(sock.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_listeners_are_refused_with_a_clear_error() {
        let mut l = ListenerConfig {
            trtype: TransportType::Rdma,
            adrfam: AddressFamily::Ipv4,
            traddr: "127.0.0.1".into(),
            trsvcid: "4420".into(),
        };
        let e = ListenAddr::resolve(&l).unwrap_err().to_string();
        assert_eq!(
            e,
            "NVMe/RDMA listener 127.0.0.1:4420: not a TCP listen address (the RDMA reactor serves it)"
        );
        l.trtype = TransportType::Tcp;
        let a = ListenAddr::resolve(&l).unwrap();
        assert_eq!(a.addr, "127.0.0.1:4420".parse().unwrap());
    }
}
