//! Owns method dispatch: `RpcService` holds the configuration model
//! (`nvmf_config::TargetConfig`), the `LiveTarget` and the optional
//! `StateFile`, turns one JSON-RPC request (or a batch) into its response,
//! and implements every method: creates through
//! `TargetConfig::apply_method`, deletes/removes/queries on the model here.
//! State changes follow validate-on-a-copy → `LiveTarget::apply` → commit →
//! persist, one at a time (the change lock), so calls from several
//! connections are serialized and a failed call changes nothing. The model
//! itself is locked only briefly: queries (`bdev_get_bdevs`, `nvmf_get_*`,
//! `save_config`, ...) answer while a slow change (opening an rbd image:
//! network round trips) is being made live.

use std::sync::{Arc, Mutex, MutexGuard};

use nvmf_config::{
    format_eui64, format_nguid, format_uuid, rbd_cluster_info, rbd_driver_specific, AddressFamily,
    BdevConfig, BdevKind, FileMethod, ListenerConfig, SubsystemConfig, TargetConfig,
    TransportConfig, TransportType, DISCOVERY_NQN, SKIPPED_METHODS,
};
use serde_json::{json, Map, Value};

use crate::error::{RpcError, EBUSY, EINVAL, ENODEV, INVALID_REQUEST, METHOD_NOT_FOUND};
use crate::live::{Change, LiveTarget, NamespaceIo};
use crate::params::Params;
use crate::state_file::StateFile;

/// Methods nvmfd implements (SPDK names; `save_config`/`load_config` are
/// nvmfd's server-side versions of rpc.py's client-side commands).
pub const METHODS: &[&str] = &[
    "rpc_get_methods",
    "spdk_get_version",
    "framework_get_subsystems",
    "framework_get_config",
    "framework_wait_init",
    "save_config",
    "load_config",
    "bdev_malloc_create",
    "bdev_malloc_delete",
    "bdev_null_create",
    "bdev_null_delete",
    "bdev_uring_create",
    "bdev_uring_delete",
    "bdev_aio_create",
    "bdev_aio_delete",
    "bdev_rbd_register_cluster",
    "bdev_rbd_unregister_cluster",
    "bdev_rbd_get_clusters_info",
    "bdev_rbd_create",
    "bdev_rbd_delete",
    "bdev_rbd_resize",
    "bdev_get_bdevs",
    "bdev_get_iostat",
    "bdev_set_qos_limit",
    "nvmf_create_transport",
    "nvmf_get_transports",
    "nvmf_create_subsystem",
    "nvmf_delete_subsystem",
    "nvmf_get_subsystems",
    "nvmf_subsystem_add_ns",
    "nvmf_subsystem_remove_ns",
    "nvmf_subsystem_add_listener",
    "nvmf_subsystem_remove_listener",
    "nvmf_subsystem_add_host",
    "nvmf_subsystem_remove_host",
    "nvmf_subsystem_allow_any_host",
    "nvmf_subsystem_set_keys",
    "keyring_file_add_key",
    "keyring_file_remove_key",
    "keyring_get_keys",
    "nvmf_set_config",
    "nvmf_subsystem_get_controllers",
    "nvmf_subsystem_get_qpairs",
    "nvmf_subsystem_get_listeners",
    "nvmf_subsystem_listener_set_ana_state",
    "nvmf_subsystem_set_ns_ana_group",
    "nvmf_ns_add_host",
    "nvmf_ns_remove_host",
    "nvmf_get_stats",
    "thread_get_stats",
    "framework_get_reactors",
    "nvmf_get_path_stats",
    "nvmf_ns_get_reservation",
    "nvmf_gateway_group_status",
    "nvmf_gateway_group_move",
];

/// Methods that change state (persisted after success).
pub const STATE_CHANGING_METHODS: &[&str] = &[
    "load_config",
    "bdev_malloc_create",
    "bdev_malloc_delete",
    "bdev_null_create",
    "bdev_null_delete",
    "bdev_uring_create",
    "bdev_uring_delete",
    "bdev_aio_create",
    "bdev_aio_delete",
    "bdev_rbd_register_cluster",
    "bdev_rbd_unregister_cluster",
    "bdev_rbd_create",
    "bdev_rbd_delete",
    "bdev_rbd_resize",
    "bdev_set_qos_limit",
    "nvmf_create_transport",
    "nvmf_create_subsystem",
    "nvmf_delete_subsystem",
    "nvmf_subsystem_add_ns",
    "nvmf_subsystem_remove_ns",
    "nvmf_subsystem_add_listener",
    "nvmf_subsystem_remove_listener",
    "nvmf_subsystem_add_host",
    "nvmf_subsystem_remove_host",
    "nvmf_subsystem_allow_any_host",
    "nvmf_subsystem_set_keys",
    "keyring_file_add_key",
    "keyring_file_remove_key",
    "nvmf_set_config",
    "nvmf_ns_add_host",
    "nvmf_ns_remove_host",
];

/// `spdk_get_version`'s `version` string.
pub fn version_string() -> String {
    format!("nvmfd v{}", env!("CARGO_PKG_VERSION"))
}

struct State {
    config: TargetConfig,
    state_file: Option<StateFile>,
}

/// A state change in progress: holds the change lock (one change at a
/// time) and a copy of the model it starts from, which no other change can
/// replace meanwhile. Queries do not wait for it.
struct Begun<'a> {
    _serial: MutexGuard<'a, ()>,
    config: TargetConfig,
}

/// The JSON-RPC method handler (transport-independent; `server::serve`
/// puts it on a Unix socket).
pub struct RpcService {
    /// The model and the state file; held only briefly (reads, commit), so
    /// queries never wait for a change being made live.
    state: Mutex<State>,
    /// Serializes state changes: held while one is validated, made live
    /// (which may be slow: opening an rbd image) and committed.
    changes: Mutex<()>,
    live: Arc<dyn LiveTarget>,
}

