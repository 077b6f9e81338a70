//! [`CuttableNetns`]: a network namespace for one process of a test (a gateway group member)
//! whose path to the services on 127.0.0.1 (the suite's Ceph cluster) goes over its own veth
//! pair, which the test can cut and heal, while a second veth pair carries the process's own
//! listeners (NVMe/TCP, metrics) to the rest of the test. A cut is a real partition: the
//! cluster link's far end goes down, so the kernel drops what the process sends (TCP keeps
//! retransmitting; nothing is refused or reset); healed, the held connections resume.
//!
//! Inside the namespace the loopback device stays down and 127.0.0.1/32 is routed over the
//! cluster link (with `route_localnet` on both of its ends, so the kernel accepts loopback
//! addresses there). Needs root and iproute2 (`ip netns`, veth). Removed on drop.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::process::run_bounded;
use crate::text;

/// A namespace with a cuttable link to 127.0.0.1 and a link for its listeners (see the top
/// comment).
pub struct CuttableNetns {
    name: String,
    /// The root namespace's end of the cluster link (what [`CuttableNetns::cut`] downs).
    cluster_root: String,
    /// The root namespace's end of the listener link.
    listen_root: String,
    /// The namespace's address on the listener link.
    addr: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    let out = run_bounded(cmd, Duration::from_secs(20));
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}{}",
            args.join(" "),
            text(&out.stdout),
            text(&out.stderr)
        ))
    }
}

impl CuttableNetns {
    /// Makes the namespace and both links. Distinct per test process and per call, so tests
    /// running in parallel do not meet.
    pub fn new() -> Result<CuttableNetns, String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst) % 64;
        let pid = std::process::id();
        // Interface names are at most 15 bytes: "nvc" + 5 + 2 + 1.
        let tag = format!("{:05}{n:02}", pid % 100_000);
        let name = format!("nvmftest-{tag}");
        // 10.A.B.0/29: the cluster link is .1/.2, the listener link .5/.6.
        let a = 100 + pid % 100;
        let b = ((pid / 100) % 4) * 64 + n;
        let net = format!("10.{a}.{b}");
        let me = CuttableNetns {
            cluster_root: format!("nvc{tag}a"),
            listen_root: format!("nvl{tag}a"),
            addr: format!("{net}.6"),
            name,
        };
        // Leftovers of a killed run with the same names go first.
        let _ = ip(&["netns", "del", &me.name]);
        let _ = ip(&["link", "del", &me.cluster_root]);
        let _ = ip(&["link", "del", &me.listen_root]);
        me.build(&net, &tag)?;
        Ok(me)
    }

    fn build(&self, net: &str, tag: &str) -> Result<(), String> {
        let ns = self.name.as_str();
        let cl_in = format!("nvc{tag}b");
        let li_in = format!("nvl{tag}b");
        ip(&["netns", "add", ns])?;
        for (root, inner, root_ip, in_ip) in [
            (
                &self.cluster_root,
                &cl_in,
                format!("{net}.1/30"),
                format!("{net}.2/30"),
            ),
            (
                &self.listen_root,
                &li_in,
                format!("{net}.5/30"),
                format!("{net}.6/30"),
            ),
        ] {
            ip(&["link", "add", root, "type", "veth", "peer", "name", inner])?;
            ip(&["link", "set", inner, "netns", ns])?;
            ip(&["addr", "add", &root_ip, "dev", root])?;
            ip(&["link", "set", root, "up"])?;
            ip(&["-n", ns, "addr", "add", &in_ip, "dev", inner])?;
            ip(&["-n", ns, "link", "set", inner, "up"])?;
        }
        sysctl(
            None,
            &format!("net.ipv4.conf.{}.route_localnet=1", self.cluster_root),
        )?;
        sysctl(Some(ns), &format!("net.ipv4.conf.{cl_in}.route_localnet=1"))?;
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            "127.0.0.1/32",
            "via",
            &format!("{net}.1"),
            "src",
            &format!("{net}.2"),
        ])
    }

    /// The namespace's name (`ip netns exec NAME ...`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's address on the listener link: where its listeners bind, and what the
    /// rest of the test connects to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Cuts (`true`) or heals (`false`) the namespace's link to 127.0.0.1.
    pub fn cut(&self, on: bool) -> Result<(), String> {
        ip(&[
            "link",
            "set",
            &self.cluster_root,
            if on { "down" } else { "up" },
        ])
    }
}

fn sysctl(ns: Option<&str>, setting: &str) -> Result<(), String> {
    let cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "sysctl", "-qw", setting]);
            c
        }
        None => {
            let mut c = Command::new("sysctl");
            c.args(["-qw", setting]);
            c
        }
    };
    let out = run_bounded(cmd, Duration::from_secs(20));
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("sysctl {setting}: {}", text(&out.stderr)))
    }
}

impl Drop for CuttableNetns {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth ends in it, and with them their peers.
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.cluster_root]);
        let _ = ip(&["link", "del", &self.listen_root]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A process in the namespace reaches a listener on 127.0.0.1; cut, it does not (its
    /// connection attempt times out: dropped, not refused); healed, it does again.
    #[test]
    fn reaches_loopback_until_cut_and_again_when_healed() {
        let n = CuttableNetns::new().unwrap_or_else(|e| panic!("{e}"));
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut s, _) = l.accept().unwrap();
                s.write_all(b"hi").unwrap();
            }
        });
        let probe = |limit: u32| {
            let script = format!(
                "import socket;s=socket.create_connection(('127.0.0.1',{port}),timeout={limit});print(s.recv(2).decode())"
            );
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", n.name(), "python3", "-c", &script]);
            run_bounded(cmd, Duration::from_secs(20))
        };
        let out = probe(5);
        assert_eq!(text(&out.stdout).trim(), "hi", "{}", text(&out.stderr));
        n.cut(true).unwrap();
        let out = probe(2);
        assert!(!out.status.success(), "reached 127.0.0.1 while cut");
        assert!(
            text(&out.stderr).contains("timed out"),
            "a cut must drop, not refuse: {}",
            text(&out.stderr)
        );
        n.cut(false).unwrap();
        let out = probe(5);
        assert_eq!(text(&out.stdout).trim(), "hi", "{}", text(&out.stderr));
        server.join().unwrap();
        // And the namespace's listener address is reachable from here.
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            n.name(),
            "python3",
            "-c",
            &format!(
                "import socket;l=socket.socket();l.bind(('{}',0));l.listen();print(l.getsockname()[1],flush=True);c,_=l.accept();c.send(b'ok')",
                n.addr()
            ),
        ]);
        cmd.stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        {
            use std::io::BufRead;
            let mut r = std::io::BufReader::new(child.stdout.as_mut().unwrap());
            r.read_line(&mut line).unwrap();
        }
        let p: u16 = line.trim().parse().unwrap();
        let mut s = std::net::TcpStream::connect((n.addr(), p)).unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        assert_eq!(got, "ok");
        child.wait().unwrap();
    }
}
