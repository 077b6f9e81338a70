//! Owns loading and writing Ceph RBD configuration: `bdev_rbd_register_cluster`
//! (a named cluster connection, [`RbdCluster`]) and `bdev_rbd_create` (an
//! image as a bdev, [`RbdBdev`]), with SPDK's parameter names, and the
//! save_config entries for both (clusters are written before the bdevs that
//! name them). Nothing here talks to a cluster: the size of an image is only
//! known once the backend has opened it, so an rbd bdev's `num_blocks` is 0
//! in the model. `read_only` (rpc.py's `-r/--readonly`, always sent) opens
//! the image read-only and write-protects the namespaces on it; it is
//! written back only when true.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::params::{Kind, Params};
use crate::parse::bdev_uuid;
use crate::{BdevConfig, BdevKind, ConfigError, RbdBdev, RbdCluster, TargetConfig};

/// Block size of an rbd bdev created without `block_size`.
pub const RBD_DEFAULT_BLOCK_SIZE: u32 = 512;

/// SPDK parameters of `bdev_rbd_register_cluster` accepted but not acted on.
pub(crate) const REGISTER_CLUSTER_IGNORED: &[(&str, Kind)] = &[("core_mask", Kind::Str)];
/// `bdev_rbd_create` parameters not used when `cluster_name` is given (as in
/// SPDK, the registered cluster's connection is used instead).
pub(crate) const CREATE_WITH_CLUSTER_IGNORED: &[(&str, Kind)] =
    &[("user_id", Kind::Str), ("config", Kind::Object)];

fn check_name(p: &Params<'_>, param: &str, v: &str) -> Result<(), ConfigError> {
    if v.is_empty() {
        return Err(p.err(param, "must not be empty"));
    }
    Ok(())
}

/// `bdev_rbd_register_cluster`: name, user_id, config_param, config_file,
/// key_file; core_mask accepted and ignored.
pub(crate) fn register_cluster(
    cfg: &mut TargetConfig,
    mut p: Params<'_>,
) -> Result<(), ConfigError> {
    let name = p.req_str("name")?;
    check_name(&p, "name", name)?;
    if cfg.rbd_cluster(name).is_some() {
        return Err(p.err(
            "name",
            format!("a cluster named \"{name}\" is already registered"),
        ));
    }
    let user_id = p.opt_str("user_id")?;
    if let Some(u) = user_id {
        check_name(&p, "user_id", u)?;
    }
    let config_param = p.opt_string_map("config_param")?.unwrap_or_default();
    let config_file = p.opt_str("config_file")?;
    let key_file = p.opt_str("key_file")?;
    for (param, v) in [("config_file", config_file), ("key_file", key_file)] {
        if let Some(v) = v {
            check_name(&p, param, v)?;
        }
    }
    let mut ign = cfg.ignored_params.clone();
    p.ignore(REGISTER_CLUSTER_IGNORED, &mut ign)?;
    p.finish()?;
    cfg.ignored_params = ign;
    cfg.rbd_clusters.push(RbdCluster {
        name: name.to_string(),
        user_id: user_id.map(str::to_string),
        config_param,
        config_file: config_file.map(str::to_string),
        key_file: key_file.map(str::to_string),
    });
    Ok(())
}

/// `bdev_rbd_create`: name (default `CephN`), pool_name, rbd_name,
/// block_size (default 512), user_id, config (SPDK's name; nvmfd also takes
/// `config_param`), cluster_name, uuid, read_only (default false).
pub(crate) fn create(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let name = match p.opt_str("name")? {
        Some(n) => {
            check_name(&p, "name", n)?;
            n.to_string()
        }
        // SPDK names an unnamed rbd bdev CephN.
        None => (0..)
            .map(|i| format!("Ceph{i}"))
            .find(|n| cfg.bdev(n).is_none())
            .expect("some CephN is free"),
    };
    if cfg.bdev(&name).is_some() {
        return Err(p.err("name", format!("a bdev named \"{name}\" already exists")));
    }
    let pool_name = p.req_str("pool_name")?;
    check_name(&p, "pool_name", pool_name)?;
    let rbd_name = p.req_str("rbd_name")?;
    check_name(&p, "rbd_name", rbd_name)?;
    let block_size = p.opt_u32("block_size")?.unwrap_or(RBD_DEFAULT_BLOCK_SIZE);
    if !block_size.is_power_of_two() || !(512..=4096).contains(&block_size) {
        return Err(p.err(
            "block_size",
            format!("{block_size} is not a power of two in 512..=4096"),
        ));
    }
    let user_id = p.opt_str("user_id")?;
    if let Some(u) = user_id {
        check_name(&p, "user_id", u)?;
    }
    let config = p.opt_string_map("config")?;
    let config_alias = p.opt_string_map("config_param")?;
    let config_param: BTreeMap<String, String> = match (config, config_alias) {
        (Some(_), Some(_)) => {
            return Err(p.err(
                "config_param",
                "give the librados configuration once, as \"config\" (SPDK's name)",
            ))
        }
        (Some(m), None) | (None, Some(m)) => m,
        (None, None) => BTreeMap::new(),
    };
    let cluster_name = p.opt_str("cluster_name")?;
    if let Some(c) = cluster_name {
        if cfg.rbd_cluster(c).is_none() {
            return Err(p.err(
                "cluster_name",
                format!("no cluster \"{c}\" (bdev_rbd_register_cluster must come first)"),
            ));
        }
    }
    let uuid = bdev_uuid(cfg, &mut p)?;
    let read_only = p.opt_bool("read_only")?.unwrap_or(false);
    p.finish()?;
    // As SPDK: with a registered cluster, the bdev's own user_id and config
    // are not used (the cluster's connection is). Kept for save_config.
    if cluster_name.is_some() {
        let mut note = |param: &str| {
            let e = format!("bdev_rbd_create.{param}");
            if !cfg.ignored_params.contains(&e) {
                cfg.ignored_params.push(e);
            }
        };
        if user_id.is_some() {
            note("user_id");
        }
        if !config_param.is_empty() {
            note("config");
        }
    }
    cfg.bdevs.push(BdevConfig {
        name,
        kind: BdevKind::Rbd,
        block_size,
        num_blocks: 0,
        uuid,
        file: None,
        rbd: Some(RbdBdev {
            pool_name: pool_name.to_string(),
            rbd_name: rbd_name.to_string(),
            user_id: user_id.map(str::to_string),
            config_param,
            cluster_name: cluster_name.map(str::to_string),
            read_only,
        }),
    });
    Ok(())
}

