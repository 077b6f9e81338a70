//! Placement of the initiator for a target address: the interface that
//! routes to it, that interface's NUMA node and the node's CPUs, the cores
//! another process keeps busy, and the CPUs the initiator would be pinned
//! to, with the warnings a benchmark report must carry (off-node, busy
//! core, no NUMA information).
//!
//! Everything is read under an injectable root ([`Host::at`]): `proc/net/
//! route`, `proc/net/ipv6_route`, `proc/stat`, `sys/class/net/IF/device/
//! numa_node`, `sys/devices/system/node/nodeN/cpulist`,
//! `sys/devices/system/cpu/online`; so the unit tests run on fake trees.
//! Also the cpulist syntax ("0-3,8-11"), shared with `nvmf perf --cores`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

/// A core busier than this (fraction of a /proc/stat sample) is flagged.
pub const BUSY_THRESHOLD: f64 = 0.5;
/// Default /proc/stat sample length.
pub const DEFAULT_SAMPLE: Duration = Duration::from_millis(250);

/// Largest CPU number accepted (the kernel's NR_CPUS limit is 8192).
pub const MAX_CPU: usize = 8191;

/// Parse a Linux cpulist ("0-3,8-11", "5", "") into CPU numbers, in order.
pub fn parse_cpulist(s: &str) -> Result<Vec<usize>, String> {
    let mut v = Vec::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("'{part}' is not a CPU number or range (e.g. 0,2 or 0-3)");
        if let Some((a, b)) = part.split_once('-') {
            let a: usize = a.trim().parse().map_err(|_| bad())?;
            let b: usize = b.trim().parse().map_err(|_| bad())?;
            if a > b || b > MAX_CPU {
                return Err(bad());
            }
            v.extend(a..=b);
        } else {
            let c: usize = part.parse().map_err(|_| bad())?;
            if c > MAX_CPU {
                return Err(bad());
            }
            v.push(c);
        }
    }
    Ok(v)
}

/// Print CPU numbers as a cpulist ("0-3,8").
pub fn format_cpulist(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", cpus[i], cpus[j])
        } else {
            cpus[i].to_string()
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

/// Where to read the machine from.
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
    /// Does this address belong to this host (then traffic goes over `lo`)?
    is_local: fn(IpAddr) -> bool,
}

