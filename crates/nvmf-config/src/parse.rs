//! Owns loading: walking an SPDK `save_config` document, dispatching each
//! `{"method", "params"}` entry to its handler, validating it against what is
//! already built, and either returning a whole new `TargetConfig` or the first
//! error. Also owns the lists of skipped (SPDK-internal) methods and of
//! accepted-but-ignored SPDK parameters.

use std::net::IpAddr;

use serde_json::{Map, Value};

use crate::ids::{derive_namespace_ids, parse_eui64, parse_nguid, parse_uuid, Uuid16};
use crate::nqn::{validate_nqn, DISCOVERY_NQN};
use crate::params::{Kind, Params};
use crate::{
    AddressFamily, AnaState, BdevConfig, BdevKind, ConfigError, FileMethod, ListenerConfig,
    NamespaceConfig, RdmaOptions, SubsystemConfig, TargetConfig, TransportConfig, TransportType,
    DEFAULT_MAX_CNTLID, DEFAULT_MAX_NAMESPACES, MODEL_NUMBER_MAX_LEN, SERIAL_NUMBER_MAX_LEN,
};

/// Methods that only tune SPDK internals (buffer pools, socket layer,
/// accelerators, schedulers, keyrings, ...). Each occurrence is skipped and
/// recorded in [`TargetConfig::skipped`] as `"<section>/<method>"`.
pub const SKIPPED_METHODS: &[&str] = &[
    // iobuf
    "iobuf_set_options",
    // sock
    "sock_set_default_impl",
    "sock_impl_set_options",
    // accel
    "accel_set_options",
    "accel_assign_opc",
    "accel_set_driver",
    "accel_crypto_key_create",
    "dsa_scan_accel_module",
    "iaa_scan_accel_module",
    "ioat_scan_accel_module",
    "dpdk_cryptodev_scan_accel_module",
    "mlx5_scan_accel_module",
    "compressdev_scan_accel_module",
    // vmd
    "vmd_enable",
    // scheduler / framework
    "framework_set_scheduler",
    // keyring tuning (keyring_file_add_key/remove_key are modelled)
    "keyring_set_options",
    "keyring_linux_set_options",
    // vfio_user_target
    "vfu_tgt_set_base_path",
    // fsdev
    "fsdev_set_opts",
    // iscsi / ublk / vhost global options (not their exports)
    "iscsi_set_options",
    "ublk_create_target",
    "virtio_blk_create_transport",
    // bdev layer tuning
    "bdev_set_options",
    "bdev_nvme_set_options",
    "bdev_nvme_set_hotplug",
    "bdev_iscsi_set_options",
    "bdev_wait_for_examine",
    "bdev_raid_set_options",
    "bdev_examine",
    // nvmf target tuning
    "nvmf_set_config",
    "nvmf_set_max_subsystems",
    "nvmf_set_crdt",
];

// SPDK parameters accepted and recorded in `TargetConfig::ignored_params`.
const MALLOC_IGNORED: &[(&str, Kind)] = &[
    ("optimal_io_boundary", Kind::U32),
    ("physical_block_size", Kind::U32),
    ("md_interleave", Kind::Bool),
    ("dif_is_head_of_md", Kind::Bool),
    ("dif_pi_format", Kind::U32),
    ("numa_id", Kind::I32),
];
const NULL_IGNORED: &[(&str, Kind)] = &[
    ("physical_block_size", Kind::U32),
    ("dif_is_head_of_md", Kind::Bool),
    ("dif_pi_format", Kind::U32),
    ("preferred_write_granularity", Kind::U32),
    ("preferred_write_alignment", Kind::U32),
    ("optimal_write_size", Kind::U32),
    ("preferred_unmap_granularity", Kind::U32),
    ("preferred_unmap_alignment", Kind::U32),
];
const TRANSPORT_IGNORED: &[(&str, Kind)] = &[
    ("tgt_name", Kind::Str),
    ("buf_cache_size", Kind::U32),
    ("iobuf_small_cache_size", Kind::U32),
    ("iobuf_large_cache_size", Kind::U32),
    ("zcopy", Kind::Bool),
    ("dif_insert_or_strip", Kind::Bool),
    ("sock_priority", Kind::U32),
    ("abort_timeout_sec", Kind::U32),
    ("control_msg_num", Kind::U16),
    ("ack_timeout", Kind::U32),
    ("data_wr_pool_size", Kind::U32),
    ("disable_command_passthru", Kind::Bool),
    ("kas", Kind::U16),
    ("min_kato", Kind::U32),
    ("masked_oncs", Kind::Any),
    ("masked_fuses", Kind::Any),
    // vfio-user options SPDK accepts for any trtype
    ("disable_mappable_bar0", Kind::Bool),
    ("disable_adaptive_irq", Kind::Bool),
    ("disable_shadow_doorbells", Kind::Bool),
    ("acceptor_poll_rate", Kind::U32),
];
/// RDMA options SPDK accepts for any trtype: modelled for RDMA
/// ([`crate::RdmaOptions`]), accepted and ignored for TCP.
const RDMA_ONLY: &[(&str, Kind)] = &[
    ("num_cqe", Kind::I32),
    ("max_srq_depth", Kind::U32),
    ("no_srq", Kind::Bool),
    ("acceptor_backlog", Kind::I32),
    ("no_wr_batching", Kind::Bool),
];
/// The TCP-only parameters an RDMA transport accepts and ignores
/// (`c2h_success` true, which rpc.py always sends).
const RDMA_IGNORED: &[(&str, Kind)] = &[("c2h_success", Kind::Bool)];
/// NVMe/RDMA: the fewest admin queue entries a host asks for (the Fabrics
/// minimum, 32: what the Linux host always requests).
const RDMA_MIN_AQ_DEPTH: u32 = 32;
/// The port of an NVMe/RDMA listener added without `trsvcid`.
const RDMA_DEFAULT_TRSVCID: &str = "4420";
/// NVMe/RDMA: largest in-capsule data size. Every queue keeps
/// `max_queue_depth` receive buffers of this size registered for its life;
/// the Linux target caps it at 16 KiB too.
const RDMA_MAX_IN_CAPSULE_DATA_SIZE: u32 = 16_384;
/// NVMe/RDMA: most data buffers (io_unit_size pieces) one I/O may span, as
/// SPDK (one RDMA work request's scatter/gather entries).
const RDMA_MAX_SGES_PER_IO: u32 = 16;

