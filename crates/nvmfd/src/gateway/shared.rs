//! The configuration a gateway group shares (docs/GATEWAY-GROUPS.md,
//! "Shared configuration").
//!
//! Owns which part of a member's configuration is the group's and which is
//! its own, as two pure functions:
//! - [`shared_part`]: bdevs and their QoS limits, the keyring (names and
//!   paths), DH-HMAC-CHAP policy, and every subsystem with its namespaces,
//!   hosts, keys and visibility — without listeners, ANA states or
//!   controller ID ranges, and of the registered clusters only their names;
//! - [`merge`]: a member's running configuration with the group's shared
//!   part put in: its own transports, registered clusters, discovery
//!   listeners, and per subsystem its listeners, ANA states and controller
//!   ID range stay; a subsystem it did not have gets no listener and the
//!   controller ID range `base+1..=base+999`.
//!
//! The member thread publishes and applies these; `merge` of a shared part
//! gives back the same shared part, so applying what the group published
//! never publishes again.

use nvmf_config::{TargetConfig, DEFAULT_MAX_CNTLID, DEFAULT_MIN_CNTLID};

/// What the group shares of `cfg`.
pub fn shared_part(cfg: &TargetConfig) -> TargetConfig {
    let mut s = cfg.clone();
    // Cluster registrations are each member's own (its conf and keyring);
    // only their names are shared, so that the bdevs naming them parse.
    for c in &mut s.rbd_clusters {
        *c = nvmf_config::RbdCluster {
            name: c.name.clone(),
            user_id: None,
            config_param: Default::default(),
            config_file: None,
            key_file: None,
        };
    }
    s.transports.clear();
    s.discovery_listeners.clear();
    s.secure_discovery_listeners.clear();
    s.skipped.clear();
    s.ignored_params.clear();
    for sub in &mut s.subsystems {
        sub.listeners.clear();
        sub.secure_listeners.clear();
        sub.ana_states.clear();
        sub.min_cntlid = DEFAULT_MIN_CNTLID;
        sub.max_cntlid = DEFAULT_MAX_CNTLID;
    }
    s
}

/// `local` with the group's `shared` part; `cntlid_base` places the
/// controller IDs of subsystems `local` did not have.
pub fn merge(local: &TargetConfig, shared: &TargetConfig, cntlid_base: u16) -> TargetConfig {
    let mut m = shared.clone();
    m.rbd_clusters = local.rbd_clusters.clone();
    m.transports = local.transports.clone();
    m.discovery_listeners = local.discovery_listeners.clone();
    m.secure_discovery_listeners = local.secure_discovery_listeners.clone();
    m.skipped = local.skipped.clone();
    m.ignored_params = local.ignored_params.clone();
    for sub in &mut m.subsystems {
        match local.subsystem(&sub.nqn) {
            Some(l) => {
                sub.listeners = l.listeners.clone();
                sub.secure_listeners = l.secure_listeners.clone();
                sub.ana_states = l.ana_states.clone();
                sub.min_cntlid = l.min_cntlid;
                sub.max_cntlid = l.max_cntlid;
            }
            None => {
                sub.min_cntlid = cntlid_base.saturating_add(1);
                sub.max_cntlid = cntlid_base.saturating_add(999).min(DEFAULT_MAX_CNTLID);
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(port: u16, cntlid: u16, extra_ns: bool) -> TargetConfig {
        let nqn = "nqn.2016-06.io.nvmfd:g";
        let ns2 = if extra_ns {
            format!(
                r#",{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{nqn}","namespace":{{"bdev_name":"Malloc1","nsid":2,"anagrpid":2}}}}}}"#
            )
        } else {
            String::new()
        };
        TargetConfig::from_json_str(&format!(
            r#"{{"subsystems":[{{"subsystem":"bdev","config":[
  {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","num_blocks":64,"block_size":512}}}},
  {{"method":"bdev_malloc_create","params":{{"name":"Malloc1","num_blocks":64,"block_size":512}}}}]}},
  {{"subsystem":"nvmf","config":[
  {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
  {{"method":"nvmf_create_subsystem","params":{{"nqn":"{nqn}","ana_reporting":true,"min_cntlid":{cntlid},"max_cntlid":{}}}}},
  {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{nqn}","namespace":{{"bdev_name":"Malloc0","nsid":1}}}}}}{ns2},
  {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{nqn}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}]}}]}}"#,
            cntlid + 998
        ))
        .expect("config")
    }

    #[test]
    fn members_share_namespaces_but_keep_listeners_and_cntlids() {
        let (a, b) = (cfg(4420, 1, true), cfg(4421, 1001, false));
        assert_ne!(shared_part(&a), shared_part(&b), "a has namespace 2");
        let m = merge(&b, &shared_part(&a), 2000);
        let s = &m.subsystems[0];
        assert_eq!(s.namespaces.len(), 2, "b gets a's namespace");
        assert_eq!(
            s.listeners, b.subsystems[0].listeners,
            "b keeps its listener"
        );
        assert_eq!(
            (s.min_cntlid, s.max_cntlid),
            (1001, 1999),
            "and its controller IDs"
        );
        assert_eq!(m.transports, b.transports);
        // Applying the group's part publishes nothing new.
        assert_eq!(shared_part(&m), shared_part(&a));
        // Through JSON (the record) as well.
        let back = TargetConfig::from_json_value(&shared_part(&a).to_json_value()).unwrap();
        assert_eq!(shared_part(&merge(&b, &back, 2000)), back);
        // A subsystem b did not have: no listener, its own controller IDs.
        let mut only_a = shared_part(&a);
        only_a.subsystems[0].nqn = "nqn.2016-06.io.nvmfd:new".into();
        let m = merge(&b, &only_a, 2000);
        let n = m.subsystem("nqn.2016-06.io.nvmfd:new").unwrap();
        assert!(n.listeners.is_empty());
        assert_eq!((n.min_cntlid, n.max_cntlid), (2001, 2999));
        assert!(
            m.subsystem("nqn.2016-06.io.nvmfd:g").is_none(),
            "gone from the group: gone here"
        );
    }
}