impl RpcService {
    /// A service over `config` (what the target runs now). With a state file,
    /// every successful state change is written to it; `new` itself does not
    /// write (call [`RpcService::persist`] to save the starting config).
    pub fn new(
        config: TargetConfig,
        live: Arc<dyn LiveTarget>,
        state_file: Option<StateFile>,
    ) -> RpcService {
        RpcService {
            state: Mutex::new(State { config, state_file }),
            changes: Mutex::new(()),
            live,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a state change (see [`Begun`]).
    fn begin(&self) -> Begun<'_> {
        let serial = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let config = self.lock().config.clone();
        Begun {
            _serial: serial,
            config,
        }
    }

    /// A copy of the current model.
    pub fn config(&self) -> TargetConfig {
        self.lock().config.clone()
    }

    /// Writes the current model to the state file (if any).
    pub fn persist(&self) -> std::io::Result<()> {
        let st = self.lock();
        match &st.state_file {
            Some(f) => f.write(&st.config),
            None => Ok(()),
        }
    }

    /// Handles one decoded JSON value from the stream: a request object or a
    /// batch array. `None` when nothing is to be sent back (notifications).
    pub fn handle(&self, request: &Value) -> Option<Value> {
        match request {
            Value::Array(items) if items.is_empty() => Some(error_response(
                Value::Null,
                &RpcError::new(INVALID_REQUEST, "Invalid request: empty batch"),
            )),
            Value::Array(items) => {
                let out: Vec<Value> = items.iter().filter_map(|r| self.handle_one(r)).collect();
                if out.is_empty() {
                    None
                } else {
                    Some(Value::Array(out))
                }
            }
            other => self.handle_one(other),
        }
    }

    fn handle_one(&self, req: &Value) -> Option<Value> {
        let invalid = |why: &str| {
            Some(error_response(
                Value::Null,
                &RpcError::new(INVALID_REQUEST, format!("Invalid request: {why}")),
            ))
        };
        let Some(obj) = req.as_object() else {
            return invalid("a request must be a JSON object");
        };
        if let Some(k) = obj
            .keys()
            .find(|k| !matches!(k.as_str(), "jsonrpc" | "method" | "params" | "id"))
        {
            return invalid(&format!("unknown member \"{k}\""));
        }
        match obj.get("jsonrpc") {
            None => {}
            Some(Value::String(v)) if v == "2.0" => {}
            Some(_) => return invalid("\"jsonrpc\" must be \"2.0\""),
        }
        let id = match obj.get("id") {
            None => None,
            Some(v @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(v.clone()),
            Some(_) => return invalid("\"id\" must be a string, a number or null"),
        };
        let Some(method) = obj.get("method").and_then(Value::as_str) else {
            return invalid("\"method\" must be a string");
        };
        let params = match obj.get("params") {
            None | Some(Value::Null) => None,
            Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p),
            Some(_) => return invalid("\"params\" must be an object or an array"),
        };
        let result = self.call(method, params);
        let id = id?;
        Some(match result {
            Ok(v) => json!({ "jsonrpc": "2.0", "id": id, "result": v }),
            Err(e) => error_response(id, &e),
        })
    }

    /// Calls one method. State-changing methods take effect (model, live
    /// target, state file) only when `Ok` comes back.
    pub fn call(&self, method: &str, params: Option<&Value>) -> Result<Value, RpcError> {
        match method {
            "rpc_get_methods" => {
                let mut p = Params::new(method, params)?;
                p.opt_bool("current")?;
                p.opt_bool("include_aliases")?;
                p.finish()?;
                let mut all: Vec<&str> = METHODS.iter().chain(SKIPPED_METHODS).copied().collect();
                all.sort_unstable();
                all.dedup();
                Ok(json!(all))
            }
            "spdk_get_version" => {
                Params::new(method, params)?.finish()?;
                Ok(json!({
                    "version": version_string(),
                    "fields": {
                        "major": env!("CARGO_PKG_VERSION_MAJOR").parse::<u32>().unwrap_or(0),
                        "minor": env!("CARGO_PKG_VERSION_MINOR").parse::<u32>().unwrap_or(0),
                        "patch": env!("CARGO_PKG_VERSION_PATCH").parse::<u32>().unwrap_or(0),
                        "suffix": env!("CARGO_PKG_VERSION_PRE"),
                    }
                }))
            }
            "framework_wait_init" => {
                Params::new(method, params)?.finish()?;
                Ok(json!(true))
            }
            "framework_get_subsystems" => {
                Params::new(method, params)?.finish()?;
                Ok(json!([
                    { "subsystem": "keyring", "depends_on": [] },
                    { "subsystem": "bdev", "depends_on": [] },
                    { "subsystem": "nvmf", "depends_on": ["bdev", "keyring"] },
                ]))
            }
            "framework_get_config" => {
                let mut p = Params::new(method, params)?;
                let name = p.req_str("name")?;
                p.opt_bool("with_batches")?;
                p.finish()?;
                let doc = self.lock().config.to_json_value();
                if name == "keyring" {
                    // Written only when it has keys: names and paths, never a key.
                    return Ok(section(&doc, name).cloned().unwrap_or_else(|| json!([])));
                }
                section(&doc, name).cloned().ok_or_else(|| {
                    RpcError::invalid_params(format!(
                        "{method}: parameter \"name\": no subsystem \"{name}\" (nvmfd has \"keyring\", \"bdev\" and \"nvmf\")"
                    ))
                })
            }
            "save_config" => {
                Params::new(method, params)?.finish()?;
                Ok(self.lock().config.to_json_value())
            }
            "load_config" => self.load_config(params),
            "bdev_aio_create" => {
                // rpc.py always sends `nowait` (RWF_NOWAIT); nvmf-config's
                // model has no such parameter: accepted and ignored here.
                let mut stripped = params.cloned();
                if let Some(Value::Object(m)) = &mut stripped {
                    if let Some(v) = m.remove("nowait") {
                        if !v.is_boolean() {
                            return Err(RpcError::invalid_params(
                                "bdev_aio_create: parameter \"nowait\": expected true or false",
                            ));
                        }
                    }
                }
                self.apply_config_method(method, stripped.as_ref(), |new, _| {
                    let b = new.bdevs.last().expect("bdev was added");
                    (Change::AddBdev(b.clone()), json!(b.name))
                })
            }
            "bdev_rbd_register_cluster" => self.apply_config_method(method, params, |new, _| {
                let c = new.rbd_clusters.last().expect("cluster was added");
                (Change::RegisterRbdCluster(c.clone()), json!(c.name))
            }),
            "bdev_rbd_unregister_cluster" => self.unregister_cluster(params),
            "bdev_rbd_get_clusters_info" => self.get_clusters_info(params),
            "bdev_rbd_delete" => self.delete_bdev(method, params, BdevKind::Rbd),
            "bdev_rbd_resize" => self.resize_rbd(params),
            "bdev_set_qos_limit" => {
                // An unknown bdev is "No such device", as SPDK answers; the
                // parameters themselves are checked by the model.
                let name = params.and_then(|p| p.get("name")).and_then(Value::as_str);
                if let Some(n) = name.filter(|n| self.lock().config.bdev(n).is_none()) {
                    return Err(RpcError::new(
                        ENODEV,
                        format!("{method}: no bdev named \"{n}\" (No such device)"),
                    ));
                }
                self.apply_config_method(method, params, |_, _| {
                    let name = name.unwrap_or_default().to_string();
                    (Change::SetQosLimit { name }, json!(true))
                })
            }
            "bdev_malloc_create" | "bdev_null_create" | "bdev_uring_create" | "bdev_rbd_create" => {
                self.apply_config_method(method, params, |new, _| {
                    let b = new.bdevs.last().expect("bdev was added");
                    (Change::AddBdev(b.clone()), json!(b.name))
                })
            }
            "nvmf_create_transport" => self.apply_config_method(method, params, |new, _| {
                let t = new.transports.last().expect("transport was added");
                (Change::CreateTransport(t.clone()), json!(true))
            }),
            "nvmf_create_subsystem" => self.apply_config_method(method, params, |new, _| {
                let s = new.subsystems.last().expect("subsystem was added");
                (Change::CreateSubsystem(s.clone()), json!(true))
            }),
            "nvmf_subsystem_add_ns" => self.apply_config_method(method, params, |new, nqn| {
                let s = new.subsystem(nqn).expect("validated");
                let ns = s.namespaces.last().expect("namespace was added").clone();
                let nsid = ns.nsid;
                (
                    Change::AddNamespace {
                        nqn: nqn.to_string(),
                        ns,
                    },
                    json!(nsid),
                )
            }),
            "nvmf_subsystem_add_listener" => {
                self.apply_config_method(method, params, |new, nqn| {
                    let list = if nqn == DISCOVERY_NQN {
                        &new.discovery_listeners
                    } else {
                        &new.subsystem(nqn).expect("validated").listeners
                    };
                    let listener = list.last().expect("listener was added").clone();
                    (
                        Change::AddListener {
                            nqn: nqn.to_string(),
                            listener,
                        },
                        json!(true),
                    )
                })
            }
            "nvmf_subsystem_add_host" => self.apply_config_method(method, params, |new, nqn| {
                let host = new
                    .subsystem(nqn)
                    .and_then(|s| s.hosts.last())
                    .expect("host was added")
                    .clone();
                (
                    Change::AddHost {
                        nqn: nqn.to_string(),
                        host,
                    },
                    json!(true),
                )
            }),
            "nvmf_subsystem_set_keys" | "keyring_file_add_key" | "keyring_file_remove_key" => {
                self.apply_config_method(method, params, |_, _| (Change::AuthKeys, json!(true)))
            }
            "nvmf_set_config"
                if params
                    .and_then(Value::as_object)
                    .is_some_and(|m| m.keys().any(|k| k.starts_with("dhchap_"))) =>
            {
                self.apply_config_method(method, params, |_, _| (Change::AuthKeys, json!(true)))
            }
            "keyring_get_keys" => {
                Params::new(method, params)?.finish()?;
                // Names and files only: a key never leaves nvmfd.
                let cfg = &self.lock().config;
                Ok(Value::Array(
                    cfg.keyring
                        .iter()
                        .map(|k| {
                            let refcnt = cfg
                                .subsystems
                                .iter()
                                .flat_map(|s| s.host_keys.values())
                                .filter(|h| {
                                    h.dhchap_key == k.name
                                        || h.dhchap_ctrlr_key.as_deref() == Some(&k.name)
                                })
                                .count();
                            json!({
                                "name": k.name,
                                "path": k.path,
                                "module": "keyring_file",
                                "removed": false,
                                "probed": false,
                                "refcnt": refcnt,
                            })
                        })
                        .collect(),
                ))
            }
            "nvmf_subsystem_allow_any_host" => {
                self.apply_config_method(method, params, |new, nqn| {
                    let allow = new.subsystem(nqn).expect("validated").allow_any_host;
                    (
                        Change::AllowAnyHost {
                            nqn: nqn.to_string(),
                            allow,
                        },
                        json!(true),
                    )
                })
            }
            "nvmf_subsystem_listener_set_ana_state" | "nvmf_subsystem_set_ns_ana_group" => self
                .apply_config_method(method, params, |_, nqn| {
                    (
                        Change::AnaChange {
                            nqn: nqn.to_string(),
                        },
                        json!(true),
                    )
                }),
            "nvmf_ns_add_host" | "nvmf_ns_remove_host" => {
                self.apply_config_method(method, params, |_, nqn| {
                    let nsid = params
                        .and_then(|p| p.get("nsid"))
                        .and_then(Value::as_u64)
                        .unwrap_or(0) as u32;
                    (
                        Change::NsVisibility {
                            nqn: nqn.to_string(),
                            nsid,
                        },
                        json!(true),
                    )
                })
            }
            "bdev_malloc_delete" => self.delete_bdev(method, params, BdevKind::Malloc),
            "bdev_null_delete" => self.delete_bdev(method, params, BdevKind::Null),
            "bdev_uring_delete" => {
                self.delete_bdev(method, params, BdevKind::File(FileMethod::Uring))
            }
            "bdev_aio_delete" => self.delete_bdev(method, params, BdevKind::File(FileMethod::Aio)),
            "nvmf_delete_subsystem" => self.delete_subsystem(params),
            "nvmf_subsystem_remove_ns" => self.remove_ns(params),
            "nvmf_subsystem_remove_listener" => self.remove_listener(params),
            "nvmf_subsystem_remove_host" => self.remove_host(params),
            "bdev_get_bdevs" => self.get_bdevs(params),
            "bdev_get_iostat" => self.get_iostat(params),
            "nvmf_get_transports" => self.get_transports(params),
            "nvmf_get_subsystems" => self.get_subsystems(params),
            "nvmf_subsystem_get_listeners" => {
                let (_, nqn) = self.query_nqn(method, params)?;
                let cfg = &self.lock().config;
                if nqn == DISCOVERY_NQN {
                    return Ok(Value::Array(
                        cfg.discovery_listeners
                            .iter()
                            .map(|l| json!({ "address": listener_json(l) }))
                            .collect(),
                    ));
                }
                let s = cfg.subsystem(&nqn).expect("checked");
                Ok(Value::Array(
                    s.listeners.iter().map(|l| listener_ana_json(s, l)).collect(),
                ))
            }
            "nvmf_subsystem_get_controllers" => {
                let (_, nqn) = self.query_nqn(method, params)?;
                Ok(Value::Array(self.live.controllers(&nqn)))
            }
            "nvmf_subsystem_get_qpairs" => {
                let (_, nqn) = self.query_nqn(method, params)?;
                Ok(Value::Array(self.live.qpairs(&nqn)))
            }
            "thread_get_stats" => {
                Params::new(method, params)?.finish()?;
                Ok(self.live.thread_stats())
            }
            "framework_get_reactors" => {
                Params::new(method, params)?.finish()?;
                Ok(reactors_json(&self.live.thread_stats()))
            }
            "nvmf_get_stats" => {
                let mut p = Params::new(method, params)?;
                p.ignore(&["tgt_name"]);
                p.finish()?;
                Ok(self.live.stats())
            }
            "nvmf_get_path_stats" => {
                Params::new(method, params)?.finish()?;
                Ok(self.live.path_stats())
            }
            "nvmf_gateway_group_status" => {
                let p = Params::new(method, params)?;
                p.finish()?;
                self.live
                    .gateway_group(&crate::live::GroupRequest::Status)
                    .map_err(|e| RpcError::new(crate::error::INTERNAL_ERROR, e))
            }
            "nvmf_gateway_group_move" => {
                let mut p = Params::new(method, params)?;
                let g = p
                    .opt_u64("anagrpid", u64::from(u32::MAX))?
                    .ok_or_else(|| p.err("anagrpid", "missing"))?;
                if g == 0 {
                    return Err(p.err("anagrpid", "ANA group IDs start at 1"));
                }
                let to = p.req_str("to")?.to_string();
                p.finish()?;
                self.live
                    .gateway_group(&crate::live::GroupRequest::Move {
                        anagrpid: g as u32,
                        to,
                    })
                    .map_err(|e| RpcError::new(crate::error::INTERNAL_ERROR, e))
            }
            "nvmf_ns_get_reservation" => {
                let mut p = Params::new(method, params)?;
                let nqn = p.req_str("nqn")?.to_string();
                let nsid = p
                    .opt_u64("nsid", u64::from(u32::MAX))?
                    .ok_or_else(|| p.err("nsid", "missing"))? as u32;
                let known = self
                    .lock()
                    .config
                    .subsystem(&nqn)
                    .map(|s| s.namespace(nsid).is_some());
                let found = match known {
                    None => Err(p.err("nqn", format!("no subsystem \"{nqn}\""))),
                    Some(false) => Err(p.err(
                        "nsid",
                        format!("subsystem \"{nqn}\" has no namespace {nsid}"),
                    )),
                    Some(true) => self.live.reservation(&nqn, nsid).ok_or_else(|| {
                        p.err(
                            "nsid",
                            format!("namespace {nsid} of \"{nqn}\" is not live yet"),
                        )
                    }),
                };
                p.finish()?;
                found
            }
            m if SKIPPED_METHODS.contains(&m) => {
                // SPDK-internal tuning (what SPDK's save_config emits for
                // iobuf, sock, accel, ...): checked for shape, no effect.
                let mut scratch = TargetConfig::default();
                scratch
                    .apply_method(m, params)
                    .map_err(|e| RpcError::from_config(m, &e))?;
                Ok(json!(true))
            }
            _ => Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!("Method not found: \"{method}\" (rpc_get_methods lists the methods nvmfd implements)"),
            )),
        }
    }

    /// validate on a copy → live.apply → commit → persist.
    fn commit(
        &self,
        method: &str,
        begun: Begun<'_>,
        new: TargetConfig,
        change: Change,
        result: Value,
    ) -> Result<Value, RpcError> {
        self.live.apply(&change, &new).map_err(|e| {
            RpcError::internal(format!(
                "{method}: the running target could not apply the change ({}): {e}",
                change.kind()
            ))
        })?;
        let mut st = self.lock();
        st.config = new;
        drop(begun);
        if let Some(f) = &st.state_file {
            f.write(&st.config).map_err(|e| {
                RpcError::internal(format!(
                    "{method}: the change is live but could not be saved to the state file: {e}"
                ))
            })?;
        }
        Ok(result)
    }

    fn apply_config_method(
        &self,
        method: &str,
        params: Option<&Value>,
        change_of: impl FnOnce(&TargetConfig, &str) -> (Change, Value),
    ) -> Result<Value, RpcError> {
        let st = self.begin();
        let mut new = st.config.clone();
        new.apply_method(method, params)
            .map_err(|e| RpcError::from_config(method, &e))?;
        let nqn = params
            .and_then(|p| p.get("nqn"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let (change, result) = change_of(&new, nqn);
        self.commit(method, st, new, change, result)
    }

    fn load_config(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "load_config";
        let doc =
            match params {
                Some(v @ Value::Object(_)) => v,
                _ => return Err(RpcError::invalid_params(
                    "load_config: params must be a save_config document {\"subsystems\": [...]}",
                )),
            };
        let new = TargetConfig::from_json_value(doc)
            .map_err(|e| RpcError::invalid_params(format!("load_config: {e}")))?;
        let st = self.begin();
        self.commit(method, st, new, Change::LoadConfig, json!(true))
    }

    fn delete_bdev(
        &self,
        method: &str,
        params: Option<&Value>,
        kind: BdevKind,
    ) -> Result<Value, RpcError> {
        let mut p = Params::new(method, params)?;
        let name = p.req_str("name")?;
        p.finish()?;
        let st = self.begin();
        let Some(b) = st.config.bdev(name) else {
            return Err(RpcError::new(
                ENODEV,
                format!("{method}: no bdev named \"{name}\" (No such device)"),
            ));
        };
        if b.kind != kind {
            return Err(RpcError::new(
                ENODEV,
                format!(
                    "{method}: bdev \"{name}\" was created by {}, not by {} (No such device)",
                    b.kind.create_method(),
                    kind.create_method()
                ),
            ));
        }
        if let Some((nqn, nsid)) = claim_of(&st.config, name) {
            return Err(RpcError::new(
                EBUSY,
                format!(
                    "{method}: bdev \"{name}\" is namespace {nsid} of subsystem \"{nqn}\"; \
                     remove it first with nvmf_subsystem_remove_ns (Device or resource busy)"
                ),
            ));
        }
        let mut new = st.config.clone();
        new.bdevs.retain(|b| b.name != name);
        new.bdev_qos.remove(name);
        let change = Change::DeleteBdev {
            name: name.to_string(),
        };
        self.commit(method, st, new, change, json!(true))
    }

    fn unregister_cluster(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "bdev_rbd_unregister_cluster";
        let mut p = Params::new(method, params)?;
        let name = p.req_str("name")?;
        p.finish()?;
        let st = self.begin();
        if st.config.rbd_cluster(name).is_none() {
            return Err(RpcError::new(
                ENODEV,
                format!("{method}: no cluster named \"{name}\" is registered (No such device)"),
            ));
        }
        if let Some(b) = st.config.rbd_cluster_user(name) {
            return Err(RpcError::new(
                EBUSY,
                format!(
                    "{method}: cluster \"{name}\" is used by rbd bdev \"{}\"; delete it first \
                     with bdev_rbd_delete (Device or resource busy)",
                    b.name
                ),
            ));
        }
        let mut new = st.config.clone();
        new.rbd_clusters.retain(|c| c.name != name);
        let change = Change::UnregisterRbdCluster {
            name: name.to_string(),
        };
        self.commit(method, st, new, change, json!(true))
    }

    fn get_clusters_info(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "bdev_rbd_get_clusters_info";
        let mut p = Params::new(method, params)?;
        let name = p.opt_str("name")?;
        p.finish()?;
        let st = self.lock();
        match name {
            // As SPDK: one object for a named cluster, else a list.
            Some(n) => st
                .config
                .rbd_cluster(n)
                .map(rbd_cluster_info)
                .ok_or_else(|| {
                    RpcError::new(
                        ENODEV,
                        format!(
                            "{method}: no cluster named \"{n}\" is registered (No such device)"
                        ),
                    )
                }),
            None => Ok(Value::Array(
                st.config
                    .rbd_clusters
                    .iter()
                    .map(rbd_cluster_info)
                    .collect(),
            )),
        }
    }

    /// `bdev_rbd_resize`: name, new_size in MiB. As SPDK, a size below the
    /// current one (compared in MiB) is refused; the image grows in the
    /// cluster and every namespace on the bdev takes the new size.
    fn resize_rbd(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "bdev_rbd_resize";
        let mut p = Params::new(method, params)?;
        let name = p.req_str("name")?;
        let new_mib = p
            .opt_u64("new_size", u64::MAX)?
            .ok_or_else(|| p.err("new_size", "missing required parameter"))?;
        p.finish()?;
        let st = self.begin();
        let Some(b) = st.config.bdev(name) else {
            return Err(RpcError::new(
                ENODEV,
                format!("{method}: no bdev named \"{name}\" (No such device)"),
            ));
        };
        if b.kind != BdevKind::Rbd {
            return Err(RpcError::new(
                EINVAL,
                format!(
                    "{method}: bdev \"{name}\" was created by {}, not by bdev_rbd_create (Invalid argument)",
                    b.kind.create_method()
                ),
            ));
        }
        if b.read_only() {
            return Err(RpcError::new(
                EINVAL,
                format!(
                    "{method}: bdev \"{name}\" is read-only (read_only): its image is open \
                     read-only and cannot be resized through it (Invalid argument)"
                ),
            ));
        }
        const MIB: u64 = 1 << 20;
        let bs = u64::from(b.block_size);
        let current = self.live.bdev_num_blocks(name).unwrap_or(b.num_blocks);
        let current_mib = current.saturating_mul(bs) / MIB;
        if new_mib < current_mib {
            return Err(RpcError::new(
                EINVAL,
                format!(
                    "{method}: parameter \"new_size\": {new_mib} MiB is smaller than the current \
                     size of \"{name}\" ({current_mib} MiB); rbd bdevs only grow (Invalid argument)"
                ),
            ));
        }
        let Some(num_blocks) = new_mib.checked_mul(MIB).map(|bytes| bytes / bs) else {
            return Err(RpcError::new(
                EINVAL,
                format!("{method}: parameter \"new_size\": {new_mib} MiB is too large"),
            ));
        };
        let new = st.config.clone();
        let change = Change::ResizeBdev {
            name: name.to_string(),
            num_blocks,
        };
        self.commit(method, st, new, change, json!(true))
    }

    fn subsystem_index(cfg: &TargetConfig, p: &Params<'_>, nqn: &str) -> Result<usize, RpcError> {
        if nqn == DISCOVERY_NQN {
            return Err(p.err("nqn", "not possible on the discovery subsystem"));
        }
        cfg.subsystems
            .iter()
            .position(|s| s.nqn == nqn)
            .ok_or_else(|| p.err("nqn", format!("no subsystem \"{nqn}\"")))
    }

    fn delete_subsystem(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "nvmf_delete_subsystem";
        let mut p = Params::new(method, params)?;
        let nqn = p.req_str("nqn")?;
        p.ignore(&["tgt_name"]);
        let st = self.begin();
        let si = Self::subsystem_index(&st.config, &p, nqn)?;
        p.finish()?;
        let mut new = st.config.clone();
        new.subsystems.remove(si);
        let change = Change::DeleteSubsystem {
            nqn: nqn.to_string(),
        };
        self.commit(method, st, new, change, json!(true))
    }

    fn remove_ns(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "nvmf_subsystem_remove_ns";
        let mut p = Params::new(method, params)?;
        let nqn = p.req_str("nqn")?;
        let nsid = p
            .opt_u64("nsid", u64::from(u32::MAX))?
            .ok_or_else(|| p.err("nsid", "missing required parameter"))? as u32;
        p.ignore(&["tgt_name"]);
        let st = self.begin();
        let si = Self::subsystem_index(&st.config, &p, nqn)?;
        if st.config.subsystems[si].namespace(nsid).is_none() {
            return Err(p.err(
                "nsid",
                format!("subsystem \"{nqn}\" has no namespace with NSID {nsid}"),
            ));
        }
        p.finish()?;
        let mut new = st.config.clone();
        new.subsystems[si].namespaces.retain(|ns| ns.nsid != nsid);
        new.subsystems[si].ns_visibility.remove(&nsid);
        let change = Change::RemoveNamespace {
            nqn: nqn.to_string(),
            nsid,
        };
        self.commit(method, st, new, change, json!(true))
    }

    fn remove_listener(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "nvmf_subsystem_remove_listener";
        let mut p = Params::new(method, params)?;
        let nqn = p.req_str("nqn")?;
        let addr = p
            .opt_object("listen_address")?
            .ok_or_else(|| p.err("listen_address", "missing required parameter"))?;
        p.ignore(&["tgt_name"]);
        p.finish()?;
        let la = Value::Object(addr.clone());
        let mut a = Params::new("nvmf_subsystem_remove_listener: listen_address", Some(&la))?;
        let trstr = a.req_str("trtype")?;
        let trtype = TransportType::parse(trstr).ok_or_else(|| {
            a.err(
                "trtype",
                format!("transport \"{trstr}\" is not supported by nvmfd (TCP and RDMA are)"),
            )
        })?;
        let traddr = a.req_str("traddr")?;
        let trsvcid = a.opt_str("trsvcid")?;
        let adrfam = match a.opt_str("adrfam")? {
            Some(f) => Some(AddressFamily::parse(f).ok_or_else(|| {
                a.err(
                    "adrfam",
                    format!("address family \"{f}\" is not supported (IPv4 or IPv6)"),
                )
            })?),
            None => None,
        };
        a.finish()?;
        let matches = |l: &ListenerConfig| {
            l.trtype == trtype
                && l.traddr == traddr
                && trsvcid.is_none_or(|s| l.trsvcid == s)
                && adrfam.is_none_or(|f| l.adrfam == f)
        };
        let st = self.begin();
        let mut new = st.config.clone();
        let list = if nqn == DISCOVERY_NQN {
            &mut new.discovery_listeners
        } else {
            let pp = Params::new(method, None)?;
            let si = Self::subsystem_index(&st.config, &pp, nqn)?;
            &mut new.subsystems[si].listeners
        };
        let Some(pos) = list.iter().position(matches) else {
            return Err(RpcError::invalid_params(format!(
                "{method}: parameter \"listen_address\": subsystem \"{nqn}\" does not listen on {traddr}:{}",
                trsvcid.unwrap_or("*")
            )));
        };
        let listener = list.remove(pos);
        new.secure_discovery_listeners
            .retain(|l| nqn != DISCOVERY_NQN || l != &listener);
        if let Some(s) = new.subsystems.iter_mut().find(|s| s.nqn == nqn) {
            // As SPDK: a listener added again starts from its add_listener state.
            s.forget_ana_states(&listener);
            s.secure_listeners.retain(|l| l != &listener);
        }
        let change = Change::RemoveListener {
            nqn: nqn.to_string(),
            listener,
        };
        self.commit(method, st, new, change, json!(true))
    }

    fn remove_host(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "nvmf_subsystem_remove_host";
        let mut p = Params::new(method, params)?;
        let nqn = p.req_str("nqn")?;
        let host = p.req_str("host")?;
        p.ignore(&["tgt_name", "timeout_ms"]);
        let st = self.begin();
        let si = Self::subsystem_index(&st.config, &p, nqn)?;
        if !st.config.subsystems[si].hosts.iter().any(|h| h == host) {
            return Err(p.err(
                "host",
                format!("host \"{host}\" is not on the allowed list of subsystem \"{nqn}\""),
            ));
        }
        p.finish()?;
        let mut new = st.config.clone();
        new.subsystems[si].hosts.retain(|h| h != host);
        new.subsystems[si].host_keys.remove(host);
        new.subsystems[si].host_psks.remove(host);
        let change = Change::RemoveHost {
            nqn: nqn.to_string(),
            host: host.to_string(),
        };
        self.commit(method, st, new, change, json!(true))
    }

    /// `{nqn, tgt_name?}` of a per-subsystem query; the subsystem must exist
    /// (the discovery NQN is allowed).
    fn query_nqn(&self, method: &str, params: Option<&Value>) -> Result<((), String), RpcError> {
        let mut p = Params::new(method, params)?;
        let nqn = p.req_str("nqn")?;
        p.ignore(&["tgt_name"]);
        p.finish()?;
        if nqn != DISCOVERY_NQN && self.lock().config.subsystem(nqn).is_none() {
            let p = Params::new(method, None)?;
            return Err(p.err("nqn", format!("no subsystem \"{nqn}\"")));
        }
        Ok(((), nqn.to_string()))
    }

    fn get_bdevs(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "bdev_get_bdevs";
        let mut p = Params::new(method, params)?;
        let name = p.opt_str("name")?;
        p.opt_u64("timeout", u64::MAX)?;
        p.finish()?;
        let st = self.lock();
        let cfg = &st.config;
        match name {
            Some(n) => {
                let b = cfg.bdev(n).ok_or_else(|| {
                    RpcError::new(
                        ENODEV,
                        format!("{method}: no bdev named \"{n}\" (No such device)"),
                    )
                })?;
                Ok(json!([bdev_json(cfg, b, self.live.as_ref())]))
            }
            None => Ok(Value::Array(
                cfg.bdevs
                    .iter()
                    .map(|b| bdev_json(cfg, b, self.live.as_ref()))
                    .collect(),
            )),
        }
    }

    /// `bdev_get_iostat`: SPDK's shape from the per-namespace Read/Write
    /// counters of the running target, each namespace's added to its bdev
    /// (docs/RPC.md says what is and is not counted).
    fn get_iostat(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "bdev_get_iostat";
        let mut p = Params::new(method, params)?;
        // v26.05's rpc.py sends `names` (array); older ones `name`.
        let name = p.opt_str("name")?;
        let names = p.opt_str_list("names")?;
        let per_channel = p.opt_bool("per_channel")?.unwrap_or(false);
        let reset_mode = p.opt_str("reset_mode")?;
        if per_channel {
            return Err(p.err(
                "per_channel",
                "true is not supported: nvmfd counts per queue pair and per path \
                 (nvmf_get_path_stats), not per bdev channel",
            ));
        }
        match reset_mode {
            None | Some("none") => {}
            Some("all" | "maxmin" | "error") => {
                return Err(p.err(
                    "reset_mode",
                    "only \"none\": nvmfd's counters run from start and are shared with \
                     nvmf_get_stats and nvmf_get_path_stats; take differences between two calls",
                ))
            }
            Some(m) => {
                return Err(p.err(
                    "reset_mode",
                    format!("{m:?} is not one of all, maxmin, error, none"),
                ))
            }
        }
        p.finish()?;
        let wanted: Option<Vec<&str>> = match (name, names) {
            (Some(_), Some(_)) => {
                return Err(RpcError::invalid_params(format!(
                    "{method}: give \"names\" or \"name\", not both"
                )))
            }
            (Some(n), None) => Some(vec![n]),
            (None, l) => l,
        };
        let cfg = self.lock().config.clone();
        let bdevs: Vec<&BdevConfig> = match &wanted {
            None => cfg.bdevs.iter().collect(),
            Some(list) => list
                .iter()
                .map(|n| {
                    cfg.bdev(n).ok_or_else(|| {
                        RpcError::new(
                            ENODEV,
                            format!("{method}: no bdev named \"{n}\" (No such device)"),
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let (ticks, io) = self.live.namespace_io();
        let entries: Vec<Value> = bdevs
            .iter()
            .map(|b| {
                let mut t = NamespaceIo::default();
                // Every namespace on the bdev (nvmfd lets one bdev back one
                // namespace; a sum keeps it right if that changes).
                for s in &cfg.subsystems {
                    for ns in s.namespaces.iter().filter(|ns| ns.bdev_name == b.name) {
                        for n in io.iter().filter(|n| n.nqn == s.nqn && n.nsid == ns.nsid) {
                            t.reads += n.reads;
                            t.writes += n.writes;
                            t.bytes_read += n.bytes_read;
                            t.bytes_written += n.bytes_written;
                            t.read_latency_ns += n.read_latency_ns;
                            t.write_latency_ns += n.write_latency_ns;
                        }
                    }
                }
                json!({
                    "name": b.name,
                    "bytes_read": t.bytes_read,
                    "num_read_ops": t.reads,
                    "bytes_written": t.bytes_written,
                    "num_write_ops": t.writes,
                    "bytes_unmapped": 0,
                    "num_unmap_ops": 0,
                    "bytes_copied": 0,
                    "num_copy_ops": 0,
                    "read_latency_ticks": t.read_latency_ns,
                    "write_latency_ticks": t.write_latency_ns,
                    "unmap_latency_ticks": 0,
                    "copy_latency_ticks": 0,
                    // nvmfd's addition: Reads and Writes that waited for
                    // the bdev's QoS tokens (bdev_set_qos_limit).
                    "qos_throttled_ios": self.live.bdev_qos_throttled(&b.name),
                })
            })
            .collect();
        // 1 tick = 1 ns.
        Ok(json!({ "tick_rate": 1_000_000_000u64, "ticks": ticks, "bdevs": entries }))
    }

    fn get_transports(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "nvmf_get_transports";
        let mut p = Params::new(method, params)?;
        let trtype = p.opt_str("trtype")?;
        p.ignore(&["tgt_name"]);
        p.finish()?;
        let st = self.lock();
        let list: Vec<Value> = st
            .config
            .transports
            .iter()
            .filter(|t| trtype.is_none_or(|s| t.trtype.as_str().eq_ignore_ascii_case(s)))
            .map(transport_json)
            .collect();
        if let (Some(t), true) = (trtype, list.is_empty()) {
            return Err(RpcError::invalid_params(format!(
                "{method}: parameter \"trtype\": no {t} transport"
            )));
        }
        Ok(Value::Array(list))
    }

    fn get_subsystems(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let method = "nvmf_get_subsystems";
        let mut p = Params::new(method, params)?;
        let nqn = p.opt_str("nqn")?;
        p.ignore(&["tgt_name"]);
        p.finish()?;
        let st = self.lock();
        let cfg = &st.config;
        let mut all = vec![discovery_json(cfg)];
        all.extend(cfg.subsystems.iter().map(subsystem_json));
        match nqn {
            None => Ok(Value::Array(all)),
            Some(n) => {
                let one: Vec<Value> = all.into_iter().filter(|s| s["nqn"] == n).collect();
                if one.is_empty() {
                    let p = Params::new(method, None)?;
                    return Err(p.err("nqn", format!("no subsystem \"{n}\"")));
                }
                Ok(Value::Array(one))
            }
        }
    }
}

fn error_response(id: Value, e: &RpcError) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": e.to_json() })
}

/// The `config` array of one `save_config` section.
fn section<'a>(doc: &'a Value, name: &str) -> Option<&'a Value> {
    doc["subsystems"]
        .as_array()?
        .iter()
        .find(|s| s["subsystem"] == name)
        .map(|s| &s["config"])
}

/// (subsystem NQN, NSID) of the namespace that uses bdev `name`.
pub(crate) fn claim_of<'a>(cfg: &'a TargetConfig, name: &str) -> Option<(&'a str, u32)> {
    cfg.subsystems.iter().find_map(|s| {
        s.namespaces
            .iter()
            .find(|ns| ns.bdev_name == name)
            .map(|ns| (s.nqn.as_str(), ns.nsid))
    })
}

fn bdev_json(cfg: &TargetConfig, b: &BdevConfig, live: &dyn LiveTarget) -> Value {
    let claimed = claim_of(cfg, &b.name).is_some();
    let mut m = Map::new();
    m.insert("name".into(), json!(b.name));
    m.insert("aliases".into(), json!([]));
    m.insert(
        "product_name".into(),
        json!(match b.kind {
            BdevKind::Malloc => "Malloc disk",
            BdevKind::Null => "Null disk",
            // SPDK's product names for bdev_uring / bdev_aio.
            BdevKind::File(FileMethod::Uring) => "URING bdev",
            BdevKind::File(FileMethod::Aio) => "AIO disk",
            BdevKind::Rbd => "Ceph Rbd Disk",
        }),
    );
    m.insert("block_size".into(), json!(b.block_size));
    let num_blocks = live.bdev_num_blocks(&b.name).unwrap_or(b.num_blocks);
    m.insert("num_blocks".into(), json!(num_blocks));
    if let Some(u) = &b.uuid {
        m.insert("uuid".into(), json!(u.to_string()));
    }
    m.insert("claimed".into(), json!(claimed));
    if claimed {
        m.insert("claim_type".into(), json!("exclusive_write"));
    }
    m.insert("zoned".into(), json!(false));
    // SPDK's four keys, 0 = no limit (bdev_set_qos_limit).
    m.insert(
        "assigned_rate_limits".into(),
        cfg.qos_limits(&b.name).to_json(),
    );
    // A read-only bdev (rbd read_only, file readonly) says so as SPDK's
    // does: no write, unmap or write zeroes.
    let writable = !b.read_only();
    m.insert(
        "supported_io_types".into(),
        json!({
            "read": true, "write": writable, "unmap": writable, "write_zeroes": writable,
            "flush": true, "reset": true, "nvme_admin": false, "nvme_io": false,
        }),
    );
    m.insert(
        "driver_specific".into(),
        match &b.rbd {
            Some(r) => rbd_driver_specific(cfg, r),
            None => json!({}),
        },
    );
    Value::Object(m)
}

/// One transport as `nvmf_get_transports` shows it: SPDK's option names,
/// the RDMA options for an RDMA transport (what save_config writes).
fn transport_json(t: &TransportConfig) -> Value {
    t.to_json_params()
}

fn listener_json(l: &ListenerConfig) -> Value {
    json!({
        "trtype": l.trtype.as_str(),
        "adrfam": l.adrfam.as_str(),
        "traddr": l.traddr,
        "trsvcid": l.trsvcid,
    })
}

fn discovery_json(cfg: &TargetConfig) -> Value {
    json!({
        "nqn": DISCOVERY_NQN,
        "subtype": "Discovery",
        "listen_addresses": cfg.discovery_listeners.iter().map(listener_json).collect::<Vec<_>>(),
        "allow_any_host": true,
        "hosts": [],
    })
}

fn subsystem_json(s: &SubsystemConfig) -> Value {
    json!({
        "nqn": s.nqn,
        "subtype": "NVMe",
        "listen_addresses": s.listeners.iter().map(listener_json).collect::<Vec<_>>(),
        "allow_any_host": s.allow_any_host,
        "hosts": s.hosts.iter().map(|h| json!({ "nqn": h })).collect::<Vec<_>>(),
        "serial_number": s.serial_number,
        "model_number": s.model_number,
        "max_namespaces": s.max_namespaces,
        "min_cntlid": s.min_cntlid,
        "max_cntlid": s.max_cntlid,
        "ana_reporting": s.ana_reporting,
        "namespaces": s.namespaces.iter().map(|ns| json!({
            "nsid": ns.nsid,
            "bdev_name": ns.bdev_name,
            "name": ns.bdev_name,
            "nguid": format_nguid(&ns.nguid),
            "eui64": format_eui64(&ns.eui64),
            "uuid": format_uuid(&ns.uuid),
            "anagrpid": ns.anagrpid,
        })).collect::<Vec<_>>(),
    })
}

/// One entry of `nvmf_subsystem_get_listeners`: the address and, with ANA
/// reporting, the state of every ANA group (SPDK's shape: `ana_states` =
/// `[{ana_group, ana_state}]` for groups 1..=max_namespaces).
fn listener_ana_json(s: &SubsystemConfig, l: &ListenerConfig) -> Value {
    let mut v = json!({ "address": listener_json(l) });
    if s.ana_reporting {
        v["ana_states"] = Value::Array(
            (1..=s.ana_group_max())
                .map(|g| json!({ "ana_group": g, "ana_state": s.ana_state(l, g).as_str() }))
                .collect(),
        );
    }
    v
}

/// SPDK's `framework_get_reactors` from `thread_get_stats`' answer: nvmfd
/// runs one thread per reactor, so each reactor (`lcore` = its CPU, or its
/// index when not pinned) lists its one thread; `busy`/`idle` are the
/// reactor's, `irq`/`sys` are 0 (not measured), `in_interrupt` false
/// (nvmfd's reactors sleep in epoll when idle whatever SPDK's mode says).
pub fn reactors_json(threads: &Value) -> Value {
    let tick_rate = threads["tick_rate"].clone();
    let reactors: Vec<Value> = threads["threads"]
        .as_array()
        .map(|v| v.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|t| {
            let mask = t["cpumask"].as_str().unwrap_or("");
            let lcore = u128::from_str_radix(mask, 16)
                .ok()
                .filter(|m| *m != 0)
                .map(|m| u64::from(m.trailing_zeros()))
                .unwrap_or_else(|| t["id"].as_u64().unwrap_or(1).saturating_sub(1));
            let (busy, idle) = (
                t["busy"].as_u64().unwrap_or(0),
                t["idle"].as_u64().unwrap_or(0),
            );
            json!({
                "lcore": lcore,
                "busy": busy,
                "idle": idle,
                "irq": 0,
                "sys": 0,
                "in_interrupt": false,
                "lw_threads": [{
                    "name": t["name"],
                    "id": t["id"],
                    "cpumask": mask,
                    "elapsed": busy + idle,
                }],
            })
        })
        .collect();
    json!({ "tick_rate": tick_rate, "pid": std::process::id(), "reactors": reactors })
}

#[cfg(test)]
mod reactors_tests {
    use super::*;

    #[test]
    fn reactors_come_from_the_thread_stats() {
        let t = json!({"tick_rate": 1_000_000_000u64, "threads": [
            {"name": "nvmf_tgt_poll_group_000", "id": 1, "cpumask": "4", "busy": 30, "idle": 70},
            {"name": "nvmf_tgt_poll_group_001", "id": 2, "cpumask": "", "busy": 5, "idle": 5},
        ]});
        let r = reactors_json(&t);
        assert_eq!(r["tick_rate"], 1_000_000_000u64);
        let rs = r["reactors"].as_array().unwrap();
        assert_eq!(rs.len(), 2);
        assert_eq!(rs[0]["lcore"], 2, "CPU 2 from cpumask 0x4");
        assert_eq!(rs[0]["busy"], 30);
        assert_eq!(rs[0]["lw_threads"][0]["name"], "nvmf_tgt_poll_group_000");
        assert_eq!(rs[0]["lw_threads"][0]["elapsed"], 100);
        assert_eq!(rs[1]["lcore"], 1, "not pinned: the reactor's index");
    }
}