const SUBSYSTEM_IGNORED: &[(&str, Kind)] = &[
    ("tgt_name", Kind::Str),
    ("admin_label", Kind::Str),
    ("dmrsl", Kind::U32),
    ("wzsl", Kind::U8),
    ("passthrough", Kind::Bool),
    ("enable_nssr", Kind::Bool),
    ("max_discard_size_kib", Kind::U64),
    ("max_write_zeroes_size_kib", Kind::U64),
];
const ADD_NS_IGNORED: &[(&str, Kind)] = &[("tgt_name", Kind::Str)];
const NAMESPACE_IGNORED: &[(&str, Kind)] = &[("hide_metadata", Kind::Bool)];
const LISTENER_IGNORED: &[(&str, Kind)] = &[
    ("tgt_name", Kind::Str),
    ("sock_impl", Kind::Str),
    ("numa_id", Kind::I32),
];
const TGT_NAME_IGNORED: &[(&str, Kind)] = &[("tgt_name", Kind::Str)];

/// Every SPDK parameter nvmfd accepts but does not act on, as
/// `"<method>.<parameter>"` (nested ones dotted: `nvmf_subsystem_add_ns.namespace.ptpl_file`).
pub fn ignored_param_names() -> Vec<String> {
    type Group = (&'static str, &'static str, &'static [(&'static str, Kind)]);
    let groups: &[Group] = &[
        ("bdev_malloc_create", "", MALLOC_IGNORED),
        ("bdev_null_create", "", NULL_IGNORED),
        (
            "bdev_rbd_register_cluster",
            "",
            crate::rbd_bdev::REGISTER_CLUSTER_IGNORED,
        ),
        (
            "bdev_rbd_create",
            "",
            crate::rbd_bdev::CREATE_WITH_CLUSTER_IGNORED,
        ),
        ("nvmf_create_transport", "", TRANSPORT_IGNORED),
        ("nvmf_create_transport", "", RDMA_ONLY),
        ("nvmf_create_transport", "", RDMA_IGNORED),
        ("nvmf_create_subsystem", "", SUBSYSTEM_IGNORED),
        ("nvmf_subsystem_add_ns", "", ADD_NS_IGNORED),
        ("nvmf_subsystem_add_ns", "namespace.", NAMESPACE_IGNORED),
        ("nvmf_subsystem_add_listener", "", LISTENER_IGNORED),
        ("nvmf_subsystem_add_host", "", TGT_NAME_IGNORED),
        ("nvmf_subsystem_allow_any_host", "", TGT_NAME_IGNORED),
        ("nvmf_ns_add_host", "", TGT_NAME_IGNORED),
        ("nvmf_ns_remove_host", "", TGT_NAME_IGNORED),
    ];
    groups
        .iter()
        .flat_map(|(m, prefix, list)| list.iter().map(move |(p, _)| format!("{m}.{prefix}{p}")))
        .collect()
}

pub(crate) fn from_json_str(s: &str) -> Result<TargetConfig, ConfigError> {
    let v: Value =
        serde_json::from_str(s).map_err(|source| ConfigError::Json { path: None, source })?;
    from_json_value(&v)
}

struct Entry<'a> {
    loc: String,
    section: &'a str,
    value: &'a Value,
}

fn collect_entries<'a>(loc: String, section: &'a str, v: &'a Value, out: &mut Vec<Entry<'a>>) {
    match v {
        // Newer SPDK may group entries into "batches": nested arrays.
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                collect_entries(format!("{loc}[{i}]"), section, item, out);
            }
        }
        _ => out.push(Entry {
            loc,
            section,
            value: v,
        }),
    }
}

pub(crate) fn from_json_value(v: &Value) -> Result<TargetConfig, ConfigError> {
    let top = v.as_object().ok_or_else(|| {
        ConfigError::invalid("the document must be an object {\"subsystems\": [...]}")
    })?;
    crate::format::check(top)?;
    for key in top.keys() {
        if key != "subsystems" && key != crate::format::FORMAT_KEY {
            return Err(ConfigError::invalid(format!(
                "unknown top-level key \"{key}\" (expected only \"subsystems\" and \"{}\")",
                crate::format::FORMAT_KEY
            )));
        }
    }
    let sections = match top.get("subsystems") {
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ConfigError::invalid("\"subsystems\" must be an array")),
        None => return Err(ConfigError::invalid("missing \"subsystems\" array")),
    };

    let mut early = Vec::new();
    let mut nvmf = Vec::new();
    for (i, sec) in sections.iter().enumerate() {
        let loc = format!("subsystems[{i}]");
        let obj = sec.as_object().ok_or_else(|| {
            ConfigError::invalid("a subsystem section must be an object").at_entry(&loc)
        })?;
        let mut name = None;
        let mut config = None;
        for (k, val) in obj {
            match k.as_str() {
                "subsystem" => {
                    name = Some(val.as_str().ok_or_else(|| {
                        ConfigError::invalid("\"subsystem\" must be a string").at_entry(&loc)
                    })?)
                }
                "config" => config = Some(val),
                other => {
                    return Err(ConfigError::invalid(format!(
                        "unknown key \"{other}\" in a subsystem section"
                    ))
                    .at_entry(&loc))
                }
            }
        }
        let name = name.ok_or_else(|| {
            ConfigError::invalid("subsystem section without a \"subsystem\" name").at_entry(&loc)
        })?;
        let target = if name == "nvmf" {
            &mut nvmf
        } else {
            &mut early
        };
        match config {
            None | Some(Value::Null) => {}
            Some(c @ Value::Array(_)) => collect_entries(format!("{loc}.config"), name, c, target),
            Some(_) => {
                return Err(ConfigError::invalid(format!(
                    "\"config\" of subsystem \"{name}\" must be an array or null"
                ))
                .at_entry(&loc))
            }
        }
    }

    // Everything the nvmf section refers to (bdevs) is created first, as
    // SPDK's subsystem initialization order does.
    let mut cfg = TargetConfig::default();
    for e in early.iter().chain(nvmf.iter()) {
        apply_entry(&mut cfg, e).map_err(|err| err.at_entry(&e.loc))?;
    }
    Ok(cfg)
}