/// Each member's listeners by subsystem NQN, as the group keeps them.
pub type MemberListeners = std::collections::BTreeMap<String, Vec<nvmf_config::ListenerConfig>>;

/// The listeners of every subsystem of `cfg` (empty lists included: a
/// listener removed here stays removed when this member restarts).
pub fn listeners_of(cfg: &TargetConfig) -> MemberListeners {
    cfg.subsystems
        .iter()
        .map(|s| (s.nqn.clone(), s.listeners.clone()))
        .collect()
}

/// `m`'s listeners put into `cfg`'s subsystems that `m` names.
pub fn with_listeners(mut cfg: TargetConfig, m: &MemberListeners) -> TargetConfig {
    for sub in &mut cfg.subsystems {
        if let Some(ls) = m.get(&sub.nqn) {
            sub.listeners = ls.clone();
            sub.secure_listeners.retain(|l| ls.contains(l));
        }
    }
    cfg
}

/// A member's listeners as JSON (`{nqn: [{trtype, adrfam, traddr, trsvcid}]}`).
pub fn listeners_json(m: &MemberListeners) -> serde_json::Value {
    serde_json::Value::Object(
        m.iter()
            .map(|(nqn, ls)| {
                let v: Vec<serde_json::Value> = ls
                    .iter()
                    .map(|l| {
                        serde_json::json!({
                            "trtype": l.trtype.as_str(),
                            "adrfam": l.adrfam.as_str(),
                            "traddr": l.traddr,
                            "trsvcid": l.trsvcid,
                        })
                    })
                    .collect();
                (nqn.clone(), serde_json::Value::Array(v))
            })
            .collect(),
    )
}

/// The inverse of [`listeners_json`]; `None` when anything does not parse.
pub fn listeners_from_json(v: &serde_json::Value) -> Option<MemberListeners> {
    use nvmf_config::{AddressFamily, ListenerConfig, TransportType};
    let mut out = MemberListeners::new();
    for (nqn, ls) in v.as_object()? {
        let mut list = Vec::new();
        for l in ls.as_array()? {
            let trtype = match l["trtype"].as_str()?.to_ascii_uppercase().as_str() {
                "TCP" => TransportType::Tcp,
                "RDMA" => TransportType::Rdma,
                _ => return None,
            };
            let adrfam = match l["adrfam"].as_str()?.to_ascii_uppercase().as_str() {
                "IPV4" => AddressFamily::Ipv4,
                "IPV6" => AddressFamily::Ipv6,
                _ => return None,
            };
            list.push(ListenerConfig {
                trtype,
                adrfam,
                traddr: l["traddr"].as_str()?.to_string(),
                trsvcid: l["trsvcid"].as_str()?.to_string(),
            });
        }
        out.insert(nqn.clone(), list);
    }
    Some(out)
}

#[cfg(test)]
mod listener_tests {
    use super::*;

    #[test]
    fn a_members_listeners_round_trip_and_replace_the_files() {
        let nqn = "nqn.2016-06.io.nvmfd:g";
        let cfg = TargetConfig::from_json_str(&format!(
            r#"{{"subsystems":[{{"subsystem":"nvmf","config":[
  {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
  {{"method":"nvmf_create_subsystem","params":{{"nqn":"{nqn}"}}}},
  {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{nqn}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"4420"}}}}}}]}}]}}"#
        ))
        .unwrap();
        let m = listeners_of(&cfg);
        assert_eq!(listeners_from_json(&listeners_json(&m)), Some(m.clone()));
        let mut other = m.clone();
        other.get_mut(nqn).unwrap()[0].trsvcid = "4421".into();
        let c2 = with_listeners(cfg.clone(), &other);
        assert_eq!(c2.subsystems[0].listeners[0].trsvcid, "4421");
        assert_eq!(
            listeners_from_json(&serde_json::json!({"x": [{"trtype": "FC"}]})),
            None
        );
    }
}
