//! kernel_host/persist.rs — recording kernel connections so that nvme-cli's boot-time
//! autoconnect (`nvme connect-all` without arguments, run by nvmf-autoconnect.service)
//! restores them: one line of connect-all arguments per discovery controller in
//! `discovery.conf`, and libnvme's JSON (`[{hostnqn, hostid, subsystems: [{nqn, ports:
//! [{transport, traddr, trsvcid, ...}]}]}]`) in `config.json`.
//!
//! Both writers merge with what is there (other lines, hosts, subsystems, ports and fields they
//! do not know are kept), are idempotent (a second record of the same thing changes nothing and
//! writes nothing), write atomically (temporary file in the same directory, fsync, rename), and
//! refuse a file they cannot parse instead of replacing it.

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A new line / port was added.
    Added,
    /// An existing entry for the same place got new values.
    Updated,
    /// It was already recorded exactly so; the file was not written.
    Unchanged,
}

impl Outcome {
    pub fn describe(self) -> &'static str {
        match self {
            Outcome::Added => "added to",
            Outcome::Updated => "updated in",
            Outcome::Unchanged => "already in",
        }
    }
}

/// Replaces `path` with `data` atomically: a temporary file next to it (mode of the old file,
/// else 0644), fsync, rename over, fsync of the directory. The directory is created if missing.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let tmp = dir.join(format!(".{name}.nvmf-{}.tmp", std::process::id()));
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644);
    let result = (|| -> Result<()> {
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(data)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the mode of {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("syncing {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

// ---------------------------------------------------------------- discovery.conf --

/// One discovery controller for `discovery.conf`: the connect-all arguments nvmf writes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiscoveryRecord {
    pub transport: String,
    pub traddr: String,
    pub trsvcid: String,
    pub host_traddr: Option<String>,
    pub host_iface: Option<String>,
    pub hostnqn: Option<String>,
    pub hostid: Option<String>,
    pub nr_io_queues: Option<u32>,
    pub keep_alive_tmo: Option<u32>,
    pub reconnect_delay: Option<u32>,
    pub ctrl_loss_tmo: Option<i32>,
}

impl DiscoveryRecord {
    /// The options to set, in the order a new line gets them.
    fn options(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("transport", self.transport.clone()),
            ("traddr", self.traddr.clone()),
            ("trsvcid", self.trsvcid.clone()),
        ];
        let opt = |v: &mut Vec<(&'static str, String)>, k, x: &Option<String>| {
            if let Some(x) = x {
                v.push((k, x.clone()));
            }
        };
        opt(&mut v, "host-traddr", &self.host_traddr);
        opt(&mut v, "host-iface", &self.host_iface);
        opt(&mut v, "hostnqn", &self.hostnqn);
        opt(&mut v, "hostid", &self.hostid);
        let num = |v: &mut Vec<(&'static str, String)>, k, x: Option<String>| {
            if let Some(x) = x {
                v.push((k, x));
            }
        };
        num(
            &mut v,
            "nr-io-queues",
            self.nr_io_queues.map(|n| n.to_string()),
        );
        num(
            &mut v,
            "keep-alive-tmo",
            self.keep_alive_tmo.map(|n| n.to_string()),
        );
        num(
            &mut v,
            "reconnect-delay",
            self.reconnect_delay.map(|n| n.to_string()),
        );
        num(
            &mut v,
            "ctrl-loss-tmo",
            self.ctrl_loss_tmo.map(|n| n.to_string()),
        );
        v
    }
}

/// How an option of a discovery.conf line takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One of nvme-cli's options that take a value.
    Valued,
    /// One of nvme-cli's flags.
    Flag,
    /// A long option nvmf does not know: a value may follow.
    Unknown,
}

/// nvme-cli's connect-all options: (long name, short letter, takes a value).
const OPTIONS: &[(&str, char, bool)] = &[
    ("transport", 't', true),
    ("traddr", 'a', true),
    ("trsvcid", 's', true),
    ("host-traddr", 'w', true),
    ("host-iface", 'f', true),
    ("hostnqn", 'q', true),
    ("hostid", 'I', true),
    ("nqn", 'n', true),
    ("dhchap-secret", 'S', true),
    ("nr-io-queues", 'i', true),
    ("nr-write-queues", 'W', true),
    ("nr-poll-queues", 'P', true),
    ("queue-size", 'Q', true),
    ("keep-alive-tmo", 'k', true),
    ("reconnect-delay", 'c', true),
    ("ctrl-loss-tmo", 'l', true),
    ("tos", 'T', true),
    ("duplicate-connect", 'D', false),
    ("disable-sqflow", 'd', false),
    ("hdr-digest", 'g', false),
    ("data-digest", 'G', false),
    ("persistent", 'p', false),
    ("tls", '\0', false),
    ("force", '\0', false),
];

/// The long name and kind of an option token (`--traddr`, `-a`); `None` when it is none.
fn option_name(tok: &str) -> Option<(String, Kind)> {
    let kind = |valued: bool| if valued { Kind::Valued } else { Kind::Flag };
    if let Some(long) = tok.strip_prefix("--") {
        if long.is_empty() {
            return None;
        }
        return Some(match OPTIONS.iter().find(|(n, _, _)| *n == long) {
            Some((n, _, v)) => (n.to_string(), kind(*v)),
            None => (long.to_string(), Kind::Unknown),
        });
    }
    let mut cs = tok.strip_prefix('-')?.chars();
    let (Some(c), None) = (cs.next(), cs.next()) else {
        return None;
    };
    OPTIONS
        .iter()
        .find(|(_, s, _)| *s == c && c != '\0')
        .map(|(n, _, v)| (n.to_string(), kind(*v)))
}

/// One option of a discovery.conf line: its long name, value, and the text it came from
/// (kept as written unless nvmf changes the value).
#[derive(Debug, Clone, PartialEq, Eq)]
struct LineOpt {
    key: String,
    value: Option<String>,
    raw: String,
}

/// A discovery.conf line's options; `None` for a comment or blank line; an error for a line
/// that is not a list of options.
fn parse_conf_line(line: &str) -> std::result::Result<Option<Vec<LineOpt>>, String> {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') {
        return Ok(None);
    }
    let toks: Vec<&str> = t.split_whitespace().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let tok = toks[i];
        let next_is_value = toks.get(i + 1).is_some_and(|n| !n.starts_with('-'));
        let opt = if let Some((name, v)) = tok.split_once('=').filter(|(n, _)| n.starts_with('-')) {
            match option_name(name) {
                Some((_, Kind::Flag)) => return Err(format!("'{name}' takes no value")),
                Some((key, _)) => LineOpt {
                    key,
                    value: Some(v.to_string()),
                    raw: tok.to_string(),
                },
                None => return Err(format!("'{tok}' is not an option")),
            }
        } else {
            match option_name(tok) {
                Some((key, Kind::Flag)) => LineOpt {
                    key,
                    value: None,
                    raw: tok.to_string(),
                },
                Some((key, Kind::Valued | Kind::Unknown)) if next_is_value => {
                    i += 1;
                    LineOpt {
                        key,
                        value: Some(toks[i].to_string()),
                        raw: format!("{tok} {}", toks[i]),
                    }
                }
                Some((key, Kind::Unknown)) => LineOpt {
                    key,
                    value: None,
                    raw: tok.to_string(),
                },
                Some((_, Kind::Valued)) => return Err(format!("'{tok}' needs a value")),
                None => return Err(format!("'{tok}' is not an option")),
            }
        };
        out.push(opt);
        i += 1;
    }
    Ok(Some(out))
}

