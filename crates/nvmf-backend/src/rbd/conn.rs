//! Connections to Ceph clusters for RBD bdevs, and the registry of named
//! clusters that several bdevs share.
//!
//! Owns one librados connection ([`Conn`]: `rados_create`, configuration,
//! `rados_connect`, `rados_shutdown` when the last user drops it), the
//! defaults nvmfd applies before the operator's `config_param`
//! ([`DEFAULTS`], merged by [`merged_params`]), and the process-wide
//! registry of clusters registered with `bdev_rbd_register_cluster`
//! ([`register_cluster`], [`unregister_cluster`], [`cluster`]). The
//! control plane keeps its own record of the registered configurations
//! (for `bdev_rbd_get_clusters_info` and `save_config`); this registry only
//! holds the live connections.
//!
//! Everything here blocks (network round trips to the monitors) and runs
//! on the control plane, never on a reactor. Connecting is bounded by
//! `client_mount_timeout` and `rados_mon_op_timeout`, so an unreachable
//! cluster fails in seconds, not minutes.

use std::collections::BTreeMap;
use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use nvmf_config::RbdCluster;

use super::ffi::{self, Lib};

/// Ceph settings nvmfd applies to every connection before the operator's
/// `config_param` (which wins):
///
/// - `rbd_cache=false`: librbd's write-back cache stays off, so a write's
///   completion means the data is in the OSDs. Nothing a host saw
///   acknowledged is lost when a gateway is killed, and two gateways on
///   one image never serve stale cached data. With the operator's
///   `rbd_cache=true`, FUA writes become write + flush.
/// - `rados_osd_op_timeout=20`: an OSD operation that gets no answer in
///   20 s ends with -ETIMEDOUT, which the backend answers with Namespace
///   Not Ready (retryable: no DNR). 20 s is under the Linux host's default
///   30 s I/O timeout, so the host gets a status it retries (and an OSD
///   restart, which takes a few seconds, only stalls I/O) instead of
///   aborting the command and resetting the controller; without a bound
///   (Ceph's default is 0: wait forever) a cluster that went away would
///   hold every command until the host gives up.
/// - `rados_mon_op_timeout=10` and `client_mount_timeout=10`: connecting,
///   opening an image or resizing it against an unreachable cluster fails
///   after 10 s with a clear error (Ceph's defaults: forever and 300 s).
pub const DEFAULTS: &[(&str, &str)] = &[
    ("rbd_cache", "false"),
    ("rados_osd_op_timeout", "20"),
    ("rados_mon_op_timeout", "10"),
    ("client_mount_timeout", "10"),
];

/// The settings a connection gets, in the order they are applied: nvmfd's
/// [`DEFAULTS`] that the operator did not set, then every `config_param`
/// entry of the operator's.
pub fn merged_params(user: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = DEFAULTS
        .iter()
        .filter(|(k, _)| !user.contains_key(*k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    out.extend(user.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

/// How to connect: what a registered cluster or a bdev's own parameters say.
#[derive(Debug, Clone, Default)]
pub struct ConnSpec<'a> {
    /// Label for messages (cluster name or "bdev NAME").
    pub label: &'a str,
    /// Ceph client id without "client." (`None`: "admin").
    pub user_id: Option<&'a str>,
    /// ceph.conf to read (`None`: librados' default search, whose absence
    /// is not an error: `mon_host` may come from `config_param`).
    pub config_file: Option<&'a str>,
    /// Keyring file (`keyring` setting).
    pub key_file: Option<&'a str>,
    /// Operator settings (override [`DEFAULTS`]).
    pub params: Option<&'a BTreeMap<String, String>>,
}

/// One connected librados handle. librados handles are thread-safe; this
/// one is shut down when the last bdev (or the registry) drops it, which
/// happens on the control plane or on a bdev's closing thread.
pub struct Conn {
    pub(super) lib: &'static Lib,
    pub(super) raw: ffi::Rados,
    label: String,
    /// Whether librbd's cache is on for images opened through it.
    pub(super) cache: bool,
    /// Open bdevs using this connection ([`User`] guards); images being
    /// closed on their closing thread no longer count, though they still
    /// hold the connection until `rbd_close` returns.
    users: AtomicUsize,
}

/// One open bdev's use of a [`Conn`]: counted while it lives, so that
/// [`unregister_cluster`] refuses while a bdev is open on the cluster but
/// not because an already deleted bdev's image is still closing.
#[derive(Debug)]
pub struct User(Arc<Conn>);

impl User {
    /// Count a new user of `conn`.
    pub fn new(conn: &Arc<Conn>) -> User {
        conn.users.fetch_add(1, Ordering::AcqRel);
        User(conn.clone())
    }
}

impl Drop for User {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::AcqRel);
    }
}

// SAFETY: a connected rados_t may be used from any thread (librados is
// thread-safe); the handle is only shut down in Drop, when nobody else
// holds the Conn.
unsafe impl Send for Conn {}
// SAFETY: as above; every librados call taking it is thread-safe.
unsafe impl Sync for Conn {}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("label", &self.label)
            .field("cache", &self.cache)
            .finish()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: our handle, created by rados_create; no ioctx or image
        // made from it outlives it (each holds an Arc<Conn>).
        unsafe { (self.lib.rados_shutdown)(self.raw) };
        tracing::debug!(cluster = %self.label, "ceph connection shut down");
    }
}

