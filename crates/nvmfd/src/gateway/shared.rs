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