/// An address is ours when a socket can bind to it.
fn bindable(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

fn never_local(_: IpAddr) -> bool {
    false
}

impl Host {
    /// The running system (`/`).
    pub fn system() -> Host {
        Host {
            root: PathBuf::from("/"),
            is_local: bindable,
        }
    }

    /// A fake tree under `root` (`root/proc/...`, `root/sys/...`); no
    /// address counts as local except loopback.
    pub fn at(root: impl Into<PathBuf>) -> Host {
        Host {
            root: root.into(),
            is_local: never_local,
        }
    }

    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel)).ok()
    }

    /// The interface the kernel would send traffic for `ip` out of:
    /// loopback and local addresses go over `lo`; otherwise the longest
    /// matching prefix of the main routing table (lowest metric on a tie).
    pub fn route_interface(&self, ip: IpAddr) -> Option<String> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        if ip.is_loopback() || (self.is_local)(ip) {
            return Some("lo".into());
        }
        match ip {
            IpAddr::V4(a) => best_route_v4(&self.read("proc/net/route")?, a),
            IpAddr::V6(a) => best_route_v6(&self.read("proc/net/ipv6_route")?, a),
        }
    }

    /// The NUMA node of interface `ifname`'s device; a stacked interface
    /// (VLAN, bond) without a device of its own takes the first of its
    /// `lower_*` interfaces' that has one (at most 4 levels). None: virtual
    /// interface, no device, or the kernel reports -1.
    pub fn if_numa_node(&self, ifname: &str) -> Option<u32> {
        self.if_numa_node_depth(ifname, 0)
    }

    fn if_numa_node_depth(&self, ifname: &str, depth: usize) -> Option<u32> {
        if let Some(s) = self.read(&format!("sys/class/net/{ifname}/device/numa_node")) {
            if let Some(n) = s
                .trim()
                .parse::<i64>()
                .ok()
                .and_then(|v| u32::try_from(v).ok())
            {
                return Some(n);
            }
        }
        if depth >= 4 {
            return None;
        }
        let dir = std::fs::read_dir(self.root.join("sys/class/net").join(ifname)).ok()?;
        let mut lower: Vec<String> = dir
            .flatten()
            .filter_map(|e| Some(e.file_name().to_str()?.strip_prefix("lower_")?.to_string()))
            .collect();
        lower.sort();
        lower
            .iter()
            .find_map(|l| self.if_numa_node_depth(l, depth + 1))
    }

    /// The CPUs of NUMA node `node`.
    pub fn node_cpus(&self, node: u32) -> Option<Vec<usize>> {
        parse_cpulist(&self.read(&format!("sys/devices/system/node/node{node}/cpulist"))?).ok()
    }

    /// All NUMA nodes with their CPUs (empty when sysfs has no node dirs).
    pub fn nodes(&self) -> Vec<(u32, Vec<usize>)> {
        let Ok(dir) = std::fs::read_dir(self.root.join("sys/devices/system/node")) else {
            return Vec::new();
        };
        let mut v: Vec<(u32, Vec<usize>)> = dir
            .flatten()
            .filter_map(|e| {
                let n: u32 = e.file_name().to_str()?.strip_prefix("node")?.parse().ok()?;
                Some((n, self.node_cpus(n)?))
            })
            .collect();
        v.sort();
        v
    }

    /// The online CPUs (`sys/devices/system/cpu/online`; else 0..N by
    /// available_parallelism).
    pub fn online_cpus(&self) -> Vec<usize> {
        self.read("sys/devices/system/cpu/online")
            .and_then(|s| parse_cpulist(&s).ok())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| {
                (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
            })
    }

    /// The `proc/stat` text (one sample for [`busy_cores`]).
    pub fn stat(&self) -> Option<String> {
        self.read("proc/stat")
    }

    /// Cores busier than [`BUSY_THRESHOLD`] over a sample of `dur`.
    pub fn sample_busy(&self, dur: Duration) -> Vec<(usize, f64)> {
        let Some(a) = self.stat() else {
            return Vec::new();
        };
        std::thread::sleep(dur);
        let Some(b) = self.stat() else {
            return Vec::new();
        };
        busy_cores(&a, &b)
    }
}

fn hex_u32(s: &str) -> Option<u32> {
    u32::from_str_radix(s, 16).ok()
}

const RTF_UP: u32 = 0x0001;
const RTF_REJECT: u32 = 0x0200;

/// Best IPv4 route from `/proc/net/route` text (addresses are the raw
/// network-order words printed in host order, as the kernel does).
fn best_route_v4(text: &str, ip: Ipv4Addr) -> Option<String> {
    let ip = u32::from_ne_bytes(ip.octets());
    let mut best: Option<(u32, u32, String)> = None; // (prefix len, metric, iface)
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let (Some(dest), Some(flags), Ok(metric), Some(mask)) = (
            hex_u32(f[1]),
            hex_u32(f[3]),
            f[6].parse::<u32>(),
            hex_u32(f[7]),
        ) else {
            continue;
        };
        if flags & RTF_UP == 0 || flags & RTF_REJECT != 0 || ip & mask != dest & mask {
            continue;
        }
        let plen = mask.count_ones();
        if best
            .as_ref()
            .is_none_or(|(bl, bm, _)| plen > *bl || (plen == *bl && metric < *bm))
        {
            best = Some((plen, metric, f[0].to_string()));
        }
    }
    best.map(|b| b.2)
}

/// Best IPv6 route from `/proc/net/ipv6_route` text.
fn best_route_v6(text: &str, ip: Ipv6Addr) -> Option<String> {
    let ip = u128::from_be_bytes(ip.octets());
    let mut best: Option<(u32, u32, String)> = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let (Ok(dest), Ok(plen), Some(metric), Some(flags)) = (
            u128::from_str_radix(f[0], 16),
            u32::from_str_radix(f[1], 16),
            hex_u32(f[5]),
            hex_u32(f[8]),
        ) else {
            continue;
        };
        if flags & RTF_UP == 0 || flags & RTF_REJECT != 0 || plen > 128 {
            continue;
        }
        let mask = if plen == 0 {
            0
        } else {
            u128::MAX << (128 - plen)
        };
        if ip & mask != dest & mask {
            continue;
        }
        if best
            .as_ref()
            .is_none_or(|(bl, bm, _)| plen > *bl || (plen == *bl && metric < *bm))
        {
            best = Some((plen, metric, f[9].to_string()));
        }
    }
    best.map(|b| b.2)
}