fn apply_entry(cfg: &mut TargetConfig, e: &Entry<'_>) -> Result<(), ConfigError> {
    let obj: &Map<String, Value> = e.value.as_object().ok_or_else(|| {
        ConfigError::invalid("a config entry must be an object {\"method\", \"params\"}")
    })?;
    let mut method = None;
    let mut params = None;
    for (k, v) in obj {
        match k.as_str() {
            "method" => {
                method = Some(
                    v.as_str()
                        .ok_or_else(|| ConfigError::invalid("\"method\" must be a string"))?,
                )
            }
            "params" => params = Some(v),
            other => {
                return Err(ConfigError::invalid(format!(
                    "unknown key \"{other}\" in a config entry (expected \"method\" and \"params\")"
                )))
            }
        }
    }
    let method = method.ok_or_else(|| ConfigError::invalid("config entry without \"method\""))?;
    apply(cfg, Some(e.section), method, params)
}

pub(crate) fn apply_method(
    cfg: &mut TargetConfig,
    method: &str,
    params: Option<&Value>,
) -> Result<(), ConfigError> {
    apply(cfg, None, method, params)
}

/// Applies one method. Handlers validate everything before changing `cfg`,
/// so an error leaves `cfg` as it was.
fn apply(
    cfg: &mut TargetConfig,
    section: Option<&str>,
    method: &str,
    params: Option<&Value>,
) -> Result<(), ConfigError> {
    if method == "nvmf_set_config" {
        // Its DH-HMAC-CHAP lists are modelled; the rest tunes SPDK internals.
        let only_dhchap = params
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty() && m.keys().all(|k| k.starts_with("dhchap_")));
        crate::keyring::set_config_dhchap(cfg, params)?;
        if only_dhchap {
            return Ok(());
        }
    }
    if SKIPPED_METHODS.contains(&method) {
        // Still must be shaped like params, but contents are SPDK's business.
        if let Some(p) = params {
            if !p.is_object() {
                return Err(ConfigError::for_param(
                    method,
                    "params",
                    "expected an object",
                ));
            }
        }
        cfg.skipped.push(match section {
            Some(s) => format!("{s}/{method}"),
            None => method.to_string(),
        });
        return Ok(());
    }
    let mut p = Params::new(method, params)?;
    match method {
        "bdev_malloc_create" => bdev_create(cfg, p, BdevKind::Malloc),
        "bdev_null_create" => bdev_create(cfg, p, BdevKind::Null),
        "bdev_uring_create" => crate::file_bdev::create(cfg, p, FileMethod::Uring),
        "bdev_aio_create" => crate::file_bdev::create(cfg, p, FileMethod::Aio),
        "bdev_rbd_register_cluster" => crate::rbd_bdev::register_cluster(cfg, p),
        "bdev_rbd_create" => crate::rbd_bdev::create(cfg, p),
        "bdev_set_qos_limit" => crate::qos::set_limit(cfg, p),
        "nvmf_create_transport" => create_transport(cfg, p),
        "nvmf_create_subsystem" => create_subsystem(cfg, p),
        "nvmf_subsystem_add_ns" => add_ns(cfg, p),
        "nvmf_subsystem_add_listener" => add_listener(cfg, p),
        "nvmf_subsystem_add_host" => add_host(cfg, p),
        "nvmf_subsystem_set_keys" => {
            let nqn = p.req_str("nqn")?;
            let si = find_subsystem(cfg, &p, nqn)?;
            crate::keyring::set_keys(cfg, si, p)
        }
        "keyring_file_add_key" => crate::keyring::add_key(cfg, p),
        "keyring_file_remove_key" => crate::keyring::remove_key(cfg, p),
        "nvmf_subsystem_allow_any_host" => allow_any_host(cfg, p),
        "nvmf_subsystem_listener_set_ana_state" => listener_set_ana_state(cfg, p),
        "nvmf_subsystem_set_ns_ana_group" => set_ns_ana_group(cfg, p),
        "nvmf_ns_add_host" => ns_visible(cfg, p, true),
        "nvmf_ns_remove_host" => ns_visible(cfg, p, false),
        _ => Err(ConfigError::for_method(
            method,
            "method not supported by nvmfd (it implements bdev_malloc_create, bdev_null_create, \
             bdev_uring_create, bdev_aio_create, bdev_rbd_register_cluster, bdev_rbd_create, \
             bdev_set_qos_limit, \
             nvmf_create_transport, nvmf_create_subsystem, nvmf_subsystem_add_ns/add_listener/\
             add_host/allow_any_host/set_keys, keyring_file_add_key/remove_key, \
             nvmf_subsystem_listener_set_ana_state, \
             nvmf_subsystem_set_ns_ana_group and nvmf_ns_add_host/remove_host, and skips SPDK-internal tuning methods)",
        )),
    }
}

/// A bdev's optional `uuid` parameter: `None` when absent or all zeroes
/// (SPDK's "generate one"); refused when malformed or when another bdev
/// already has it.
pub(crate) fn bdev_uuid(
    cfg: &TargetConfig,
    p: &mut Params<'_>,
) -> Result<Option<Uuid16>, ConfigError> {
    let Some(s) = p.opt_str("uuid")? else {
        return Ok(None);
    };
    let u = parse_uuid(s).map_err(|e| p.err("uuid", e))?;
    if u == [0; 16] {
        return Ok(None);
    }
    if let Some(other) = cfg.bdevs.iter().find(|b| b.uuid == Some(Uuid16(u))) {
        return Err(p.err(
            "uuid",
            format!("UUID {s} is already used by bdev \"{}\"", other.name),
        ));
    }
    Ok(Some(Uuid16(u)))
}

