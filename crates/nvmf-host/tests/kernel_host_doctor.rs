//! `nvmf doctor` against fake sysfs and /etc trees in a temporary directory: a healthy host
//! (no warning, no error), then each check made to fail by one change to that tree (modules,
//! multipath, host NQN / host ID, iopolicy, controller state and timeouts, MTU of the paths'
//! interfaces, NUMA node, ANA states, the boot-time autoconnect unit), through the library
//! with a route table as a closure, and the CLI (`--sysfs-root`, `--etc-root`, `--json`, a
//! fake `ip`, exit status 0 / 1).

use nvmf_host::kernel_host::doctor::{self, Env, Finding, Severity};
use nvmf_testkit::TestDir;
use std::path::{Path, PathBuf};
use std::process::Command;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
const UUID: &str = "0e3a8e02-1c21-4f5b-9e3a-1d2c3b4a5f60";

/// A fake host: `<dir>/sys`, `<dir>/etc`, `<dir>/lib` (systemd units).
struct Tree {
    dir: TestDir,
}

impl Tree {
    fn sys(&self) -> PathBuf {
        self.dir.join("sys")
    }
    fn etc(&self) -> PathBuf {
        self.dir.join("etc")
    }
    fn units(&self) -> PathBuf {
        self.dir.join("lib/systemd/system")
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    fn remove(&self, rel: &str) {
        let p = self.dir.join(rel);
        if p.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }

    fn mkdir(&self, rel: &str) {
        std::fs::create_dir_all(self.dir.join(rel)).unwrap();
    }

    /// A controller `name` of subsystem `nvme-subsys0` at `traddr`:4420.
    fn controller(&self, name: &str, traddr: &str, src: &str) {
        let c = format!("sys/class/nvme/{name}");
        self.write(&format!("{c}/transport"), "tcp\n");
        self.write(
            &format!("{c}/address"),
            &format!("traddr={traddr},trsvcid=4420,src_addr={src}\n"),
        );
        self.write(&format!("{c}/subsysnqn"), &format!("{NQN}\n"));
        self.write(&format!("{c}/state"), "live\n");
        self.write(&format!("{c}/kato"), "5\n");
        self.write(&format!("{c}/ctrl_loss_tmo"), "600\n");
        self.write(&format!("{c}/reconnect_delay"), "10\n");
        self.mkdir(&format!("sys/class/nvme-subsystem/nvme-subsys0/{name}"));
    }

    /// The path `nvme0c<ctrl>n1` under controller `nvme<ctrl>` in ANA group 1.
    fn path(&self, ctrl: u32, state: &str) {
        let p = format!("sys/class/nvme/nvme{ctrl}/nvme0c{ctrl}n1");
        self.write(&format!("{p}/ana_state"), &format!("{state}\n"));
        self.write(&format!("{p}/ana_grpid"), "1\n");
        self.write(&format!("{p}/nsid"), "1\n");
    }

    fn net(&self, dev: &str, mtu: u32, node: i32) {
        self.write(&format!("sys/class/net/{dev}/mtu"), &format!("{mtu}\n"));
        self.write(
            &format!("sys/class/net/{dev}/device/numa_node"),
            &format!("{node}\n"),
        );
    }

    /// Everything in order: modules, multipath, a consistent host NQN / ID, one subsystem with
    /// two live paths over eth0 and eth1 (MTU 9000, node 0), round-robin, ANA optimized and
    /// non-optimized, a recorded connection and an enabled, fixed autoconnect unit.
    fn healthy() -> Tree {
        let t = Tree {
            dir: TestDir::new("doctor"),
        };
        for m in ["nvme_fabrics", "nvme_tcp", "nvme_rdma"] {
            t.mkdir(&format!("sys/module/{m}"));
        }
        t.write("sys/module/nvme_core/parameters/multipath", "Y\n");
        t.write(
            "etc/nvme/hostnqn",
            &format!("nqn.2014-08.org.nvmexpress:uuid:{UUID}\n"),
        );
        t.write("etc/nvme/hostid", &format!("{UUID}\n"));
        t.write(
            "sys/class/nvme-subsystem/nvme-subsys0/subsysnqn",
            &format!("{NQN}\n"),
        );
        t.write(
            "sys/class/nvme-subsystem/nvme-subsys0/iopolicy",
            "round-robin\n",
        );
        t.controller("nvme0", "10.0.0.1", "10.0.0.9");
        t.controller("nvme1", "10.0.1.1", "10.0.1.9");
        t.path(0, "optimized");
        t.path(1, "non-optimized");
        t.net("eth0", 9000, 0);
        t.net("eth1", 9000, 0);
        t.write("etc/nvme/config.json", "[]\n");
        t.write(
            "lib/systemd/system/nvmf-autoconnect.service",
            "[Unit]\nConditionPathExists=|/etc/nvme/config.json\n\
             ConditionPathExists=|/etc/nvme/discovery.conf\n[Service]\nExecStart=/usr/sbin/nvme connect-all\n",
        );
        t.write(
            "etc/systemd/system/default.target.wants/nvmf-autoconnect.service",
            "",
        );
        t
    }

    fn run(&self) -> Vec<Finding> {
        let route = |dst: &str, _src: Option<&str>| -> Result<String, String> {
            match dst {
                "10.0.0.1" => Ok("eth0".into()),
                "10.0.1.1" => Ok("eth1".into()),
                _ => Err("RTNETLINK answers: Network is unreachable".into()),
            }
        };
        doctor::run(&Env {
            sysfs: self.sys(),
            etc: self.etc(),
            unit_dirs: vec![self.units()],
            route: &route,
        })
    }
}

/// The one finding of `check` whose subject contains `subject`.
fn one<'a>(f: &'a [Finding], check: &str, subject: &str) -> &'a Finding {
    let v: Vec<&Finding> = f
        .iter()
        .filter(|x| x.check == check && x.subject.contains(subject))
        .collect();
    assert_eq!(
        v.len(),
        1,
        "want one {check} finding about {subject}: {f:#?}"
    );
    v[0]
}

