//! Listen sockets: resolving a configured listen address and binding one
//! nonblocking `SO_REUSEPORT` listener per reactor for it, so that every
//! reactor accepts connections for itself (the kernel spreads them; queue
//! placement in `placement.rs` may then move I/O queues).

use anyhow::{anyhow, Context, Result};
use nvmf_config::{AddressFamily, ListenerConfig};
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

/// A nonblocking TCP listener on `addr` with SO_REUSEADDR and SO_REUSEPORT.
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    Ok(sock.into())
}
