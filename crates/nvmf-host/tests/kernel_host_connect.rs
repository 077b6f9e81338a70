//! `nvmf connect` / `connect-all` for the Linux kernel host and their `--persist` files,
//! without a kernel: the writers of config.json and discovery.conf (merge with what is there,
//! idempotence, unknown fields kept, unparsable files refused and left alone, atomic
//! replacement keeping the mode), and the CLI against a regular file standing in for
//! /dev/nvme-fabrics (it keeps the option string written and answers `instance=N`), a fake
//! sysfs tree for "already connected", and, for connect-all, a real nvmfd's discovery service.

use nvmf_host::kernel_host::persist::{self, DiscoveryRecord, Outcome, PortRecord};
use nvmf_testkit::{free_port, run_bounded, text, TestDir};
use serde_json::{json, Value};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
const UUID: &str = "0e3a8e02-1c21-4f5b-9e3a-1d2c3b4a5f60";

fn hostnqn() -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:{UUID}")
}

fn port_record() -> PortRecord {
    PortRecord {
        hostnqn: hostnqn(),
        hostid: Some(UUID.into()),
        nqn: NQN.into(),
        transport: "tcp".into(),
        traddr: "10.0.0.1".into(),
        trsvcid: "4420".into(),
        ..Default::default()
    }
}

fn inode(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().ino()
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// No `.*.tmp` file is left in `dir`.
fn no_temp_files(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        assert!(!n.ends_with(".tmp"), "temporary file left: {n}");
    }
}

#[test]
fn config_json_is_created_then_left_alone_when_nothing_changes() {
    let d = TestDir::new("persist-json");
    let (path, o) = persist::record_port(d.path(), &port_record()).unwrap();
    assert_eq!(o, Outcome::Added);
    assert_eq!(
        read_json(&path),
        json!([{"hostnqn": hostnqn(), "hostid": UUID, "subsystems": [
            {"nqn": NQN, "ports": [{"transport": "tcp", "traddr": "10.0.0.1", "trsvcid": "4420"}]}]}])
    );
    let (bytes, ino) = (std::fs::read(&path).unwrap(), inode(&path));
    // the same record again: nothing written (same inode: no rename), nothing duplicated
    let (_, o) = persist::record_port(d.path(), &port_record()).unwrap();
    assert_eq!(o, Outcome::Unchanged);
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    assert_eq!(inode(&path), ino);
    no_temp_files(d.path());
}

#[test]
fn config_json_merges_and_keeps_unknown_fields() {
    let d = TestDir::new("persist-json-merge");
    let path = d.join("config.json");
    let old = json!([
        {"hostnqn": "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555",
         "subsystems": [{"nqn": NQN, "ports": [{"transport": "tcp", "traddr": "10.9.9.9", "trsvcid": "4420"}]}]},
        {"hostnqn": hostnqn(), "hostid": UUID, "dhchap_key": "DHHC-1:00:secret:", "x-vendor": {"a": [1, 2]},
         "subsystems": [
            {"nqn": "nqn.2016-06.io.spdk:other", "application": "db",
             "ports": [{"transport": "rdma", "traddr": "10.0.0.5", "trsvcid": "4420", "tos": 3}]},
            {"nqn": NQN, "ports": [{"transport": "tcp", "traddr": "10.0.0.2", "trsvcid": "4420",
                                    "hdr_digest": true, "x-port-note": "second path"}]}]}
    ]);
    std::fs::write(&path, serde_json::to_string_pretty(&old).unwrap()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ino = inode(&path);

    let (_, o) = persist::record_port(d.path(), &port_record()).unwrap();
    assert_eq!(o, Outcome::Added);
    assert_ne!(
        inode(&path),
        ino,
        "replaced by a rename, not rewritten in place"
    );
    let mut want = old.clone();
    want[1]["subsystems"][1]["ports"]
        .as_array_mut()
        .unwrap()
        .push(json!({"transport": "tcp", "traddr": "10.0.0.1", "trsvcid": "4420"}));
    assert_eq!(read_json(&path), want);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600,
        "the mode of the file is kept"
    );

    // new values for an existing port: updated in place, its other fields kept
    let mut r = port_record();
    r.traddr = "10.0.0.2".into();
    r.ctrl_loss_tmo = Some(-1);
    r.keep_alive_tmo = Some(5);
    let (_, o) = persist::record_port(d.path(), &r).unwrap();
    assert_eq!(o, Outcome::Updated);
    let v = read_json(&path);
    let ports = v[1]["subsystems"][1]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 2, "{v:#}");
    assert_eq!(
        ports[0],
        json!({"transport": "tcp", "traddr": "10.0.0.2", "trsvcid": "4420", "hdr_digest": true,
               "x-port-note": "second path", "ctrl_loss_tmo": -1, "keep_alive_tmo": 5})
    );
    assert_eq!(v[0], old[0], "the other host is untouched");
    assert_eq!(
        persist::record_port(d.path(), &r).unwrap().1,
        Outcome::Unchanged
    );
    no_temp_files(d.path());
}