fn get<'a>(opts: &'a [LineOpt], key: &str) -> Option<&'a str> {
    opts.iter()
        .rev()
        .find(|o| o.key == key)
        .and_then(|o| o.value.as_deref())
}

/// nvme-cli's port for a discovery controller when the line names none.
fn default_discovery_port(transport: &str) -> &'static str {
    if transport == "tcp" {
        "8009"
    } else {
        "4420"
    }
}

/// Whether a parsed line names the same discovery controller as `r`: transport, address,
/// port (nvme-cli's default when absent), host address and interface, discovery NQN.
fn same_discovery(opts: &[LineOpt], r: &DiscoveryRecord) -> bool {
    let transport = get(opts, "transport").unwrap_or("");
    let port = get(opts, "trsvcid").unwrap_or(default_discovery_port(transport));
    transport == r.transport
        && get(opts, "traddr") == Some(r.traddr.as_str())
        && port == r.trsvcid
        && get(opts, "host-traddr") == r.host_traddr.as_deref()
        && get(opts, "host-iface") == r.host_iface.as_deref()
        && get(opts, "nqn").is_none_or(|n| n == crate::DISCOVERY_NQN)
}

/// `--key=value` (or `--flag`).
fn render(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("--{key}={v}"),
        None => format!("--{key}"),
    }
}

