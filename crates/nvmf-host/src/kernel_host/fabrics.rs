//! kernel_host/fabrics.rs — connecting the Linux kernel host: the option string nvme-cli
//! (libnvme 1.3) writes to `/dev/nvme-fabrics`, in its order and with its defaults, the write
//! itself, and reading back the controller instance (`instance=N,cntlid=M`). Also finds a
//! controller that is already connected to the same place, so a second connect is a no-op.

use super::KController;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::Path;

/// `ctrl_loss_tmo` nvme-cli passes when none is given (seconds).
pub const DEFAULT_CTRL_LOSS_TMO: i32 = 600;

/// What one kernel connect asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectParams {
    /// `tcp` or `rdma`.
    pub transport: String,
    pub traddr: String,
    pub trsvcid: String,
    /// The subsystem NQN.
    pub nqn: String,
    pub hostnqn: Option<String>,
    pub hostid: Option<String>,
    pub host_traddr: Option<String>,
    pub host_iface: Option<String>,
    pub nr_io_queues: Option<u32>,
    pub keep_alive_tmo: Option<u32>,
    pub reconnect_delay: Option<u32>,
    /// Seconds; -1 = reconnect forever. `None`: nvme-cli's default (600).
    pub ctrl_loss_tmo: Option<i32>,
}

impl ConnectParams {
    /// Refuses values the kernel's option parser would split or misread (a `,` or `=` or a
    /// line break would smuggle in another option), empty required fields and bad numbers.
    pub fn validate(&self) -> Result<()> {
        if !matches!(self.transport.as_str(), "tcp" | "rdma") {
            bail!(
                "transport '{}' is not supported (tcp or rdma)",
                self.transport
            );
        }
        for (name, v) in [
            ("traddr", Some(&self.traddr)),
            ("trsvcid", Some(&self.trsvcid)),
            ("nqn", Some(&self.nqn)),
            ("hostnqn", self.hostnqn.as_ref()),
            ("hostid", self.hostid.as_ref()),
            ("host-traddr", self.host_traddr.as_ref()),
            ("host-iface", self.host_iface.as_ref()),
        ] {
            let Some(v) = v else { continue };
            if v.is_empty() {
                bail!("{name} is empty");
            }
            if let Some(c) = v
                .chars()
                .find(|c| matches!(c, ',' | '=' | '\n' | '\r') || c.is_whitespace())
            {
                bail!("{name} '{v}' contains {c:?}, which the kernel's option string cannot carry");
            }
        }
        if self.trsvcid.parse::<u16>().is_err() {
            bail!("trsvcid '{}' is not a port number (1-65535)", self.trsvcid);
        }
        for (name, v) in [("nqn", Some(&self.nqn)), ("hostnqn", self.hostnqn.as_ref())] {
            if let Some(v) = v {
                if v.len() > 223 {
                    bail!("{name} is {} bytes long; an NQN has at most 223", v.len());
                }
            }
        }
        if let Some(id) = &self.hostid {
            if uuid::Uuid::try_parse(id).is_err() {
                bail!("hostid '{id}' is not a UUID");
            }
        }
        if let Some(t) = self.ctrl_loss_tmo {
            if t < -1 {
                bail!("ctrl-loss-tmo {t}: seconds, or -1 for reconnecting forever");
            }
        }
        Ok(())
    }