/// Per-core busy fraction between two `/proc/stat` samples, for cores
/// busier than [`BUSY_THRESHOLD`] (busy = everything but idle and iowait).
pub fn busy_cores(before: &str, after: &str) -> Vec<(usize, f64)> {
    fn parse(s: &str) -> Vec<(usize, u64, u64)> {
        s.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let cpu: usize = f.next()?.strip_prefix("cpu")?.parse().ok()?;
                let v: Vec<u64> = f.filter_map(|x| x.parse().ok()).collect();
                let total: u64 = v.iter().take(8).sum(); // guest time is inside user
                let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
                Some((cpu, total, idle))
            })
            .collect()
    }
    let a = parse(before);
    let mut out = Vec::new();
    for (cpu, total, idle) in parse(after) {
        let Some(&(_, t0, i0)) = a.iter().find(|x| x.0 == cpu) else {
            continue;
        };
        let dt = total.saturating_sub(t0);
        if dt == 0 {
            continue;
        }
        let busy = 1.0 - idle.saturating_sub(i0) as f64 / dt as f64;
        if busy > BUSY_THRESHOLD {
            out.push((cpu, busy));
        }
    }
    out
}

/// The placement found for one target address.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub addr: String,
    /// Interface that routes to `addr` (None: no route found).
    pub interface: Option<String>,
    /// Its NUMA node (None: no NUMA information).
    pub node: Option<u32>,
    /// The node's CPUs (all online CPUs when there is no node).
    pub cpus: Vec<usize>,
    /// Cores busier than the threshold, with their busy fraction.
    pub busy: Vec<(usize, f64)>,
    /// The CPUs the initiator would be pinned to.
    pub pin: Vec<usize>,
    pub warnings: Vec<String>,
}