/// The new text of discovery.conf with `r` recorded, and what changed. Refuses (naming the
/// line) a file with a line that is not a list of options.
pub fn merge_discovery_conf(old: &str, r: &DiscoveryRecord) -> Result<(String, Outcome)> {
    let mut lines: Vec<String> = old.lines().map(str::to_string).collect();
    let mut found = None;
    for (n, line) in lines.iter().enumerate() {
        match parse_conf_line(line) {
            Ok(Some(opts)) if found.is_none() && same_discovery(&opts, r) => {
                found = Some((n, opts))
            }
            Ok(_) => {}
            Err(e) => bail!("line {}: {e} ('{}')", n + 1, line.trim()),
        }
    }
    let outcome = match found {
        Some((n, mut opts)) => {
            let mut changed = false;
            for (k, v) in r.options() {
                match opts.iter_mut().rev().find(|o| o.key == k) {
                    Some(o) if o.value.as_deref() == Some(v.as_str()) => {}
                    Some(o) => {
                        o.value = Some(v.clone());
                        o.raw = render(k, Some(&v));
                        changed = true;
                    }
                    None => {
                        opts.push(LineOpt {
                            key: k.to_string(),
                            value: Some(v.clone()),
                            raw: render(k, Some(&v)),
                        });
                        changed = true;
                    }
                }
            }
            if !changed {
                return Ok((old.to_string(), Outcome::Unchanged));
            }
            lines[n] = opts
                .iter()
                .map(|o| o.raw.as_str())
                .collect::<Vec<_>>()
                .join(" ");
            Outcome::Updated
        }
        None => {
            lines.push(
                r.options()
                    .iter()
                    .map(|(k, v)| render(k, Some(v)))
                    .collect::<Vec<_>>()
                    .join(" "),
            );
            Outcome::Added
        }
    };
    let mut text = lines.join("\n");
    text.push('\n');
    Ok((text, outcome))
}

/// What recording would write to `path` (its new text and the outcome), without writing:
/// `merge` applied to the file's text. Errors name the file and say it is left alone.
pub fn plan(
    path: &Path,
    merge: impl FnOnce(&str) -> Result<(String, Outcome)>,
) -> Result<(PathBuf, String, Outcome)> {
    let old = read_text(path)?;
    let (text, outcome) = merge(&old).with_context(|| {
        format!(
            "{} cannot be parsed; not changing it (fix or move it, then retry)",
            path.display()
        )
    })?;
    Ok((path.to_path_buf(), text, outcome))
}

/// Records `r` in `<config_dir>/discovery.conf` (created if missing). Returns the file and
/// what changed.
pub fn record_discovery(config_dir: &Path, r: &DiscoveryRecord) -> Result<(PathBuf, Outcome)> {
    let path = config_dir.join("discovery.conf");
    let old = read_text(&path)?;
    let (text, outcome) = merge_discovery_conf(&old, r).with_context(|| {
        format!(
            "{} is not a list of nvme connect-all arguments; not changing it (fix or move it, then retry)",
            path.display()
        )
    })?;
    if outcome != Outcome::Unchanged {
        write_atomic(&path, text.as_bytes())?;
    }
    Ok((path, outcome))
}