fn cstr(what: &str, s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{what} contains a NUL byte"))
}

impl Conn {
    /// Connects (blocking, bounded by the timeouts in [`DEFAULTS`] unless
    /// the operator changed them). Control plane only.
    pub fn connect(spec: &ConnSpec<'_>) -> Result<Arc<Conn>, String> {
        let lib = ffi::lib()?;
        let id = spec.user_id.map(|u| cstr("user_id", u)).transpose()?;
        let mut raw: ffi::Rados = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; `id` is NUL-terminated or null.
        let rc = unsafe {
            (lib.rados_create)(
                &mut raw,
                id.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        if rc < 0 {
            return Err(format!("rados_create: {}", ffi::describe(rc.into())));
        }
        // From here `conn` owns the handle (shut down on every error path).
        let mut conn = Conn {
            lib,
            raw,
            label: spec.label.to_string(),
            cache: false,
            users: AtomicUsize::new(0),
        };
        match spec.config_file {
            Some(path) => {
                let p = cstr("config_file", path)?;
                // SAFETY: our handle and a NUL-terminated path.
                let rc = unsafe { (lib.rados_conf_read_file)(raw, p.as_ptr()) };
                if rc < 0 {
                    return Err(format!("reading {path}: {}", ffi::describe(rc.into())));
                }
            }
            None => {
                // SAFETY: our handle; null asks for the default search path.
                let rc = unsafe { (lib.rados_conf_read_file)(raw, std::ptr::null()) };
                if rc < 0 {
                    tracing::debug!(
                        "no default ceph.conf for {} ({})",
                        spec.label,
                        ffi::describe(rc.into())
                    );
                }
            }
        }
        if let Some(k) = spec.key_file {
            conn.set("keyring", k)?;
        }
        let empty = BTreeMap::new();
        for (k, v) in merged_params(spec.params.unwrap_or(&empty)) {
            conn.set(&k, &v)?;
        }
        // SAFETY: our configured handle.
        let rc = unsafe { (lib.rados_connect)(raw) };
        if rc < 0 {
            return Err(format!(
                "cannot connect to the Ceph cluster ({}): {}",
                spec.label,
                ffi::describe(rc.into())
            ));
        }
        conn.cache = conn.get("rbd_cache").is_some_and(|v| v == "true");
        Ok(Arc::new(conn))
    }

    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        let (k, v) = (
            cstr("config_param key", key)?,
            cstr("config_param value", value)?,
        );
        // SAFETY: our handle and two NUL-terminated strings.
        let rc = unsafe { (self.lib.rados_conf_set)(self.raw, k.as_ptr(), v.as_ptr()) };
        if rc < 0 {
            return Err(format!(
                "Ceph setting {key}={value}: {}",
                ffi::describe(rc.into())
            ));
        }
        Ok(())
    }

    /// The effective value of a Ceph setting.
    pub fn get(&self, key: &str) -> Option<String> {
        let k = CString::new(key).ok()?;
        let mut buf = [0u8; 256];
        // SAFETY: our handle, a NUL-terminated key and a buffer of the
        // length we pass; librados NUL-terminates what it writes.
        let rc = unsafe {
            (self.lib.rados_conf_get)(
                self.raw,
                k.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
            )
        };
        if rc < 0 {
            return None;
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Some(String::from_utf8_lossy(&buf[..end]).into_owned())
    }
}

fn registry() -> &'static Mutex<BTreeMap<String, Arc<Conn>>> {
    static CLUSTERS: Mutex<BTreeMap<String, Arc<Conn>>> = Mutex::new(BTreeMap::new());
    &CLUSTERS
}

/// Connects to a cluster and registers the connection under `c.name`
/// (`bdev_rbd_register_cluster`). Blocking, control plane only. Fails when
/// the name is taken or the cluster cannot be reached.
pub fn register_cluster(c: &RbdCluster) -> Result<(), String> {
    if registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(&c.name)
    {
        return Err(format!("cluster {} is already registered", c.name));
    }
    let conn = Conn::connect(&ConnSpec {
        label: &c.name,
        user_id: c.user_id.as_deref(),
        config_file: c.config_file.as_deref(),
        key_file: c.key_file.as_deref(),
        params: Some(&c.config_param),
    })?;
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    if reg.contains_key(&c.name) {
        return Err(format!("cluster {} is already registered", c.name));
    }
    reg.insert(c.name.clone(), conn);
    Ok(())
}

/// Forgets a registered cluster and shuts its connection down
/// (`bdev_rbd_unregister_cluster`). Refused while a bdev uses it (as
/// SPDK does). The shutdown blocks briefly: control plane only.
pub fn unregister_cluster(name: &str) -> Result<(), String> {
    let conn = {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        match reg.get(name) {
            None => return Err(format!("no registered cluster named {name}")),
            Some(c) if c.users.load(Ordering::Acquire) > 0 => {
                return Err(format!(
                    "cluster {name} is still used by {} rbd bdev(s)",
                    c.users.load(Ordering::Acquire)
                ))
            }
            Some(_) => reg.remove(name),
        }
    };
    drop(conn);
    Ok(())
}

/// The registered cluster `name`'s connection.
pub fn cluster(name: &str) -> Option<Arc<Conn>> {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nvmfd's defaults come first and the operator's values replace
    /// them; other operator settings pass through.
    #[test]
    fn operator_params_override_defaults() {
        let none = merged_params(&BTreeMap::new());
        let get = |v: &[(String, String)], k: &str| {
            v.iter()
                .filter(|(key, _)| key == k)
                .map(|(_, val)| val.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(get(&none, "rbd_cache"), vec!["false"]);
        assert_eq!(get(&none, "rados_osd_op_timeout"), vec!["20"]);
        assert_eq!(get(&none, "client_mount_timeout"), vec!["10"]);
        let user: BTreeMap<String, String> = [
            ("rbd_cache".to_string(), "true".to_string()),
            ("mon_host".to_string(), "127.0.0.1:6789".to_string()),
        ]
        .into();
        let m = merged_params(&user);
        assert_eq!(
            get(&m, "rbd_cache"),
            vec!["true"],
            "set once, the operator's"
        );
        assert_eq!(get(&m, "mon_host"), vec!["127.0.0.1:6789"]);
        assert_eq!(get(&m, "rados_osd_op_timeout"), vec!["20"]);
    }

    #[test]
    fn unknown_cluster_is_an_error() {
        assert!(cluster("nvmfd-test-no-such-cluster").is_none());
        let e = unregister_cluster("nvmfd-test-no-such-cluster").unwrap_err();
        assert!(e.contains("no registered cluster"), "{e}");
    }
}