/// Place an initiator that needs `want` CPUs (one per queue) for a target
/// at `addr`, given the cores found busy.
pub fn place(host: &Host, addr: &str, want: usize, busy: &[(usize, f64)]) -> Placement {
    let want = want.max(1);
    let mut warnings = Vec::new();
    let ip: Option<IpAddr> = addr.parse().ok();
    let interface = ip.and_then(|ip| host.route_interface(ip));
    if interface.is_none() {
        warnings.push(format!("no route to {addr} found: placement unknown"));
    }
    let node = interface.as_deref().and_then(|i| host.if_numa_node(i));
    let node_cpus = node
        .and_then(|n| host.node_cpus(n))
        .filter(|c| !c.is_empty());
    let all = host.online_cpus();
    let cpus = match (&interface, node, &node_cpus) {
        (_, Some(_), Some(c)) => c.clone(),
        (Some(i), Some(n), None) => {
            warnings.push(format!(
                "{i} is on NUMA node {n}, which has no CPUs listed: using all CPUs"
            ));
            all.clone()
        }
        (Some(i), None, _) => {
            warnings.push(format!(
                "no NUMA information for {i} (virtual interface, or the device reports none): any CPU"
            ));
            all.clone()
        }
        _ => all.clone(),
    };
    let is_busy = |c: &usize| busy.iter().any(|b| b.0 == *c);
    // Free CPUs of the node first, then free CPUs elsewhere, then busy ones.
    let mut order: Vec<usize> = cpus.iter().copied().filter(|c| !is_busy(c)).collect();
    let off: Vec<usize> = all
        .iter()
        .copied()
        .filter(|c| !cpus.contains(c) && !is_busy(c))
        .collect();
    order.extend(&off);
    order.extend(cpus.iter().copied().filter(is_busy));
    order.extend(
        all.iter()
            .copied()
            .filter(|c| !cpus.contains(c) && is_busy(c)),
    );
    let pin: Vec<usize> = order.into_iter().take(want).collect();
    if pin.len() < want {
        warnings.push(format!(
            "{want} queues but only {} CPUs: threads will share CPUs",
            pin.len()
        ));
    }
    let off_node: Vec<usize> = pin.iter().copied().filter(|c| !cpus.contains(c)).collect();
    if let (Some(n), false) = (node, off_node.is_empty()) {
        warnings.push(format!(
            "OFF-NODE: CPUs {} are not on the NIC's NUMA node {n} (its free CPUs: {})",
            format_cpulist(&off_node),
            format_cpulist(
                &cpus
                    .iter()
                    .copied()
                    .filter(|c| !is_busy(c))
                    .collect::<Vec<_>>()
            )
        ));
    }
    for (c, f) in busy {
        if pin.contains(c) {
            warnings.push(format!(
                "BUSY CORE: CPU {c} is {:.0}% busy with other work and the initiator is pinned to it",
                f * 100.0
            ));
        } else if cpus.contains(c) {
            warnings.push(format!(
                "busy core: CPU {c} of this node is {:.0}% busy with other work (avoided)",
                f * 100.0
            ));
        }
    }
    Placement {
        addr: addr.to_string(),
        interface,
        node,
        cpus,
        busy: busy.to_vec(),
        pin,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(
            parse_cpulist("0-3,8-11\n").unwrap(),
            [0, 1, 2, 3, 8, 9, 10, 11]
        );
        assert_eq!(parse_cpulist("5").unwrap(), [5]);
        assert_eq!(parse_cpulist("").unwrap(), Vec::<usize>::new());
        assert!(parse_cpulist("3-1").is_err());
        assert!(parse_cpulist("0-99999999999").is_err());
        assert!(parse_cpulist("8192").is_err());
        assert!(parse_cpulist("a").unwrap_err().contains("'a'"));
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[]), "none");
    }

    fn v4hex(a: [u8; 4]) -> String {
        format!("{:08X}", u32::from_ne_bytes(a))
    }

    /// Two NUMA nodes (CPUs 0-3 and 4-7), eth0 on node 1 for 10.0.0.0/24,
    /// eth1 (node 0) the default route (eth9 a worse one), a virtual tun0
    /// for 10.9.0.0/16, a route that is down.
    fn fake_tree(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("nvmf-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let w = |rel: &str, text: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        let z = v4hex([0, 0, 0, 0]);
        w(
            "proc/net/route",
            &format!(
                "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
                 eth1\t{z}\t{}\t0003\t0\t0\t100\t{z}\t0\t0\t0\n\
                 eth0\t{}\t{z}\t0001\t0\t0\t0\t{}\t0\t0\t0\n\
                 tun0\t{}\t{z}\t0001\t0\t0\t0\t{}\t0\t0\t0\n\
                 down0\t{}\t{z}\t0000\t0\t0\t0\t{}\t0\t0\t0\n\
                 eth9\t{z}\t{z}\t0001\t0\t0\t200\t{z}\t0\t0\t0\n",
                v4hex([192, 168, 1, 1]),
                v4hex([10, 0, 0, 0]),
                v4hex([255, 255, 255, 0]),
                v4hex([10, 9, 0, 0]),
                v4hex([255, 255, 0, 0]),
                v4hex([10, 0, 0, 0]),
                v4hex([255, 255, 255, 255]),
            ),
        );
        w(
            "proc/net/ipv6_route",
            "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
             00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n",
        );
        w("sys/class/net/eth0/device/numa_node", "1\n");
        w("sys/class/net/eth1/device/numa_node", "0\n");
        std::fs::create_dir_all(root.join("sys/class/net/tun0")).unwrap();
        // vlan10 on bond0 on eth0 (links only; no device of their own).
        std::fs::create_dir_all(root.join("sys/class/net/bond0/lower_eth0")).unwrap();
        std::fs::create_dir_all(root.join("sys/class/net/vlan10/lower_bond0")).unwrap();
        w("sys/devices/system/node/node0/cpulist", "0-3\n");
        w("sys/devices/system/node/node1/cpulist", "4-7\n");
        w("sys/devices/system/cpu/online", "0-7\n");
        root
    }

    #[test]
    fn routes_from_a_fake_proc() {
        let root = fake_tree("route");
        let h = Host::at(&root);
        let r = |a: &str| h.route_interface(a.parse().unwrap());
        assert_eq!(r("10.0.0.7").as_deref(), Some("eth0"));
        assert_eq!(r("10.9.3.3").as_deref(), Some("tun0"));
        assert_eq!(r("8.8.8.8").as_deref(), Some("eth1"));
        assert_eq!(r("127.0.0.1").as_deref(), Some("lo"));
        assert_eq!(r("::ffff:127.0.0.1").as_deref(), Some("lo"));
        assert_eq!(r("::1").as_deref(), Some("lo"));
        assert_eq!(r("fd00::5").as_deref(), Some("eth0"));
        // Only a reject route matches: none.
        assert_eq!(r("2001:db8::1"), None);
        assert_eq!(h.if_numa_node("eth0"), Some(1));
        assert_eq!(h.if_numa_node("tun0"), None);
        assert_eq!(h.if_numa_node("vlan10"), Some(1));
        assert_eq!(h.if_numa_node("absent0"), None);
        // A lower_ loop (impossible in a real sysfs) ends at the depth limit.
        std::fs::create_dir_all(root.join("sys/class/net/a/lower_b")).unwrap();
        std::fs::create_dir_all(root.join("sys/class/net/b/lower_a")).unwrap();
        assert_eq!(h.if_numa_node("a"), None);
        assert_eq!(
            h.nodes(),
            vec![(0, vec![0, 1, 2, 3]), (1, vec![4, 5, 6, 7])]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn placement_on_a_two_node_machine() {
        let root = fake_tree("place");
        let h = Host::at(&root);
        // NIC on node 1: pinned to node 1's CPUs, no warning.
        let p = place(&h, "10.0.0.7", 2, &[]);
        assert_eq!((p.interface.as_deref(), p.node), (Some("eth0"), Some(1)));
        assert_eq!(p.cpus, [4, 5, 6, 7]);
        assert_eq!(p.pin, [4, 5]);
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        // CPU 4 busy: avoided and reported.
        let p = place(&h, "10.0.0.7", 2, &[(4, 0.9)]);
        assert_eq!(p.pin, [5, 6]);
        assert!(p
            .warnings
            .iter()
            .any(|w| w.contains("CPU 4") && w.contains("90%")));
        // More queues than the node has free CPUs: off-node, said loudly.
        let p = place(&h, "10.0.0.7", 5, &[(4, 0.9)]);
        assert_eq!(p.pin, [5, 6, 7, 0, 1]);
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("OFF-NODE") && w.contains("0-1")),
            "{:?}",
            p.warnings
        );
        // Every CPU needed: the busy one is used and flagged.
        let p = place(&h, "10.0.0.7", 8, &[(4, 0.9)]);
        assert!(
            p.warnings.iter().any(|w| w.starts_with("BUSY CORE: CPU 4")),
            "{:?}",
            p.warnings
        );
        // Virtual interface and loopback: no NUMA information, any CPU.
        for a in ["10.9.0.1", "127.0.0.1"] {
            let p = place(&h, a, 1, &[]);
            assert_eq!(p.node, None);
            assert_eq!(p.cpus, (0..8).collect::<Vec<_>>());
            assert!(
                p.warnings.iter().any(|w| w.contains("no NUMA information")),
                "{:?}",
                p.warnings
            );
        }
        // NIC on node 0 (default route).
        assert_eq!(place(&h, "8.8.8.8", 1, &[]).pin, [0]);
        // A missing numa_node file reads as no information.
        std::fs::remove_file(root.join("sys/class/net/eth0/device/numa_node")).unwrap();
        assert_eq!(place(&h, "10.0.0.7", 1, &[]).node, None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn busy_cores_from_two_samples() {
        let a = "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 0 0 0 100 0 0 0 0 0 0\ncpu1 0 0 0 100 0 0 0 0 0 0\ncpu2 0 0 0 100 0 0 0 0 0 0\nintr 5\n";
        let b = "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 90 0 0 110 0 0 0 0 0 0\ncpu1 10 0 0 190 0 0 0 0 0 0\ncpu2 0 0 0 100 0 0 0 0 0 0\n";
        let busy = busy_cores(a, b);
        assert_eq!(busy.len(), 1);
        assert_eq!(busy[0].0, 0);
        assert!((busy[0].1 - 0.9).abs() < 1e-9);
        // The running system has a /proc/stat.
        let _ = Host::system().stat().unwrap();
    }
}