fn bdev_create(
    cfg: &mut TargetConfig,
    mut p: Params<'_>,
    kind: BdevKind,
) -> Result<(), ConfigError> {
    let name = match (kind, p.opt_str("name")?) {
        (_, Some(n)) => n.to_string(),
        // SPDK names an unnamed malloc bdev MallocN.
        (BdevKind::Malloc, None) => (0..)
            .map(|i| format!("Malloc{i}"))
            .find(|n| cfg.bdev(n).is_none())
            .expect("some MallocN is free"),
        (_, None) => return Err(p.err("name", "missing required parameter")),
    };
    if name.is_empty() {
        return Err(p.err("name", "bdev name must not be empty"));
    }
    if cfg.bdev(&name).is_some() {
        return Err(p.err("name", format!("a bdev named \"{name}\" already exists")));
    }
    let num_blocks = p.req_u64("num_blocks")?;
    if num_blocks == 0 {
        return Err(p.err("num_blocks", "must be greater than 0 (a bdev of size 0)"));
    }
    let block_size = p.req_u32("block_size")?;
    if !block_size.is_power_of_two() || !(512..=4096).contains(&block_size) {
        return Err(p.err(
            "block_size",
            format!("{block_size} is not a power of two in 512..=4096"),
        ));
    }
    if num_blocks.checked_mul(u64::from(block_size)).is_none() {
        return Err(p.err("num_blocks", "num_blocks * block_size overflows 64 bits"));
    }
    let uuid = bdev_uuid(cfg, &mut p)?;
    if let Some(md) = p.opt_u32("md_size")? {
        if md != 0 {
            return Err(p.err(
                "md_size",
                "metadata (md_size > 0) is not supported by nvmfd",
            ));
        }
    }
    if let Some(dif) = p.opt_i64("dif_type", Kind::I32)? {
        if dif != 0 {
            return Err(p.err(
                "dif_type",
                "protection information (dif_type != 0) is not supported by nvmfd",
            ));
        }
    }
    let ignored = match kind {
        BdevKind::Malloc => MALLOC_IGNORED,
        _ => NULL_IGNORED,
    };
    let mut ign = cfg.ignored_params.clone();
    p.ignore(ignored, &mut ign)?;
    p.finish()?;
    cfg.ignored_params = ign;
    cfg.bdevs.push(BdevConfig {
        name,
        kind,
        block_size,
        num_blocks,
        uuid,
        file: None,
        rbd: None,
    });
    Ok(())
}

fn create_transport(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let trstr = p.req_str("trtype")?;
    let trtype = TransportType::parse(trstr).ok_or_else(|| {
        p.err(
            "trtype",
            format!("transport \"{trstr}\" is not supported by nvmfd (TCP and RDMA are)"),
        )
    })?;
    if cfg.transport(trtype).is_some() {
        return Err(p.err("trtype", format!("a {trtype} transport already exists")));
    }
    let rdma = trtype == TransportType::Rdma;
    let mut t = TransportConfig::default_for(trtype);
    if let Some(v) = p.opt_u16("max_queue_depth")? {
        if v < 2 {
            return Err(p.err("max_queue_depth", format!("{v} is below the minimum of 2")));
        }
        t.max_queue_depth = v;
    }
    // Older SPDK spelled the queue count including the admin queue.
    let legacy = p.opt_u16("max_qpairs_per_ctrlr")?;
    match (p.opt_u16("max_io_qpairs_per_ctrlr")?, legacy) {
        (Some(v), _) => t.max_io_qpairs_per_ctrlr = v,
        (None, Some(v)) => t.max_io_qpairs_per_ctrlr = v.saturating_sub(1),
        (None, None) => {}
    }
    if t.max_io_qpairs_per_ctrlr == 0 || t.max_io_qpairs_per_ctrlr == u16::MAX {
        return Err(p.err(
            "max_io_qpairs_per_ctrlr",
            format!("{} is outside 1..=65534", t.max_io_qpairs_per_ctrlr),
        ));
    }
    if let Some(v) = p.opt_u32("max_io_size")? {
        if v < 4096 {
            return Err(p.err("max_io_size", format!("{v} is below the minimum of 4096")));
        }
        t.max_io_size = v;
    }
    if let Some(v) = p.opt_u32("in_capsule_data_size")? {
        if v % 16 != 0 {
            return Err(p.err(
                "in_capsule_data_size",
                format!("{v} is not a multiple of 16"),
            ));
        }
        if v > t.max_io_size {
            return Err(p.err(
                "in_capsule_data_size",
                format!("{v} is larger than max_io_size {}", t.max_io_size),
            ));
        }
        if rdma && v > RDMA_MAX_IN_CAPSULE_DATA_SIZE {
            return Err(p.err(
                "in_capsule_data_size",
                format!(
                    "{v} is larger than {RDMA_MAX_IN_CAPSULE_DATA_SIZE}, the most the RDMA \
                     transport takes (each queue keeps max_queue_depth receive buffers of \
                     this size registered)"
                ),
            ));
        }
        t.in_capsule_data_size = v;
    }
    if let Some(v) = p.opt_u32("io_unit_size")? {
        if v < 512 {
            return Err(p.err("io_unit_size", format!("{v} is below the minimum of 512")));
        }
        t.io_unit_size = v;
    }
    if rdma && t.max_io_size / t.io_unit_size > RDMA_MAX_SGES_PER_IO {
        return Err(p.err(
            "io_unit_size",
            format!(
                "{} is too small for max_io_size {}: an RDMA I/O may span at most \
                 {RDMA_MAX_SGES_PER_IO} buffers (use io_unit_size >= {})",
                t.io_unit_size,
                t.max_io_size,
                t.max_io_size.div_ceil(RDMA_MAX_SGES_PER_IO)
            ),
        ));
    }
    if let Some(v) = p.opt_u32("max_aq_depth")? {
        if !(2..=4096).contains(&v) {
            return Err(p.err("max_aq_depth", format!("{v} is outside 2..=4096")));
        }
        if rdma && v < RDMA_MIN_AQ_DEPTH {
            return Err(p.err(
                "max_aq_depth",
                format!(
                    "{v} is below {RDMA_MIN_AQ_DEPTH}: NVMe/RDMA hosts connect the admin \
                     queue with {RDMA_MIN_AQ_DEPTH} entries, the Fabrics minimum"
                ),
            ));
        }
        t.max_aq_depth = v as u16;
    }
    let mut ign = cfg.ignored_params.clone();
    if rdma {
        if p.opt_bool("c2h_success")? == Some(false) {
            return Err(p.err(
                "c2h_success",
                "an NVMe/TCP option (C2HData PDUs): the RDMA transport has no such \
                 setting; leave it out (or true, which is ignored)",
            ));
        }
        p.ignore(RDMA_IGNORED, &mut ign)?;
    } else if let Some(v) = p.opt_bool("c2h_success")? {
        t.c2h_success = v;
    }
    if let Some(v) = p.opt_u32("num_shared_buffers")? {
        if v == 0 {
            return Err(p.err("num_shared_buffers", "0 leaves no data buffers"));
        }
        let min = 2 * RDMA_MAX_SGES_PER_IO;
        if rdma && v < min {
            return Err(p.err(
                "num_shared_buffers",
                format!(
                    "{v} is below {min}, the fewest with which every RDMA I/O \
                     can still get its buffers"
                ),
            ));
        }
        t.num_shared_buffers = v;
    }
    if rdma {
        t.rdma = Some(rdma_options(&mut p)?);
    } else {
        p.ignore(RDMA_ONLY, &mut ign)?;
    }
    p.ignore(TRANSPORT_IGNORED, &mut ign)?;
    p.finish()?;
    cfg.ignored_params = ign;
    cfg.transports.push(t);
    Ok(())
}