fn show(f: &[Finding]) -> String {
    f.iter().map(|x| x.line() + "\n").collect()
}

#[test]
fn healthy_host_has_no_warning_or_error() {
    let t = Tree::healthy();
    let f = t.run();
    let bad: Vec<&Finding> = f
        .iter()
        .filter(|x| x.severity >= Severity::Warning)
        .collect();
    assert!(bad.is_empty(), "{}", show(&f));
    for (check, subject) in [
        ("module", "nvme_fabrics"),
        ("module", "nvme_tcp"),
        ("multipath", "nvme_core"),
        ("hostnqn", "hostnqn"),
        ("hostid", "hostid"),
        ("iopolicy", "nvme-subsys0"),
        ("timeouts", "nvme0 "),
        ("timeouts", "nvme1 "),
        ("mtu", "nvme-subsys0"),
        ("ana", "nvme0c0n1"),
        ("ana", "nvme0c1n1"),
        ("autoconnect", "nvmf-autoconnect"),
    ] {
        assert_eq!(
            one(&f, check, subject).severity,
            Severity::Ok,
            "{}",
            show(&f)
        );
    }
    // the NIC's NUMA node is reported
    assert!(
        one(&f, "numa", "eth0").message.contains("NUMA node 0"),
        "{}",
        show(&f)
    );
    assert_eq!(doctor::errors(&f), 0);
}

#[test]
fn missing_modules_are_flagged_with_modprobe() {
    let t = Tree::healthy();
    t.remove("sys/module/nvme_fabrics");
    t.remove("sys/module/nvme_tcp");
    let f = t.run();
    let fab = one(&f, "module", "nvme_fabrics");
    assert_eq!(fab.severity, Severity::Error);
    assert!(fab
        .fix
        .as_deref()
        .unwrap()
        .starts_with("modprobe nvme-fabrics"));
    let tcp = one(&f, "module", "nvme_tcp");
    assert_eq!(tcp.severity, Severity::Warning);
    assert!(tcp
        .fix
        .as_deref()
        .unwrap()
        .contains("modules-load.d/nvme-tcp.conf"));
    assert!(doctor::errors(&f) > 0);
}

#[test]
fn multipath_off_is_a_warning() {
    let t = Tree::healthy();
    t.write("sys/module/nvme_core/parameters/multipath", "N\n");
    let f = t.run();
    let m = one(&f, "multipath", "nvme_core");
    assert_eq!(m.severity, Severity::Warning);
    assert!(m
        .fix
        .as_deref()
        .unwrap()
        .contains("options nvme_core multipath=Y"));
}

#[test]
fn host_identity_problems() {
    // missing host NQN: an error, fixed by nvme gen-hostnqn
    let t = Tree::healthy();
    t.remove("etc/nvme/hostnqn");
    let f = t.run();
    let n = one(&f, "hostnqn", "hostnqn");
    assert_eq!(n.severity, Severity::Error);
    assert!(n.fix.as_deref().unwrap().starts_with("nvme gen-hostnqn >"));

    // not an NQN
    let t = Tree::healthy();
    t.write("etc/nvme/hostnqn", "myhost\n");
    assert_eq!(
        one(&t.run(), "hostnqn", "hostnqn").severity,
        Severity::Error
    );

    // missing host ID: a warning, fixed from the NQN's UUID
    let t = Tree::healthy();
    t.remove("etc/nvme/hostid");
    let f = t.run();
    let h = one(&f, "hostid", "hostid");
    assert_eq!(h.severity, Severity::Warning);
    assert!(h
        .fix
        .as_deref()
        .unwrap()
        .starts_with("sed -n 's/.*:uuid://p'"));

    // a host ID that is not the NQN's UUID
    let t = Tree::healthy();
    t.write("etc/nvme/hostid", "19f819ba-ae8a-4f91-8654-19c75292975d\n");
    let f = t.run();
    let h = one(&f, "hostid", "hostid");
    assert_eq!(h.severity, Severity::Warning, "{}", show(&f));
    assert!(h.message.contains("does not match"), "{}", h.message);

    // not a UUID at all
    let t = Tree::healthy();
    t.write("etc/nvme/hostid", "hello\n");
    assert_eq!(one(&t.run(), "hostid", "hostid").severity, Severity::Error);
}

