//! Owns writing a `TargetConfig` back as SPDK `save_config`-shaped JSON: a
//! `keyring` section (key names and file paths only, never a key), a
//! `bdev` section (registered Ceph clusters, then bdevs) then an `nvmf`
//! section, entries in SPDK's order (nvmf_set_config's DH-HMAC-CHAP lists, transports,
//! subsystems, hosts, namespaces (each followed by its `nvmf_ns_add_host`
//! entries when it is `no_auto_visible`), listeners; a transport's type-specific
//! options with it), namespace identifiers explicit,
//! so loading the output yields the same `TargetConfig`.

use serde_json::{json, Map, Value};

use crate::ids::{format_eui64, format_nguid, format_uuid};
use crate::nqn::DISCOVERY_NQN;
use crate::{AnaState, BdevKind, ListenerConfig, RdmaOptions, TargetConfig, TransportConfig};

fn entry(method: &str, params: Value) -> Value {
    json!({ "method": method, "params": params })
}

fn listen_address(l: &ListenerConfig) -> Value {
    json!({
        "trtype": l.trtype.as_str(),
        "adrfam": l.adrfam.as_str(),
        "traddr": l.traddr,
        "trsvcid": l.trsvcid,
    })
}

/// `nvmf_subsystem_add_listener`, with the listener's all-groups ANA state
/// (`ana_state`) when one was set.
fn listener(nqn: &str, l: &ListenerConfig, ana_state: Option<AnaState>, secure: bool) -> Value {
    let mut params = json!({ "nqn": nqn, "listen_address": listen_address(l) });
    if secure {
        params["secure_channel"] = json!(true);
    }
    if let Some(st) = ana_state {
        params["ana_state"] = json!(st.as_str());
    }
    entry("nvmf_subsystem_add_listener", params)
}

/// `nvmf_create_transport`'s params: the common options, then TCP's
/// `c2h_success` or the RDMA options (as SPDK's save_config: `num_cqe` only
/// when it matters, i.e. without SRQ, or when it is not the default).
pub(crate) fn transport_params(t: &TransportConfig) -> Value {
    let mut p = json!({
        "trtype": t.trtype.as_str(),
        "max_queue_depth": t.max_queue_depth,
        "max_io_qpairs_per_ctrlr": t.max_io_qpairs_per_ctrlr,
        "in_capsule_data_size": t.in_capsule_data_size,
        "max_io_size": t.max_io_size,
        "io_unit_size": t.io_unit_size,
        "max_aq_depth": t.max_aq_depth,
        "num_shared_buffers": t.num_shared_buffers,
    });
    match &t.rdma {
        None => p["c2h_success"] = json!(t.c2h_success),
        Some(r) => {
            p["max_srq_depth"] = json!(r.max_srq_depth);
            p["no_srq"] = json!(r.no_srq);
            if r.no_srq || r.num_cqe != RdmaOptions::default().num_cqe {
                p["num_cqe"] = json!(r.num_cqe);
            }
            p["acceptor_backlog"] = json!(r.acceptor_backlog);
            p["no_wr_batching"] = json!(r.no_wr_batching);
        }
    }
    p
}

/// The creation entry of bdev `b` (its method and parameters).
fn bdev_entry(b: &crate::BdevConfig) -> Value {
    if let (BdevKind::File(m), Some(f)) = (b.kind, &b.file) {
        return entry(b.kind.create_method(), crate::file_bdev::params(b, f, m));
    }
    if let (BdevKind::Rbd, Some(r)) = (b.kind, &b.rbd) {
        return entry(b.kind.create_method(), crate::rbd_bdev::bdev_params(b, r));
    }
    let mut p = Map::new();
    p.insert("name".into(), json!(b.name));
    p.insert("num_blocks".into(), json!(b.num_blocks));
    p.insert("block_size".into(), json!(b.block_size));
    if let Some(u) = &b.uuid {
        p.insert("uuid".into(), json!(u.to_string()));
    }
    entry(b.kind.create_method(), Value::Object(p))
}