#[test]
fn config_json_that_cannot_be_parsed_is_refused_and_kept() {
    for (name, bad) in [
        ("not JSON", "[{\"hostnqn\": \"nqn.x\", "),
        ("an object", "{\"hosts\": []}"),
        (
            "subsystems not an array",
            &*format!("[{{\"hostnqn\": \"{}\", \"subsystems\": {{}}}}]", hostnqn()),
        ),
    ] {
        let d = TestDir::new("persist-json-bad");
        let path = d.join("config.json");
        std::fs::write(&path, bad).unwrap();
        let e = persist::record_port(d.path(), &port_record()).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("not changing it"), "{name}: {msg}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), bad, "{name}");
        no_temp_files(d.path());
    }
}

fn disc_record() -> DiscoveryRecord {
    DiscoveryRecord {
        transport: "tcp".into(),
        traddr: "10.0.0.1".into(),
        trsvcid: "8009".into(),
        ..Default::default()
    }
}

/// Debian 12's /etc/nvme/discovery.conf as the nvme-cli package installs it.
const DEBIAN_DISCOVERY_CONF: &str = "\
# Used for extracting default parameters for discovery
#
# Example:
# --transport=<trtype> --traddr=<traddr> --trsvcid=<trsvcid> --host-traddr=<host-traddr> --host-iface=<host-iface>
";

#[test]
fn discovery_conf_appends_once_and_keeps_comments() {
    let d = TestDir::new("persist-disc");
    let path = d.join("discovery.conf");
    std::fs::write(&path, DEBIAN_DISCOVERY_CONF).unwrap();
    let (_, o) = persist::record_discovery(d.path(), &disc_record()).unwrap();
    assert_eq!(o, Outcome::Added);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{DEBIAN_DISCOVERY_CONF}--transport=tcp --traddr=10.0.0.1 --trsvcid=8009\n")
    );
    let ino = inode(&path);
    let (_, o) = persist::record_discovery(d.path(), &disc_record()).unwrap();
    assert_eq!(o, Outcome::Unchanged);
    assert_eq!(inode(&path), ino, "nothing written");
    // another port is another discovery controller
    let mut r = disc_record();
    r.trsvcid = "4420".into();
    assert_eq!(
        persist::record_discovery(d.path(), &r).unwrap().1,
        Outcome::Added
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 6);
    no_temp_files(d.path());
}