    /// The string nvme-cli writes to `/dev/nvme-fabrics` for these parameters: `nqn=` first,
    /// then libnvme's order; unset numbers are left out, `ctrl_loss_tmo` defaults to 600.
    pub fn option_string(&self) -> String {
        let mut s = format!("nqn={}", self.nqn);
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                s.push_str(&format!(",{k}={v}"));
            }
        };
        add("transport", Some(self.transport.clone()));
        add("traddr", Some(self.traddr.clone()));
        add("host_traddr", self.host_traddr.clone());
        add("host_iface", self.host_iface.clone());
        add("trsvcid", Some(self.trsvcid.clone()));
        add("hostnqn", self.hostnqn.clone());
        add("hostid", self.hostid.clone());
        // libnvme leaves out zeros (the kernel's defaults)
        let nz = |v: Option<u32>| v.filter(|&n| n > 0).map(|n| n.to_string());
        add("nr_io_queues", nz(self.nr_io_queues));
        add("keep_alive_tmo", nz(self.keep_alive_tmo));
        add("reconnect_delay", nz(self.reconnect_delay));
        add(
            "ctrl_loss_tmo",
            Some(
                self.ctrl_loss_tmo
                    .unwrap_or(DEFAULT_CTRL_LOSS_TMO)
                    .to_string(),
            ),
        );
        s
    }

    /// Whether `c` is a live controller to the same place (subsystem, transport, address,
    /// port and, when given, host address) — nvme-cli's "already connected".
    pub fn matches(&self, c: &KController) -> bool {
        c.subsysnqn == self.nqn
            && c.transport == self.transport
            && c.traddr.as_deref() == Some(self.traddr.as_str())
            && c.trsvcid.as_deref() == Some(self.trsvcid.as_str())
            && self
                .host_traddr
                .as_ref()
                .is_none_or(|h| c.host_traddr.as_deref() == Some(h.as_str()))
            && self
                .host_iface
                .as_ref()
                .is_none_or(|h| c.host_iface.as_deref() == Some(h.as_str()))
            && c.state != "deleting"
    }
}

/// The controller instance in the kernel's answer (`instance=3,cntlid=1`).
pub fn parse_instance(answer: &str) -> Option<u32> {
    answer
        .split([',', '\n'])
        .find_map(|kv| kv.trim().strip_prefix("instance=")?.parse().ok())
}