pub(crate) fn to_json_value(cfg: &TargetConfig) -> Value {
    // Registered Ceph clusters first: rbd bdevs name them.
    let clusters = cfg.rbd_clusters.iter().map(|c| {
        entry(
            "bdev_rbd_register_cluster",
            crate::rbd_bdev::cluster_params(c),
        )
    });
    let bdevs: Vec<Value> = clusters
        .chain(cfg.bdevs.iter().flat_map(|b| {
            // A bdev's QoS limits right after its creation, as SPDK writes them.
            std::iter::once(bdev_entry(b)).chain(crate::qos::entry(cfg, &b.name))
        }))
        .collect();

    let mut nvmf = Vec::new();
    if let Some(e) = crate::keyring::set_config_entry(cfg) {
        nvmf.push(e);
    }
    for t in &cfg.transports {
        nvmf.push(entry("nvmf_create_transport", transport_params(t)));
    }
    for s in &cfg.subsystems {
        nvmf.push(entry(
            "nvmf_create_subsystem",
            json!({
                "nqn": s.nqn,
                "allow_any_host": s.allow_any_host,
                "serial_number": s.serial_number,
                "model_number": s.model_number,
                "max_namespaces": s.max_namespaces,
                "min_cntlid": s.min_cntlid,
                "max_cntlid": s.max_cntlid,
                "ana_reporting": s.ana_reporting,
            }),
        ));
    }
    for s in &cfg.subsystems {
        for h in &s.hosts {
            let mut params = json!({ "nqn": s.nqn, "host": h });
            if let Some(k) = s.host_keys.get(h) {
                params["dhchap_key"] = json!(k.dhchap_key);
                if let Some(c) = &k.dhchap_ctrlr_key {
                    params["dhchap_ctrlr_key"] = json!(c);
                }
            }
            if let Some(k) = s.host_psks.get(h) {
                params["psk"] = json!(k);
            }
            nvmf.push(entry("nvmf_subsystem_add_host", params));
        }
    }
    for s in &cfg.subsystems {
        for ns in &s.namespaces {
            let mut params = json!({
                "nqn": s.nqn,
                "namespace": {
                    "nsid": ns.nsid,
                    "bdev_name": ns.bdev_name,
                    "nguid": format_nguid(&ns.nguid),
                    "eui64": format_eui64(&ns.eui64),
                    "uuid": format_uuid(&ns.uuid),
                },
            });
            // As SPDK: with ANA reporting (and whenever it is not the default).
            if s.ana_reporting || ns.anagrpid != ns.nsid {
                params["namespace"]["anagrpid"] = json!(ns.anagrpid);
            }
            if let Some(f) = &ns.ptpl_file {
                params["namespace"]["ptpl_file"] = json!(f);
            }
            // Per-host visibility as SPDK writes it: the namespace with
            // no_auto_visible, then one nvmf_ns_add_host per host.
            let visible_to = s.ns_visibility.get(&ns.nsid);
            if visible_to.is_some() {
                params["namespace"]["no_auto_visible"] = json!(true);
            }
            nvmf.push(entry("nvmf_subsystem_add_ns", params));
            for h in visible_to.into_iter().flatten() {
                nvmf.push(entry(
                    "nvmf_ns_add_host",
                    json!({ "nqn": s.nqn, "nsid": ns.nsid, "host": h }),
                ));
            }
        }
    }
    for l in &cfg.discovery_listeners {
        nvmf.push(listener(
            DISCOVERY_NQN,
            l,
            None,
            cfg.secure_discovery_listeners.contains(l),
        ));
    }
    for s in &cfg.subsystems {
        for l in &s.listeners {
            let all = s
                .ana_states
                .iter()
                .find(|e| &e.listener == l && e.anagrpid.is_none())
                .map(|e| e.state);
            nvmf.push(listener(&s.nqn, l, all, s.secure_listeners.contains(l)));
            // Per-group states (SPDK's save_config drops them; nvmfd keeps them).
            for e in s.ana_states.iter().filter(|e| &e.listener == l) {
                if let Some(g) = e.anagrpid {
                    nvmf.push(entry(
                        "nvmf_subsystem_listener_set_ana_state",
                        json!({
                            "nqn": s.nqn,
                            "listen_address": listen_address(l),
                            "ana_state": e.state.as_str(),
                            "anagrpid": g,
                        }),
                    ));
                }
            }
        }
    }

    let mut sections = Vec::new();
    if !cfg.keyring.is_empty() {
        sections.push(
            json!({ "subsystem": "keyring", "config": crate::keyring::keyring_entries(cfg) }),
        );
    }
    sections.push(json!({ "subsystem": "bdev", "config": bdevs }));
    sections.push(json!({ "subsystem": "nvmf", "config": nvmf }));
    json!({ "subsystems": sections })
}

/// Keys written first (in this order); all others follow alphabetically.
/// Mirrors the order SPDK writes, so files read naturally.
const KEY_ORDER: &[&str] = &[
    "subsystem",
    "config",
    "method",
    "params",
    "nqn",
    "name",
    "pool_name",
    "rbd_name",
    "trtype",
    "adrfam",
    "traddr",
    "trsvcid",
    "nsid",
    "bdev_name",
    "host",
];

fn key_rank(k: &str) -> (usize, &str) {
    (
        KEY_ORDER
            .iter()
            .position(|o| *o == k)
            .unwrap_or(KEY_ORDER.len()),
        k,
    )
}

/// Pretty-prints with 2-space indentation and the key order above.
pub(crate) fn pretty(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v, 0);
    out.push('\n');
    out
}

fn indent(out: &mut String, n: usize) {
    for _ in 0..n {
        out.push_str("  ");
    }
}

fn write_value(out: &mut String, v: &Value, depth: usize) {
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                indent(out, depth + 1);
                write_value(out, item, depth + 1);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            indent(out, depth);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| key_rank(a).cmp(&key_rank(b)));
            out.push_str("{\n");
            for (i, k) in keys.iter().enumerate() {
                indent(out, depth + 1);
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push_str(": ");
                write_value(out, &map[k.as_str()], depth + 1);
                out.push_str(if i + 1 < keys.len() { ",\n" } else { "\n" });
            }
            indent(out, depth);
            out.push('}');
        }
        // Scalars, [] and {}: serde_json's compact form.
        other => out.push_str(&other.to_string()),
    }
}