#[test]
fn discovery_conf_updates_a_line_in_place_keeping_its_options() {
    let d = TestDir::new("persist-disc-merge");
    let path = d.join("discovery.conf");
    // short options, a value after a space, no port (nvme-cli's default 8009 for tcp), a flag
    // and an option nvmf does not know
    std::fs::write(
        &path,
        "# mine\n-t tcp -a 10.0.0.1 --hdr-digest --x-new-opt=7\n--transport=rdma --traddr=10.0.0.1\n",
    )
    .unwrap();
    let mut r = disc_record();
    r.ctrl_loss_tmo = Some(-1);
    let (_, o) = persist::record_discovery(d.path(), &r).unwrap();
    assert_eq!(o, Outcome::Updated);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "# mine\n-t tcp -a 10.0.0.1 --hdr-digest --x-new-opt=7 --trsvcid=8009 --ctrl-loss-tmo=-1\n\
         --transport=rdma --traddr=10.0.0.1\n"
    );
    assert_eq!(
        persist::record_discovery(d.path(), &r).unwrap().1,
        Outcome::Unchanged
    );
    // a new value replaces the old one where it stands
    r.ctrl_loss_tmo = Some(600);
    persist::record_discovery(d.path(), &r).unwrap();
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .contains("--x-new-opt=7 --trsvcid=8009 --ctrl-loss-tmo=600\n"));
}

#[test]
fn discovery_conf_that_cannot_be_parsed_is_refused_and_kept() {
    for bad in [
        "--transport=tcp --traddr=10.0.0.1\nconnect to 10.0.0.2 please\n",
        "--transport=tcp --traddr\n",
        "--hdr-digest=yes --traddr=10.0.0.1\n",
    ] {
        let d = TestDir::new("persist-disc-bad");
        let path = d.join("discovery.conf");
        std::fs::write(&path, bad).unwrap();
        let e = persist::record_discovery(d.path(), &disc_record()).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("not changing it") && msg.contains("line "),
            "{msg}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), bad);
    }
    let d = TestDir::new("persist-disc-binary");
    std::fs::write(d.join("discovery.conf"), [0xffu8, 0xfe, 0x00]).unwrap();
    assert!(persist::record_discovery(d.path(), &disc_record()).is_err());
}

// ------------------------------------------------------------------------------ CLI --

/// A config dir with hostnqn/hostid, an empty sysfs, and a regular file as the fabrics
/// device: the kernel's answer `instance=7,` repeated, so that whatever a connect writes over
/// its start, the read after it finds `instance=7`.
struct Host {
    dir: TestDir,
}

impl Host {
    fn new(instance: u32) -> Host {
        let dir = TestDir::new("kconnect");
        std::fs::create_dir_all(dir.join("etc/nvme")).unwrap();
        std::fs::create_dir_all(dir.join("sys/class/nvme")).unwrap();
        std::fs::write(dir.join("etc/nvme/hostnqn"), format!("{}\n", hostnqn())).unwrap();
        std::fs::write(dir.join("etc/nvme/hostid"), format!("{UUID}\n")).unwrap();
        let h = Host { dir };
        h.reset_dev(instance);
        h
    }
    fn config(&self) -> PathBuf {
        self.dir.join("etc/nvme")
    }
    fn dev(&self) -> PathBuf {
        self.dir.join("nvme-fabrics")
    }
    fn reset_dev(&self, instance: u32) {
        std::fs::write(self.dev(), format!("instance={instance},").repeat(400)).unwrap();
    }
    /// Makes sysfs show `nvme<instance>` live to `nqn` at `traddr:trsvcid`.
    fn add_controller(&self, instance: u32, nqn: &str, traddr: &str, trsvcid: &str) {
        let c = self.dir.join(&format!("sys/class/nvme/nvme{instance}"));
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("transport"), "tcp\n").unwrap();
        std::fs::write(
            c.join("address"),
            format!("traddr={traddr},trsvcid={trsvcid},src_addr=10.0.0.9\n"),
        )
        .unwrap();
        std::fs::write(c.join("subsysnqn"), format!("{nqn}\n")).unwrap();
        std::fs::write(c.join("state"), "live\n").unwrap();
    }
    fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nvmf"));
        cmd.args(args)
            .arg("--config-dir")
            .arg(self.config())
            .arg("--fabrics-dev")
            .arg(self.dev())
            .arg("--sysfs-root")
            .arg(self.dir.join("sys"));
        run_bounded(cmd, Duration::from_secs(60))
    }
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}stderr:\n{}",
        o.status.code(),
        text(&o.stdout),
        text(&o.stderr)
    )
}

