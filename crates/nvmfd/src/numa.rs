//! NUMA topology from sysfs, for queue placement (`placement.rs`): the node
//! of a CPU (`/sys/devices/system/cpu/cpuN/nodeM`) and the node of the
//! network device that carries a local IP address (the interface from
//! getifaddrs(3), then `/sys/class/net/IF/device/numa_node`; a VLAN, bond
//! or other stacked interface without a `device` link is followed down its
//! `lower_*` links to the first physical device that has a node). Loopback
//! and purely virtual devices have no device, and single-node machines
//! report -1: both read as "no node" (all reactors are then equal).

use std::net::IpAddr;
use std::path::Path;

/// The NUMA node of `cpu`, if sysfs names one.
pub fn cpu_node(cpu: usize) -> Option<u32> {
    cpu_node_in(Path::new("/sys/devices/system/cpu"), cpu)
}

fn cpu_node_in(root: &Path, cpu: usize) -> Option<u32> {
    let dir = std::fs::read_dir(root.join(format!("cpu{cpu}"))).ok()?;
    dir.flatten().find_map(|e| {
        e.file_name()
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse().ok())
    })
}

/// The NUMA node of the network device that has `ip` as one of its
/// addresses (None: no such interface, or it has no node).
pub fn nic_node(ip: IpAddr) -> Option<u32> {
    let ifname = interface_of(ip)?;
    if_node_in(Path::new("/sys/class/net"), &ifname, 0)
}

/// Stacked interfaces followed at most this deep (VLAN on bond on NIC).
const MAX_LOWER_DEPTH: usize = 4;

/// The node of interface `ifname` under `root` (`/sys/class/net`): its own
/// device's, else the first of its lower devices' that has one.
fn if_node_in(root: &Path, ifname: &str, depth: usize) -> Option<u32> {
    let dir = root.join(ifname);
    if let Some(n) = read_node(&dir.join("device/numa_node")) {
        return Some(n);
    }
    if depth >= MAX_LOWER_DEPTH {
        return None;
    }
    let mut lower: Vec<String> = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("lower_"))
                .map(str::to_string)
        })
        .collect();
    lower.sort();
    lower.iter().find_map(|l| if_node_in(root, l, depth + 1))
}

fn read_node(path: &Path) -> Option<u32> {
    let s = std::fs::read_to_string(path).ok()?;
    let v: i64 = s.trim().parse().ok()?;
    u32::try_from(v).ok()
}

/// The name of the interface that has address `ip` (IPv4-mapped IPv6
/// addresses match their IPv4 form).
fn interface_of(ip: IpAddr) -> Option<String> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with
    // freeifaddrs; we only read it in between.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says which
        // struct it is; we read only that struct.
        let addr = unsafe {
            match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    Some(IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            }
        };
        if addr == Some(ip) {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_no_node() {
        assert_eq!(
            interface_of("127.0.0.1".parse().unwrap()).as_deref(),
            Some("lo")
        );
        assert_eq!(nic_node("127.0.0.1".parse().unwrap()), None);
        assert_eq!(nic_node("::ffff:127.0.0.1".parse().unwrap()), None);
        // An address no interface has.
        assert_eq!(interface_of("192.0.2.123".parse().unwrap()), None);
    }

    #[test]
    fn cpu_and_device_nodes_from_a_fake_sysfs() {
        let root = std::env::temp_dir().join(format!("nvmfd-numa-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("cpu3/node1")).unwrap();
        std::fs::create_dir_all(root.join("cpu3/cache")).unwrap();
        std::fs::create_dir_all(root.join("cpu4")).unwrap();
        std::fs::write(root.join("minus"), "-1\n").unwrap();
        std::fs::write(root.join("one"), "1\n").unwrap();
        assert_eq!(cpu_node_in(&root, 3), Some(1));
        assert_eq!(cpu_node_in(&root, 4), None);
        assert_eq!(cpu_node_in(&root, 5), None);
        assert_eq!(read_node(&root.join("minus")), None);
        assert_eq!(read_node(&root.join("one")), Some(1));
        assert_eq!(read_node(&root.join("absent")), None);

        // /sys/class/net: eth0 on node 1; vlan10 on bond0 on eth0; lo and
        // a dummy without device; a NIC reporting -1.
        let net = root.join("net");
        std::fs::create_dir_all(net.join("eth0/device")).unwrap();
        std::fs::write(net.join("eth0/device/numa_node"), "1\n").unwrap();
        std::fs::create_dir_all(net.join("bond0/lower_eth0")).unwrap();
        std::fs::create_dir_all(net.join("vlan10/lower_bond0")).unwrap();
        std::fs::create_dir_all(net.join("lo")).unwrap();
        std::fs::create_dir_all(net.join("dummy0")).unwrap();
        std::fs::create_dir_all(net.join("eth1/device")).unwrap();
        std::fs::write(net.join("eth1/device/numa_node"), "-1\n").unwrap();
        assert_eq!(if_node_in(&net, "eth0", 0), Some(1));
        assert_eq!(if_node_in(&net, "bond0", 0), Some(1));
        assert_eq!(if_node_in(&net, "vlan10", 0), Some(1));
        assert_eq!(if_node_in(&net, "lo", 0), None);
        assert_eq!(if_node_in(&net, "dummy0", 0), None);
        assert_eq!(if_node_in(&net, "eth1", 0), None);
        assert_eq!(if_node_in(&net, "absent0", 0), None);
        // A lower_ loop (impossible in a real sysfs) ends at the depth limit.
        std::fs::create_dir_all(net.join("a/lower_b")).unwrap();
        std::fs::create_dir_all(net.join("b/lower_a")).unwrap();
        assert_eq!(if_node_in(&net, "a", 0), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