/// A file's text; empty when it does not exist; an error when it is not readable UTF-8.
fn read_text(path: &Path) -> Result<String> {
    match std::fs::read(path) {
        Ok(b) => String::from_utf8(b).map_err(|_| {
            anyhow::anyhow!(
                "{} is not UTF-8 text; not changing it (fix or move it, then retry)",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

// ------------------------------------------------------------------- config.json --

/// One connected subsystem port for `config.json`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PortRecord {
    pub hostnqn: String,
    pub hostid: Option<String>,
    pub nqn: String,
    pub transport: String,
    pub traddr: String,
    pub trsvcid: String,
    pub host_traddr: Option<String>,
    pub host_iface: Option<String>,
    pub nr_io_queues: Option<u32>,
    pub keep_alive_tmo: Option<u32>,
    pub reconnect_delay: Option<u32>,
    pub ctrl_loss_tmo: Option<i32>,
}

fn as_array<'a>(v: &'a mut Value, what: &str) -> Result<&'a mut Vec<Value>> {
    match v {
        Value::Array(a) => Ok(a),
        other => bail!("{what} is {}, not an array", type_name(other)),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn str_field<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    o.get(k).and_then(Value::as_str)
}

/// The new config.json document with `r` recorded, and what changed. The host entry is the
/// one with the same host NQN (and host ID, where both have one), as libnvme matches hosts;
/// the port entry the one with the same transport, address, port, host address and interface.
/// Fields nvmf does not set are kept; those it sets get the new values.
pub fn merge_config_json(old: &str, r: &PortRecord) -> Result<(String, Outcome)> {
    let mut root: Value = if old.trim().is_empty() {
        Value::Array(Vec::new())
    } else {
        serde_json::from_str(old).map_err(|e| anyhow::anyhow!("not JSON: {e}"))?
    };
    let before = root.clone();
    let hosts = as_array(&mut root, "the top level")?;
    let host_idx = hosts.iter().position(|h| {
        h.as_object().is_some_and(|h| {
            str_field(h, "hostnqn") == Some(r.hostnqn.as_str())
                && match (str_field(h, "hostid"), r.hostid.as_deref()) {
                    (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
                    _ => true,
                }
        })
    });
    let host_idx = match host_idx {
        Some(i) => i,
        None => {
            let mut h = Map::new();
            h.insert("hostnqn".into(), json!(r.hostnqn));
            if let Some(id) = &r.hostid {
                h.insert("hostid".into(), json!(id));
            }
            h.insert("subsystems".into(), json!([]));
            hosts.push(Value::Object(h));
            hosts.len() - 1
        }
    };
    let Value::Object(host) = &mut hosts[host_idx] else {
        unreachable!("matched as an object")
    };
    let subsystems = as_array(
        host.entry("subsystems").or_insert_with(|| json!([])),
        &format!("\"subsystems\" of host {}", r.hostnqn),
    )?;
    let sub_idx = match subsystems.iter().position(|s| {
        s.as_object()
            .is_some_and(|s| str_field(s, "nqn") == Some(r.nqn.as_str()))
    }) {
        Some(i) => i,
        None => {
            subsystems.push(json!({"nqn": r.nqn, "ports": []}));
            subsystems.len() - 1
        }
    };
    let Value::Object(sub) = &mut subsystems[sub_idx] else {
        unreachable!("matched as an object")
    };
    let ports = as_array(
        sub.entry("ports").or_insert_with(|| json!([])),
        &format!("\"ports\" of subsystem {}", r.nqn),
    )?;
    let same_port = |p: &Map<String, Value>| {
        str_field(p, "transport") == Some(r.transport.as_str())
            && str_field(p, "traddr") == Some(r.traddr.as_str())
            && str_field(p, "trsvcid").unwrap_or("4420") == r.trsvcid
            && str_field(p, "host_traddr") == r.host_traddr.as_deref()
            && str_field(p, "host_iface") == r.host_iface.as_deref()
    };
    let port_idx = ports
        .iter()
        .position(|p| p.as_object().is_some_and(same_port));
    let added = port_idx.is_none();
    let port_idx = port_idx.unwrap_or_else(|| {
        ports.push(json!({}));
        ports.len() - 1
    });
    let Value::Object(port) = &mut ports[port_idx] else {
        unreachable!("matched or made as an object")
    };
    let mut set = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            port.insert(k.to_string(), v);
        }
    };
    set("transport", Some(json!(r.transport)));
    set("traddr", Some(json!(r.traddr)));
    set("trsvcid", Some(json!(r.trsvcid)));
    set("host_traddr", r.host_traddr.as_ref().map(|v| json!(v)));
    set("host_iface", r.host_iface.as_ref().map(|v| json!(v)));
    set("nr_io_queues", r.nr_io_queues.map(|v| json!(v)));
    set("keep_alive_tmo", r.keep_alive_tmo.map(|v| json!(v)));
    set("reconnect_delay", r.reconnect_delay.map(|v| json!(v)));
    set("ctrl_loss_tmo", r.ctrl_loss_tmo.map(|v| json!(v)));
    if root == before {
        return Ok((old.to_string(), Outcome::Unchanged));
    }
    let mut text = serde_json::to_string_pretty(&root).context("serializing config.json")?;
    text.push('\n');
    Ok((
        text,
        if added {
            Outcome::Added
        } else {
            Outcome::Updated
        },
    ))
}

/// Records `r` in `<config_dir>/config.json` (created if missing). Returns the file and what
/// changed.
pub fn record_port(config_dir: &Path, r: &PortRecord) -> Result<(PathBuf, Outcome)> {
    let path = config_dir.join("config.json");
    let old = read_text(&path)?;
    let (text, outcome) = merge_config_json(&old, r).with_context(|| {
        format!(
            "{} is not libnvme's config (an array of hosts); not changing it (fix or move it, then retry)",
            path.display()
        )
    })?;
    if outcome != Outcome::Unchanged {
        write_atomic(&path, text.as_bytes())?;
    }
    Ok((path, outcome))
}

/// nvme-cli 2.3/2.4 (Debian 12) ships nvmf-autoconnect.service with
/// `ConditionPathExists=|!/etc/nvme/config.json` and `|!/etc/nvme/discovery.conf`: it runs only
/// while one of the two files is MISSING, so with both present nothing is restored at boot
/// (fixed upstream in nvme-cli 2.5). True when `unit_text` has that condition.
pub fn autoconnect_unit_needs_both_missing(unit_text: &str) -> bool {
    unit_text.lines().any(|l| {
        let l = l.trim();
        l.starts_with("ConditionPathExists=|!") && l.ends_with("/nvme/config.json")
    })
}

/// A systemd drop-in that gives nvmf-autoconnect.service upstream's condition (run when either
/// file exists), as one shell command.
pub fn autoconnect_fix_command(etc_root: &Path) -> String {
    let etc = etc_root.display();
    format!(
        "mkdir -p {etc}/systemd/system/nvmf-autoconnect.service.d && printf '[Unit]\\nConditionPathExists=\\nConditionPathExists=|{etc}/nvme/config.json\\nConditionPathExists=|{etc}/nvme/discovery.conf\\n' > {etc}/systemd/system/nvmf-autoconnect.service.d/nvmf.conf && systemctl daemon-reload"
    )
}

/// Whether a drop-in in `<etc>/systemd/system/nvmf-autoconnect.service.d/` resets
/// `ConditionPathExists=` (an empty assignment), which undoes the unit's own conditions.
pub fn autoconnect_dropin_resets_condition(etc_root: &Path) -> bool {
    let dir = etc_root.join("systemd/system/nvmf-autoconnect.service.d");
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".conf"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .any(|t| t.lines().any(|l| l.trim() == "ConditionPathExists="))
}