#[test]
fn connect_writes_nvme_clis_option_string_and_persists() {
    let h = Host::new(7);
    let args = [
        "connect",
        "-t",
        "tcp",
        "-a",
        "10.0.0.1",
        "-n",
        NQN,
        "--ctrl-loss-tmo",
        "-1",
        "--persist",
    ];
    let out = h.run(&args);
    assert!(out.status.success(), "{}", show(&out));
    let opts = format!(
        "nqn={NQN},transport=tcp,traddr=10.0.0.1,trsvcid=4420,hostnqn={},hostid={UUID},ctrl_loss_tmo=-1",
        hostnqn()
    );
    let dev = std::fs::read_to_string(h.dev()).unwrap();
    assert!(
        dev.starts_with(&opts),
        "device got: {}",
        &dev[..opts.len() + 20]
    );
    assert!(
        text(&out.stdout).starts_with(&format!("nvme7: connected to {NQN}")),
        "{}",
        show(&out)
    );
    assert_eq!(
        read_json(&h.config().join("config.json")),
        json!([{"hostnqn": hostnqn(), "hostid": UUID, "subsystems": [{"nqn": NQN, "ports": [
            {"transport": "tcp", "traddr": "10.0.0.1", "trsvcid": "4420", "ctrl_loss_tmo": -1}]}]}])
    );

    // connected already (sysfs shows it): no write to the device, config.json unchanged
    h.add_controller(7, NQN, "10.0.0.1", "4420");
    std::fs::write(h.dev(), "untouched").unwrap();
    let out = h.run(&args);
    assert!(out.status.success(), "{}", show(&out));
    assert!(
        text(&out.stdout).contains("nvme7: already connected"),
        "{}",
        show(&out)
    );
    assert!(
        text(&out.stdout).contains("persist: already in"),
        "{}",
        show(&out)
    );
    assert_eq!(std::fs::read_to_string(h.dev()).unwrap(), "untouched");
}

#[test]
fn connect_refuses_bad_input_with_a_clear_message() {
    let h = Host::new(1);
    // an option smuggled into the address
    let out = h.run(&["connect", "-a", "10.0.0.1,hostnqn=evil", "-n", NQN]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(text(&out.stderr).contains("cannot carry"), "{}", show(&out));
    // not a port
    let out = h.run(&["connect", "-a", "10.0.0.1", "-s", "http", "-n", NQN]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not a port number"),
        "{}",
        show(&out)
    );
    // a transport the kernel host is not driven over here
    let out = h.run(&["connect", "-t", "fc", "-a", "10.0.0.1", "-n", NQN]);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    // no host NQN anywhere
    std::fs::remove_file(h.config().join("hostnqn")).unwrap();
    let out = h.run(&["connect", "-a", "10.0.0.1", "-n", NQN]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("nvme gen-hostnqn >"),
        "{}",
        show(&out)
    );
    // a config.json --persist cannot parse: refused before anything is written
    let h = Host::new(1);
    std::fs::write(h.config().join("config.json"), "{oops").unwrap();
    let out = h.run(&["connect", "-a", "10.0.0.1", "-n", NQN, "--persist"]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        text(&out.stderr).contains("not changing it"),
        "{}",
        show(&out)
    );
    assert_eq!(
        std::fs::read_to_string(h.config().join("config.json")).unwrap(),
        "{oops"
    );
    assert!(
        std::fs::read_to_string(h.dev())
            .unwrap()
            .starts_with("instance=1,"),
        "the kernel was not asked to connect"
    );
    // a dry run writes nothing
    let h = Host::new(1);
    let out = h.run(&[
        "connect",
        "-a",
        "10.0.0.1",
        "-n",
        NQN,
        "--persist",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", show(&out));
    assert!(text(&out.stdout).contains("would write"), "{}", show(&out));
    assert!(!h.config().join("config.json").exists());
    assert!(std::fs::read_to_string(h.dev())
        .unwrap()
        .starts_with("instance=1,"));
}

const NQN2: &str = "nqn.2016-06.io.spdk:cnode2";

/// nvmfd with two subsystems (any host) and the discovery service on one port.
fn nvmfd() -> (nvmf_testkit::Daemon, u16) {
    let port = free_port();
    let listen = |nqn: &str| {
        format!(
            r#"{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{nqn}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}"#
        )
    };
    let sub = |nqn: &str, sn: &str| {
        format!(
            r#"{{"method":"nvmf_create_subsystem","params":{{"nqn":"{nqn}","allow_any_host":true,"serial_number":"{sn}","model_number":"connect-all test"}}}}"#
        )
    };
    let cfg = format!(
        r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[{{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":2048}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
   {}, {},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {}, {}, {}]}}]}}"#,
        sub(NQN, "KH0001"),
        sub(NQN2, "KH0002"),
        listen(NQN),
        listen(NQN2),
        listen(nvmf_host::DISCOVERY_NQN)
    );
    let d = nvmf_testkit::Daemon::builder(cfg)
        .args(["-m", "0"])
        .listening(&[port])
        .ready_within(Duration::from_secs(15))
        .start();
    (d, port)
}