#[test]
fn numa_iopolicy_with_two_paths_recommends_round_robin() {
    let t = Tree::healthy();
    t.write("sys/class/nvme-subsystem/nvme-subsys0/iopolicy", "numa\n");
    let f = t.run();
    let p = one(&f, "iopolicy", "nvme-subsys0");
    assert_eq!(p.severity, Severity::Warning);
    let fix = p.fix.as_deref().unwrap();
    let sysfs = t.sys().join("class/nvme-subsystem/nvme-subsys0/iopolicy");
    assert!(
        fix.starts_with(&format!("echo round-robin > {} && ", sysfs.display())),
        "{fix}"
    );
    // and a udev rule keeps it across reboots
    assert!(
        fix.ends_with(&format!(
            "echo 'ACTION==\"add|change\", SUBSYSTEM==\"nvme-subsystem\", ATTR{{subsysnqn}}==\"{NQN}\", ATTR{{iopolicy}}=\"round-robin\"' >> {}/udev/rules.d/71-nvmf-iopolicy.rules",
            t.etc().display()
        )),
        "{fix}"
    );
    // with one path the policy does not matter
    t.remove("sys/class/nvme-subsystem/nvme-subsys0/nvme1");
    assert_eq!(
        one(&t.run(), "iopolicy", "nvme-subsys0").severity,
        Severity::Ok
    );
}

#[test]
fn controller_state_and_timeouts() {
    let t = Tree::healthy();
    t.write("sys/class/nvme/nvme0/kato", "0\n");
    t.write("sys/class/nvme/nvme1/ctrl_loss_tmo", "5\n");
    t.write("sys/class/nvme/nvme1/state", "connecting\n");
    let f = t.run();
    let k = one(&f, "timeouts", "nvme0 ");
    assert_eq!(k.severity, Severity::Warning, "{}", show(&f));
    assert!(k.message.contains("keep-alive 0 s"), "{}", k.message);
    assert_eq!(
        k.fix.as_deref().unwrap(),
        format!("nvme disconnect -d nvme0 && nvmf connect -t tcp -a 10.0.0.1 -s 4420 -n {NQN} --keep-alive-tmo 5")
    );
    let l = one(&f, "timeouts", "nvme1 ");
    assert_eq!(l.severity, Severity::Warning);
    assert!(
        l.message.contains("before its first reconnect"),
        "{}",
        l.message
    );
    assert_eq!(one(&f, "state", "nvme1 ").severity, Severity::Warning);
    // ctrl_loss_tmo off is fine
    let t = Tree::healthy();
    t.write("sys/class/nvme/nvme1/ctrl_loss_tmo", "off\n");
    let f = t.run();
    let l = one(&f, "timeouts", "nvme1 ");
    assert_eq!(l.severity, Severity::Ok);
    assert!(l.message.contains("off (forever)"), "{}", l.message);
}

#[test]
fn paths_over_interfaces_with_different_mtus() {
    let t = Tree::healthy();
    t.net("eth0", 1500, 1);
    let f = t.run();
    let m = one(&f, "mtu", "nvme-subsys0");
    assert_eq!(m.severity, Severity::Warning, "{}", show(&f));
    assert!(m.message.contains("eth0 MTU 1500 (nvme0)"), "{}", m.message);
    assert!(m.message.contains("eth1 MTU 9000 (nvme1)"), "{}", m.message);
    assert_eq!(m.fix.as_deref(), Some("ip link set dev eth0 mtu 9000"));
    assert!(one(&f, "numa", "eth0").message.contains("NUMA node 1"));
    // a path without a route
    t.write(
        "sys/class/nvme/nvme1/address",
        "traddr=192.0.2.7,trsvcid=4420\n",
    );
    let f = t.run();
    assert_eq!(one(&f, "route", "nvme1").severity, Severity::Warning);
}