fn string_map(m: &BTreeMap<String, String>) -> Value {
    Value::Object(m.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
}

/// The save_config parameters of `bdev_rbd_register_cluster`.
pub(crate) fn cluster_params(c: &RbdCluster) -> Value {
    let mut p = Map::new();
    p.insert("name".into(), json!(c.name));
    if let Some(u) = &c.user_id {
        p.insert("user_id".into(), json!(u));
    }
    if !c.config_param.is_empty() {
        p.insert("config_param".into(), string_map(&c.config_param));
    }
    if let Some(f) = &c.config_file {
        p.insert("config_file".into(), json!(f));
    }
    if let Some(f) = &c.key_file {
        p.insert("key_file".into(), json!(f));
    }
    Value::Object(p)
}

/// The save_config parameters of `bdev_rbd_create` (SPDK's names; unlike
/// SPDK's own save_config, `cluster_name` is written too, so a bdev on a
/// registered cluster comes back on it).
pub(crate) fn bdev_params(b: &BdevConfig, r: &RbdBdev) -> Value {
    let mut p = Map::new();
    p.insert("name".into(), json!(b.name));
    p.insert("pool_name".into(), json!(r.pool_name));
    p.insert("rbd_name".into(), json!(r.rbd_name));
    p.insert("block_size".into(), json!(b.block_size));
    if let Some(u) = &r.user_id {
        p.insert("user_id".into(), json!(u));
    }
    if !r.config_param.is_empty() {
        p.insert("config".into(), string_map(&r.config_param));
    }
    if let Some(c) = &r.cluster_name {
        p.insert("cluster_name".into(), json!(c));
    }
    if let Some(u) = &b.uuid {
        p.insert("uuid".into(), json!(u.to_string()));
    }
    // Only when set: a writable bdev's entry stays as SPDK writes it.
    if r.read_only {
        p.insert("read_only".into(), json!(true));
    }
    Value::Object(p)
}

/// `driver_specific.rbd` of `bdev_get_bdevs` (SPDK's shape: pool_name,
/// rbd_name, then either the registered cluster's settings under its name
/// or the bdev's own user_id / config; `read_only: true` when set).
pub fn driver_specific(cfg: &TargetConfig, r: &RbdBdev) -> Value {
    let mut m = Map::new();
    m.insert("pool_name".into(), json!(r.pool_name));
    m.insert("rbd_name".into(), json!(r.rbd_name));
    match r.cluster_name.as_deref().and_then(|c| cfg.rbd_cluster(c)) {
        Some(c) => {
            m.insert("cluster_name".into(), json!(c.name));
            if let Value::Object(cp) = cluster_params(c) {
                for (k, v) in cp {
                    if k != "name" {
                        m.insert(k, v);
                    }
                }
            }
        }
        None => {
            if let Some(u) = &r.user_id {
                m.insert("user_id".into(), json!(u));
            }
            if !r.config_param.is_empty() {
                m.insert("config".into(), string_map(&r.config_param));
            }
        }
    }
    if r.read_only {
        m.insert("read_only".into(), json!(true));
    }
    json!({ "rbd": Value::Object(m) })
}

/// One entry of `bdev_rbd_get_clusters_info` (SPDK's shape: `cluster_name`,
/// then the registration's settings).
pub fn cluster_info(c: &RbdCluster) -> Value {
    let mut m = Map::new();
    m.insert("cluster_name".into(), json!(c.name));
    if let Value::Object(cp) = cluster_params(c) {
        for (k, v) in cp {
            if k != "name" {
                m.insert(k, v);
            }
        }
    }
    Value::Object(m)
}