#[test]
fn connect_all_connects_every_subsystem_and_persists_the_discovery_controller() {
    let (_d, port) = nvmfd();
    let port_s = port.to_string();
    let h = Host::new(5);
    // Debian's commented discovery.conf is there already
    std::fs::write(h.config().join("discovery.conf"), DEBIAN_DISCOVERY_CONF).unwrap();
    h.add_controller(3, NQN2, "127.0.0.1", &port_s);
    let args = [
        "connect-all",
        "-a",
        "127.0.0.1",
        "-s",
        &port_s,
        "--persist",
        "--keep-alive-tmo",
        "5",
    ];
    let out = h.run(&args);
    assert!(out.status.success(), "{}", show(&out));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "nvme5: connected to {NQN} at tcp 127.0.0.1:{port}"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("nvme3: already connected to {NQN2}")),
        "{stdout}"
    );
    let dev = std::fs::read_to_string(h.dev()).unwrap();
    assert!(
        dev.starts_with(&format!(
            "nqn={NQN},transport=tcp,traddr=127.0.0.1,trsvcid={port},hostnqn={},hostid={UUID},keep_alive_tmo=5,ctrl_loss_tmo=600",
            hostnqn()
        )),
        "{}",
        &dev[..200]
    );
    let conf = std::fs::read_to_string(h.config().join("discovery.conf")).unwrap();
    assert_eq!(
        conf,
        format!("{DEBIAN_DISCOVERY_CONF}--transport=tcp --traddr=127.0.0.1 --trsvcid={port} --keep-alive-tmo=5\n")
    );
    // again: both connected now, nothing added
    h.add_controller(5, NQN, "127.0.0.1", &port_s);
    let out = h.run(&args);
    assert!(out.status.success(), "{}", show(&out));
    assert!(
        text(&out.stdout).contains("persist: already in"),
        "{}",
        show(&out)
    );
    assert_eq!(
        std::fs::read_to_string(h.config().join("discovery.conf")).unwrap(),
        conf
    );
}

#[test]
fn connect_all_without_a_discovery_controller_fails_clearly() {
    let h = Host::new(5);
    let port = free_port().to_string();
    let out = h.run(&[
        "connect-all",
        "-a",
        "127.0.0.1",
        "-s",
        &port,
        "--timeout",
        "2",
        "--persist",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        text(&out.stderr).contains("reading the discovery log"),
        "{}",
        show(&out)
    );
    assert!(
        !h.config().join("discovery.conf").exists(),
        "nothing recorded"
    );
}