#[test]
fn ana_states_other_than_optimized_are_flagged() {
    let t = Tree::healthy();
    t.path(1, "inaccessible");
    let f = t.run();
    let a = one(&f, "ana", "nvme0c1n1");
    assert_eq!(a.severity, Severity::Warning, "{}", show(&f));
    assert!(a.message.contains("inaccessible"));
    assert!(a
        .fix
        .as_deref()
        .unwrap()
        .starts_with(&format!("nvmf rpc nvmf_subsystem_listener_set_ana_state {NQN} -n optimized -t tcp -a 10.0.1.1 -s 4420 -g 1")));
    // no usable path left: an error
    t.path(0, "persistent-loss");
    let f = t.run();
    assert_eq!(one(&f, "ana", "nvme0c0n1").severity, Severity::Error);
    assert_eq!(one(&f, "ana", "nvme0c1n1").severity, Severity::Error);
    assert!(doctor::errors(&f) >= 2);
}

#[test]
fn autoconnect_unit_that_skips_itself() {
    // nvme-cli 2.3/2.4's unit: runs only while one of the two files is missing
    let t = Tree::healthy();
    t.write(
        "lib/systemd/system/nvmf-autoconnect.service",
        "[Unit]\nConditionPathExists=|!/etc/nvme/config.json\n\
         ConditionPathExists=|!/etc/nvme/discovery.conf\n[Service]\nExecStart=/usr/sbin/nvme connect-all\n",
    );
    t.write(
        "etc/nvme/discovery.conf",
        "# comments only, as Debian ships it\n",
    );
    let f = t.run();
    let a = one(&f, "autoconnect", "nvmf-autoconnect");
    assert_eq!(a.severity, Severity::Error, "{}", show(&f));
    let fix = a.fix.clone().unwrap();
    assert!(fix.contains("ConditionPathExists=\\n"), "{fix}");
    // the drop-in the fix writes clears it
    let dropin = t
        .etc()
        .join("systemd/system/nvmf-autoconnect.service.d/nvmf.conf");
    std::fs::create_dir_all(dropin.parent().unwrap()).unwrap();
    std::fs::write(
        &dropin,
        "[Unit]\nConditionPathExists=\nConditionPathExists=|/etc/nvme/config.json\n",
    )
    .unwrap();
    assert_eq!(
        one(&t.run(), "autoconnect", "nvmf-autoconnect").severity,
        Severity::Ok
    );
    // not enabled
    t.remove("etc/systemd/system/default.target.wants");
    let a = one(&t.run(), "autoconnect", "nvmf-autoconnect").clone();
    assert_eq!(a.severity, Severity::Warning);
    assert_eq!(
        a.fix.as_deref(),
        Some("systemctl enable nvmf-autoconnect.service")
    );
}

/// A fake `ip` for the CLI: routes 10.0.0.1 by eth0 and 10.0.1.1 by eth1.
fn fake_ip(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("fake-ip");
    std::fs::write(
        &p,
        "#!/bin/sh\n# ip -j route get DST [from SRC]\ncase \"$4\" in\n\
         10.0.0.1) echo '[{\"dst\":\"10.0.0.1\",\"dev\":\"eth0\",\"prefsrc\":\"10.0.0.9\"}]' ;;\n\
         10.0.1.1) echo '[{\"dst\":\"10.0.1.1\",\"dev\":\"eth1\",\"prefsrc\":\"10.0.1.9\"}]' ;;\n\
         *) echo 'RTNETLINK answers: Network is unreachable' >&2; exit 2 ;;\nesac\n",
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn doctor_cli(t: &Tree, extra: &[&str]) -> std::process::Output {
    let ip = fake_ip(t.dir.path());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nvmf"));
    cmd.arg("doctor")
        .arg("--sysfs-root")
        .arg(t.sys())
        .arg("--etc-root")
        .arg(t.etc())
        .arg("--unit-dir")
        .arg(t.units())
        .arg("--ip")
        .arg(ip)
        .args(extra);
    nvmf_testkit::run_bounded(cmd, std::time::Duration::from_secs(30))
}

#[test]
fn cli_exit_status_text_and_json() {
    let t = Tree::healthy();
    let out = doctor_cli(&t, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("0 error(s), 0 warning(s)"), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with("OK    mtu")),
        "{stdout}"
    );

    t.write("etc/nvme/hostnqn", "");
    t.write("sys/class/net/eth1/mtu", "1500\n");
    let out = doctor_cli(&t, &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["errors"], 1, "{v:#}");
    let findings = v["findings"].as_array().unwrap();
    let hostnqn = findings.iter().find(|f| f["check"] == "hostnqn").unwrap();
    assert_eq!(hostnqn["severity"], "error");
    assert!(hostnqn["fix"]
        .as_str()
        .unwrap()
        .starts_with("nvme gen-hostnqn > "));
    let mtu = findings.iter().find(|f| f["check"] == "mtu").unwrap();
    assert_eq!(mtu["severity"], "warning");
    assert_eq!(mtu["fix"], "ip link set dev eth1 mtu 9000");
}