/// The RDMA-only parameters of `nvmf_create_transport -t RDMA`.
fn rdma_options(p: &mut Params<'_>) -> Result<RdmaOptions, ConfigError> {
    let mut o = RdmaOptions::default();
    if let Some(v) = p.opt_u32("max_srq_depth")? {
        if v == 0 {
            return Err(p.err(
                "max_srq_depth",
                "0 leaves the shared receive queue no entries",
            ));
        }
        o.max_srq_depth = v;
    }
    if let Some(v) = p.opt_bool("no_srq")? {
        o.no_srq = v;
    }
    if let Some(v) = p.opt_i64("num_cqe", Kind::I32)? {
        if v < 1 {
            return Err(p.err("num_cqe", format!("{v} is below the minimum of 1")));
        }
        o.num_cqe = v as u32;
    }
    if let Some(v) = p.opt_i64("acceptor_backlog", Kind::I32)? {
        if v < 1 {
            return Err(p.err(
                "acceptor_backlog",
                format!("{v} is below the minimum of 1 (SPDK's default is 100)"),
            ));
        }
        o.acceptor_backlog = v as u32;
    }
    if let Some(v) = p.opt_bool("no_wr_batching")? {
        o.no_wr_batching = v;
    }
    Ok(o)
}

fn printable_ascii(s: &str) -> bool {
    s.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

fn create_subsystem(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let nqn = p.req_str("nqn")?;
    validate_nqn(nqn).map_err(|e| p.err("nqn", e))?;
    if nqn == DISCOVERY_NQN {
        return Err(p.err(
            "nqn",
            "the discovery subsystem always exists and cannot be created",
        ));
    }
    if cfg.subsystem(nqn).is_some() {
        return Err(p.err("nqn", format!("subsystem \"{nqn}\" already exists")));
    }
    let mut s = SubsystemConfig::new(nqn);
    if let Some(sn) = p.opt_str("serial_number")? {
        if sn.is_empty() || sn.len() > SERIAL_NUMBER_MAX_LEN || !printable_ascii(sn) {
            return Err(p.err(
                "serial_number",
                format!("\"{sn}\" must be 1..={SERIAL_NUMBER_MAX_LEN} printable ASCII characters"),
            ));
        }
        s.serial_number = sn.to_string();
    }
    if let Some(mn) = p.opt_str("model_number")? {
        if mn.is_empty() || mn.len() > MODEL_NUMBER_MAX_LEN || !printable_ascii(mn) {
            return Err(p.err(
                "model_number",
                format!("\"{mn}\" must be 1..={MODEL_NUMBER_MAX_LEN} printable ASCII characters"),
            ));
        }
        s.model_number = mn.to_string();
    }
    s.allow_any_host = p.opt_bool("allow_any_host")?.unwrap_or(false);
    match p.opt_u32("max_namespaces")? {
        None | Some(0) => s.max_namespaces = DEFAULT_MAX_NAMESPACES,
        Some(u32::MAX) => {
            return Err(p.err(
                "max_namespaces",
                "0xFFFFFFFF is the broadcast NSID and cannot be a namespace count",
            ))
        }
        Some(n) => s.max_namespaces = n,
    }
    s.ana_reporting = p.opt_bool("ana_reporting")?.unwrap_or(false);
    if s.ana_reporting {
        // The Linux host reads the whole ANA log page (header, one descriptor
        // per possible group, every NSID) in one command and turns ANA off
        // when that is larger than the controller's largest transfer.
        let max_io = cfg
            .transport(TransportType::Tcp)
            .map_or(TransportConfig::tcp_default().max_io_size, |t| {
                t.max_io_size
            });
        let need = 16 + 36 * u64::from(s.max_namespaces);
        if need > u64::from(max_io) {
            return Err(p.err(
                "ana_reporting",
                format!(
                    "with max_namespaces {} the ANA log page is {need} bytes, more than one \
                     transfer (max_io_size {max_io}): hosts would turn ANA off; use \
                     max_namespaces <= {}",
                    s.max_namespaces,
                    (u64::from(max_io) - 16) / 36
                ),
            ));
        }
    }
    if let Some(v) = p.opt_u16("min_cntlid")? {
        s.min_cntlid = v;
    }
    if let Some(v) = p.opt_u16("max_cntlid")? {
        s.max_cntlid = v;
    }
    if s.min_cntlid == 0 || s.min_cntlid > DEFAULT_MAX_CNTLID {
        return Err(p.err(
            "min_cntlid",
            format!("{} is outside 1..={DEFAULT_MAX_CNTLID}", s.min_cntlid),
        ));
    }
    if s.max_cntlid < s.min_cntlid || s.max_cntlid > DEFAULT_MAX_CNTLID {
        return Err(p.err(
            "max_cntlid",
            format!(
                "{} is outside min_cntlid ({})..={DEFAULT_MAX_CNTLID}",
                s.max_cntlid, s.min_cntlid
            ),
        ));
    }
    let mut ign = cfg.ignored_params.clone();
    p.ignore(SUBSYSTEM_IGNORED, &mut ign)?;
    p.finish()?;
    cfg.ignored_params = ign;
    cfg.subsystems.push(s);
    Ok(())
}

/// Index of the NVM subsystem named by the `nqn` parameter.
fn find_subsystem(cfg: &TargetConfig, p: &Params<'_>, nqn: &str) -> Result<usize, ConfigError> {
    if nqn == DISCOVERY_NQN {
        return Err(p.err(
            "nqn",
            format!("{} is not possible on the discovery subsystem", p.method()),
        ));
    }
    cfg.subsystems
        .iter()
        .position(|s| s.nqn == nqn)
        .ok_or_else(|| {
            p.err(
                "nqn",
                format!("no subsystem \"{nqn}\" (nvmf_create_subsystem must come first)"),
            )
        })
}

fn add_ns(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let nqn = p.req_str("nqn")?;
    let si = find_subsystem(cfg, &p, nqn)?;
    let mut ign = cfg.ignored_params.clone();
    p.ignore(ADD_NS_IGNORED, &mut ign)?;
    let mut n = p.req_object("namespace")?;

    let bdev_name = n.req_str("bdev_name")?;
    let bdev = cfg
        .bdev(bdev_name)
        .ok_or_else(|| n.err("bdev_name", format!("no bdev named \"{bdev_name}\"")))?;
    for s in &cfg.subsystems {
        if let Some(ns) = s.namespaces.iter().find(|ns| ns.bdev_name == bdev_name) {
            return Err(n.err(
                "bdev_name",
                format!(
                    "bdev \"{bdev_name}\" is already namespace {} of subsystem \"{}\"",
                    ns.nsid, s.nqn
                ),
            ));
        }
    }

    let sub = &cfg.subsystems[si];
    let nsid = match n.opt_u32("nsid")? {
        None | Some(0) => (1..=sub.max_namespaces)
            .find(|id| sub.namespace(*id).is_none())
            .ok_or_else(|| {
                n.err(
                    "nsid",
                    format!(
                        "no free NSID: subsystem \"{nqn}\" already has max_namespaces ({}) namespaces",
                        sub.max_namespaces
                    ),
                )
            })?,
        Some(id) => {
            if id > sub.max_namespaces {
                return Err(n.err(
                    "nsid",
                    format!(
                        "NSID {id} is larger than max_namespaces ({}) of subsystem \"{nqn}\"",
                        sub.max_namespaces
                    ),
                ));
            }
            if sub.namespace(id).is_some() {
                return Err(n.err(
                    "nsid",
                    format!("subsystem \"{nqn}\" already has a namespace with NSID {id}"),
                ));
            }
            id
        }
    };

    // Explicit identifiers; all-zero means "not given", as in SPDK.
    let nguid = match n.opt_str("nguid")? {
        Some(s) => Some(parse_nguid(s).map_err(|e| n.err("nguid", e))?),
        None => None,
    }
    .filter(|b| *b != [0; 16]);
    let eui64 = match n.opt_str("eui64")? {
        Some(s) => Some(parse_eui64(s).map_err(|e| n.err("eui64", e))?),
        None => None,
    }
    .filter(|b| *b != [0; 8]);
    let uuid = match n.opt_str("uuid")? {
        Some(s) => Some(parse_uuid(s).map_err(|e| n.err("uuid", e))?),
        None => None,
    }
    .filter(|b| *b != [0; 16]);
    // Per-host visibility: seen by no host until nvmf_ns_add_host names one.
    let no_auto_visible = n.opt_bool("no_auto_visible")?.unwrap_or(false);
    let anagrpid = match n.opt_u32("anagrpid")? {
        None | Some(0) => nsid,
        Some(g) => {
            check_anagrpid(sub, g).map_err(|e| n.err("anagrpid", e))?;
            g
        }
    };
    let ptpl_file = match n.opt_str("ptpl_file")? {
        None | Some("") => None,
        Some(f) if f.ends_with('/') => {
            return Err(n.err(
                "ptpl_file",
                format!("\"{f}\" names a directory, not a file"),
            ))
        }
        Some(f) => Some(f.to_string()),
    };
    n.ignore(NAMESPACE_IGNORED, &mut ign)?;
    n.finish()?;
    p.finish()?;

    let derived = derive_namespace_ids(nqn, nsid, bdev_name, bdev.uuid.as_ref());
    let ns = NamespaceConfig {
        nsid,
        bdev_name: bdev_name.to_string(),
        nguid: nguid.unwrap_or(derived.nguid),
        eui64: eui64.unwrap_or(derived.eui64),
        uuid: uuid.unwrap_or(derived.uuid),
        anagrpid,
        ptpl_file,
    };
    for s in &cfg.subsystems {
        for other in &s.namespaces {
            let clash = if other.nguid == ns.nguid {
                Some(("nguid", "NGUID"))
            } else if other.uuid == ns.uuid {
                Some(("uuid", "UUID"))
            } else if other.eui64 == ns.eui64 {
                Some(("eui64", "EUI-64"))
            } else {
                None
            };
            if let Some((param, what)) = clash {
                return Err(n.err(
                    param,
                    format!(
                        "{what} is already used by namespace {} of subsystem \"{}\"",
                        other.nsid, s.nqn
                    ),
                ));
            }
        }
    }
    cfg.ignored_params = ign;
    cfg.subsystems[si].namespaces.push(ns);
    if no_auto_visible {
        cfg.subsystems[si].ns_visibility.insert(nsid, Vec::new());
    }
    Ok(())
}

fn add_listener(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let nqn = p.req_str("nqn")?;
    let si = if nqn == DISCOVERY_NQN {
        None
    } else {
        Some(find_subsystem(cfg, &p, nqn)?)
    };
    let mut a = p.req_object("listen_address")?;
    let trstr = a.req_str("trtype")?;
    let trtype = TransportType::parse(trstr).ok_or_else(|| {
        a.err(
            "trtype",
            format!("transport \"{trstr}\" is not supported by nvmfd (TCP and RDMA are)"),
        )
    })?;
    if cfg.transport(trtype).is_none() {
        return Err(a.err(
            "trtype",
            format!("no {trtype} transport (nvmf_create_transport must come first)"),
        ));
    }
    let traddr = a.req_str("traddr")?;
    let ip: IpAddr = traddr
        .parse()
        .map_err(|_| a.err("traddr", format!("\"{traddr}\" is not an IP address")))?;
    let adrfam = match a.opt_str("adrfam")? {
        Some(f) => AddressFamily::parse(f).ok_or_else(|| {
            a.err(
                "adrfam",
                format!("address family \"{f}\" is not supported (IPv4 or IPv6)"),
            )
        })?,
        None if ip.is_ipv4() => AddressFamily::Ipv4,
        None => AddressFamily::Ipv6,
    };
    if ip.is_ipv4() != (adrfam == AddressFamily::Ipv4) {
        return Err(a.err("traddr", format!("\"{traddr}\" is not an {adrfam} address")));
    }
    // NVMe/RDMA listeners default to the NVMe-oF port, as nvme-cli does.
    let trsvcid = match (a.opt_str("trsvcid")?, trtype) {
        (Some(s), _) => s,
        (None, TransportType::Rdma) => RDMA_DEFAULT_TRSVCID,
        (None, TransportType::Tcp) => {
            return Err(a.err("trsvcid", "missing required parameter (the TCP port)"))
        }
    };
    match trsvcid.parse::<u16>() {
        Ok(port) if port != 0 && trsvcid == port.to_string() => {}
        _ => {
            return Err(a.err(
                "trsvcid",
                format!(
                    "\"{trsvcid}\" is not a {} port number in 1..=65535",
                    match trtype {
                        TransportType::Tcp => "TCP",
                        TransportType::Rdma => "RDMA CM",
                    }
                ),
            ))
        }
    }
    a.finish()?;
    let secure = p.opt_bool("secure_channel")?.unwrap_or(false);
    if secure && trtype == TransportType::Rdma {
        return Err(p.err(
            "secure_channel",
            "secure_channel is TLS over NVMe/TCP; an RDMA listener cannot require it",
        ));
    }
    // One TCP socket serves every subsystem on an address: all of them must
    // agree on TLS (RDMA listeners share nothing with TCP ones).
    let conflict = if trtype != TransportType::Tcp {
        None
    } else if secure {
        cfg.clear_listener_users(traddr, trsvcid)
            .find(|n| *n != nqn)
            .map(|n| (n.to_string(), "in clear text"))
    } else {
        cfg.secure_listener_users(traddr, trsvcid)
            .find(|n| *n != nqn)
            .map(|n| (n.to_string(), "with TLS (secure_channel)"))
    };
    if let Some((other, how)) = conflict {
        return Err(p.err(
            "secure_channel",
            format!(
                "subsystem \"{other}\" already listens on {traddr}:{trsvcid} {how}; \
                 every subsystem on one address must use the same secure_channel setting"
            ),
        ));
    }
    let ana_state = match p.opt_str("ana_state")? {
        Some(st) => Some(parse_ana_state(st).map_err(|e| p.err("ana_state", e))?),
        None => None,
    };
    let mut ign = cfg.ignored_params.clone();
    p.ignore(LISTENER_IGNORED, &mut ign)?;
    p.finish()?;

    let l = ListenerConfig {
        trtype,
        adrfam,
        traddr: traddr.to_string(),
        trsvcid: trsvcid.to_string(),
    };
    let list = match si {
        Some(i) => &mut cfg.subsystems[i].listeners,
        None => &mut cfg.discovery_listeners,
    };
    if list.contains(&l) {
        return Err(ConfigError::for_param(
            "nvmf_subsystem_add_listener",
            "listen_address",
            format!("subsystem \"{nqn}\" already listens on {traddr}:{trsvcid}"),
        ));
    }
    list.push(l.clone());
    if secure {
        match si {
            Some(i) => cfg.subsystems[i].secure_listeners.push(l.clone()),
            None => cfg.secure_discovery_listeners.push(l.clone()),
        }
    }
    if let (Some(i), Some(st)) = (si, ana_state) {
        cfg.subsystems[i].set_ana_state(&l, None, st);
    }
    cfg.ignored_params = ign;
    Ok(())
}

fn parse_ana_state(s: &str) -> Result<AnaState, String> {
    AnaState::parse(s).ok_or_else(|| {
        format!(
            "\"{s}\" is not an ANA state (optimized, non_optimized, inaccessible; \
             nvmfd also takes persistent_loss and change)"
        )
    })
}

fn check_anagrpid(sub: &SubsystemConfig, g: u32) -> Result<(), String> {
    if g == 0 || g > sub.ana_group_max() {
        return Err(format!(
            "ANA group {g} is outside 1..={} (the subsystem's max_namespaces)",
            sub.ana_group_max()
        ));
    }
    Ok(())
}

/// `nvmf_subsystem_listener_set_ana_state`: nqn, listen_address, ana_state,
/// anagrpid (optional: every group), tgt_name (ignored).
fn listener_set_ana_state(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let nqn = p.req_str("nqn")?;
    let si = find_subsystem(cfg, &p, nqn)?;
    let sub = &cfg.subsystems[si];
    let mut a = p.req_object("listen_address")?;
    let trstr = a.req_str("trtype")?;
    let traddr = a.req_str("traddr")?;
    let trsvcid = a.opt_str("trsvcid")?.unwrap_or("");
    let adrfam = a.opt_str("adrfam")?;
    a.finish()?;
    let l = sub
        .listeners
        .iter()
        .find(|l| {
            l.trtype.as_str().eq_ignore_ascii_case(trstr)
                && l.traddr == traddr
                && l.trsvcid == trsvcid
                && adrfam.is_none_or(|f| l.adrfam.as_str().eq_ignore_ascii_case(f))
        })
        .cloned()
        .ok_or_else(|| {
            p.err(
                "listen_address",
                format!("subsystem \"{nqn}\" has no listener {trstr} {traddr}:{trsvcid}"),
            )
        })?;
    let st = p.req_str("ana_state")?;
    let state = parse_ana_state(st).map_err(|e| p.err("ana_state", e))?;
    let anagrpid = match p.opt_u32("anagrpid")? {
        None | Some(0) => None,
        Some(g) => {
            check_anagrpid(sub, g).map_err(|e| p.err("anagrpid", e))?;
            Some(g)
        }
    };
    if !sub.ana_reporting {
        return Err(p.err(
            "nqn",
            format!(
                "subsystem \"{nqn}\" was created without ana_reporting \
                 (nvmf_create_subsystem -r): hosts would never see the state"
            ),
        ));
    }
    let mut ign = cfg.ignored_params.clone();
    p.ignore(TGT_NAME_IGNORED, &mut ign)?;
    p.finish()?;
    cfg.ignored_params = ign;
    cfg.subsystems[si].set_ana_state(&l, anagrpid, state);
    Ok(())
}

/// `nvmf_subsystem_set_ns_ana_group`: nqn, nsid, anagrpid, tgt_name (ignored).
fn set_ns_ana_group(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let nqn = p.req_str("nqn")?;
    let si = find_subsystem(cfg, &p, nqn)?;
    let nsid = p.req_u32("nsid")?;
    let g = p.req_u32("anagrpid")?;
    let sub = &cfg.subsystems[si];
    let Some(ni) = sub.namespaces.iter().position(|n| n.nsid == nsid) else {
        return Err(p.err(
            "nsid",
            format!("subsystem \"{nqn}\" has no namespace {nsid}"),
        ));
    };
    check_anagrpid(sub, g).map_err(|e| p.err("anagrpid", e))?;
    let mut ign = cfg.ignored_params.clone();
    p.ignore(TGT_NAME_IGNORED, &mut ign)?;
    p.finish()?;
    cfg.ignored_params = ign;
    cfg.subsystems[si].namespaces[ni].anagrpid = g;
    Ok(())
}

/// `nvmf_ns_add_host` / `nvmf_ns_remove_host`: nqn, nsid, host, tgt_name
/// (ignored). Makes namespace `nsid`, added with `no_auto_visible`, visible
/// (or no longer visible) to `host`. As SPDK: the host need not be on the
/// subsystem's allowed list, adding a host already there or removing one
/// that is not changes nothing, and a namespace every host sees refuses
/// both (SPDK: EPERM).
fn ns_visible(cfg: &mut TargetConfig, mut p: Params<'_>, visible: bool) -> Result<(), ConfigError> {
    let nqn = p.req_str("nqn")?;
    let si = find_subsystem(cfg, &p, nqn)?;
    let nsid = p.req_u32("nsid")?;
    let host = p.req_str("host")?;
    let sub = &cfg.subsystems[si];
    if nsid == 0 || nsid > sub.max_namespaces {
        return Err(p.err(
            "nsid",
            format!(
                "NSID {nsid} is outside 1..={} (max_namespaces of subsystem \"{nqn}\")",
                sub.max_namespaces
            ),
        ));
    }
    if sub.namespace(nsid).is_none() {
        return Err(p.err(
            "nsid",
            format!("subsystem \"{nqn}\" has no namespace {nsid}"),
        ));
    }
    validate_nqn(host).map_err(|e| p.err("host", e))?;
    if !sub.ns_no_auto_visible(nsid) {
        return Err(p.err(
            "nsid",
            format!(
                "namespace {nsid} of subsystem \"{nqn}\" is visible to every host: only a \
                 namespace added with no_auto_visible has per-host visibility"
            ),
        ));
    }
    let mut ign = cfg.ignored_params.clone();
    p.ignore(TGT_NAME_IGNORED, &mut ign)?;
    p.finish()?;
    cfg.ignored_params = ign;
    let hosts = cfg.subsystems[si].ns_visibility.entry(nsid).or_default();
    if visible {
        if !hosts.iter().any(|h| h == host) {
            hosts.push(host.to_string());
        }
    } else {
        hosts.retain(|h| h != host);
    }
    Ok(())
}

fn add_host(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let nqn = p.req_str("nqn")?;
    let si = find_subsystem(cfg, &p, nqn)?;
    let host = p.req_str("host")?;
    validate_nqn(host).map_err(|e| p.err("host", e))?;
    if cfg.subsystems[si].hosts.iter().any(|h| h == host) {
        return Err(p.err(
            "host",
            format!("host \"{host}\" is already allowed on subsystem \"{nqn}\""),
        ));
    }
    let psk = crate::keyring::psk_param(cfg, &mut p)?;
    let keys = crate::keyring::host_keys_param(cfg, &mut p)?;
    let mut ign = cfg.ignored_params.clone();
    p.ignore(TGT_NAME_IGNORED, &mut ign)?;
    p.finish()?;
    cfg.ignored_params = ign;
    cfg.subsystems[si].hosts.push(host.to_string());
    if let Some(k) = keys {
        cfg.subsystems[si].host_keys.insert(host.to_string(), k);
    }
    if let Some(k) = psk {
        cfg.subsystems[si].host_psks.insert(host.to_string(), k);
    }
    Ok(())
}

fn allow_any_host(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let nqn = p.req_str("nqn")?;
    let si = find_subsystem(cfg, &p, nqn)?;
    let allow = p.req_bool("allow_any_host")?;
    let mut ign = cfg.ignored_params.clone();
    p.ignore(TGT_NAME_IGNORED, &mut ign)?;
    p.finish()?;
    cfg.ignored_params = ign;
    cfg.subsystems[si].allow_any_host = allow;
    Ok(())
}