/// Writes `options` to the fabrics device `dev` (`/dev/nvme-fabrics`) in one write, as libnvme
/// does, and returns the new controller's name (`nvmeN`). The kernel connects synchronously:
/// an error here is the connect's error.
pub fn kernel_connect(dev: &Path, options: &str) -> Result<String> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::ENOENT) => " (load the module: modprobe nvme-fabrics)",
                Some(libc::EACCES) | Some(libc::EPERM) => " (connecting needs root)",
                _ => "",
            };
            anyhow::anyhow!("opening {}: {e}{hint}", dev.display())
        })?;
    match f.write(options.as_bytes()) {
        Ok(n) if n == options.len() => {}
        Ok(n) => bail!(
            "{} took {n} of {} bytes of '{options}'",
            dev.display(),
            options.len()
        ),
        Err(e) => {
            let why = match e.raw_os_error() {
                Some(libc::EALREADY) => "already connected (the kernel refuses a duplicate controller)",
                Some(libc::EINVAL) => {
                    "the kernel rejected the options (is the transport module loaded? `modprobe nvme-tcp` / `modprobe nvme-rdma`; dmesg names the option)"
                }
                Some(libc::ECONNREFUSED) => "connection refused: nothing listens at that address and port",
                Some(libc::ETIMEDOUT) | Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => {
                    "the target did not answer (address, route, firewall?)"
                }
                Some(libc::EADDRINUSE) => "the address is in use",
                Some(libc::ENODEV) => "no such device (transport module or RDMA device missing?)",
                Some(libc::EIO) | Some(libc::EPROTO) => {
                    "the target refused the connect (host NQN not allowed, wrong subsystem NQN, or authentication; see dmesg)"
                }
                _ => "see dmesg for the kernel's reason",
            };
            bail!("connect ({options}) failed: {e}: {why}");
        }
    }
    let mut buf = vec![0u8; 4096];
    let n = f
        .read(&mut buf)
        .with_context(|| format!("reading the answer from {}", dev.display()))?;
    let answer = String::from_utf8_lossy(&buf[..n]);
    let instance = parse_instance(&answer).with_context(|| {
        format!(
            "{} answered '{}', with no instance=N",
            dev.display(),
            answer.trim()
        )
    })?;
    Ok(format!("nvme{instance}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> ConnectParams {
        ConnectParams {
            transport: "tcp".into(),
            traddr: "10.0.0.1".into(),
            trsvcid: "4420".into(),
            nqn: "nqn.2016-06.io.spdk:cnode1".into(),
            hostnqn: Some(
                "nqn.2014-08.org.nvmexpress:uuid:0e3a8e02-1c21-4f5b-9e3a-1d2c3b4a5f60".into(),
            ),
            hostid: Some("0e3a8e02-1c21-4f5b-9e3a-1d2c3b4a5f60".into()),
            ..Default::default()
        }
    }

    #[test]
    fn option_string_is_nvme_clis() {
        assert_eq!(
            base().option_string(),
            "nqn=nqn.2016-06.io.spdk:cnode1,transport=tcp,traddr=10.0.0.1,trsvcid=4420,\
             hostnqn=nqn.2014-08.org.nvmexpress:uuid:0e3a8e02-1c21-4f5b-9e3a-1d2c3b4a5f60,\
             hostid=0e3a8e02-1c21-4f5b-9e3a-1d2c3b4a5f60,ctrl_loss_tmo=600"
        );
        let mut p = base();
        p.hostid = None;
        p.host_traddr = Some("10.0.0.2".into());
        p.nr_io_queues = Some(4);
        p.keep_alive_tmo = Some(5);
        p.reconnect_delay = Some(2);
        p.ctrl_loss_tmo = Some(-1);
        assert_eq!(
            p.option_string(),
            "nqn=nqn.2016-06.io.spdk:cnode1,transport=tcp,traddr=10.0.0.1,host_traddr=10.0.0.2,\
             trsvcid=4420,hostnqn=nqn.2014-08.org.nvmexpress:uuid:0e3a8e02-1c21-4f5b-9e3a-1d2c3b4a5f60,\
             nr_io_queues=4,keep_alive_tmo=5,reconnect_delay=2,ctrl_loss_tmo=-1"
        );
    }

    #[test]
    fn validation_refuses_smuggled_options() {
        assert!(base().validate().is_ok());
        let mut p = base();
        p.traddr = "10.0.0.1,hostnqn=evil".into();
        assert!(p.validate().unwrap_err().to_string().contains("traddr"));
        let mut p = base();
        p.trsvcid = "44x".into();
        assert!(p.validate().is_err());
        let mut p = base();
        p.transport = "fc".into();
        assert!(p.validate().is_err());
        let mut p = base();
        p.hostid = Some("not-a-uuid".into());
        assert!(p.validate().is_err());
        let mut p = base();
        p.ctrl_loss_tmo = Some(-2);
        assert!(p.validate().is_err());
    }

    #[test]
    fn instance_from_answer() {
        assert_eq!(parse_instance("instance=3,cntlid=1\n"), Some(3));
        assert_eq!(parse_instance("cntlid=1"), None);
    }

    #[test]
    fn connect_through_a_fake_device() {
        // A regular file stands in for /dev/nvme-fabrics: it keeps what was written, and
        // reading after the write finds the end (no instance) -> a clear error, no panic.
        let d = std::env::temp_dir().join(format!("nvmf-fabrics-{}", std::process::id()));
        std::fs::write(&d, b"").unwrap();
        let e = kernel_connect(&d, &base().option_string()).unwrap_err();
        assert!(e.to_string().contains("no instance=N"), "{e}");
        assert_eq!(std::fs::read_to_string(&d).unwrap(), base().option_string());
        let _ = std::fs::remove_file(&d);
        let e = kernel_connect(Path::new("/nonexistent/nvme-fabrics"), "x").unwrap_err();
        assert!(e.to_string().contains("modprobe nvme-fabrics"), "{e}");
    }
}
