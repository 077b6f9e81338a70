//! Owns the QoS rate limits of bdevs in the model: [`QosLimits`] (SPDK's
//! four `bdev_set_qos_limit` values), the `bdev_set_qos_limit` handler
//! (validation, SPDK's rounding), and the entry `save_config` writes after
//! the bdev's creation. Enforcement is nvmf-core's (`qos.rs`); docs/QOS.md.
//!
//! Rules (as SPDK's `bdev_set_qos_limit`): each limit is optional (absent:
//! unchanged), 0 disables it; at least one must be given. `rw_ios_per_sec`
//! is rounded up to a multiple of 1000 (so any non-zero value is at least
//! 1000); the byte limits are whole MiB/s (at least 1 MiB/s by their unit).
//! A bdev with all four at 0 has no entry.

use serde_json::{json, Value};

use crate::params::Params;
use crate::{ConfigError, TargetConfig};

/// IOPS limits are multiples of this (SPDK's minimum, 1000 I/O per second).
pub const QOS_IOS_GRANULE: u64 = 1000;
/// Largest accepted `*_mbytes_per_sec` (bytes per second must fit 63 bits
/// with room to spare: 2^40 MiB/s = 1 EiB/s).
pub const QOS_MAX_MBYTES_PER_SEC: u64 = 1 << 40;
/// Largest accepted `rw_ios_per_sec` (before rounding).
pub const QOS_MAX_IOS_PER_SEC: u64 = 1 << 50;

/// A bdev's rate limits (0 = that limit is off). The byte limits are in
/// MiB/s, as SPDK's parameters and `assigned_rate_limits` show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosLimits {
    /// Reads and writes together, commands per second (multiple of 1000).
    pub rw_ios_per_sec: u64,
    /// Reads and writes together, MiB per second.
    pub rw_mbytes_per_sec: u64,
    /// Reads only, MiB per second.
    pub r_mbytes_per_sec: u64,
    /// Writes only, MiB per second.
    pub w_mbytes_per_sec: u64,
}

impl QosLimits {
    /// No limit at all.
    pub fn is_unlimited(&self) -> bool {
        *self == QosLimits::default()
    }

    /// The byte limits in bytes per second: (rw, r, w).
    pub fn bytes_per_sec(&self) -> (u64, u64, u64) {
        const MIB: u64 = 1 << 20;
        (
            self.rw_mbytes_per_sec * MIB,
            self.r_mbytes_per_sec * MIB,
            self.w_mbytes_per_sec * MIB,
        )
    }

    /// `assigned_rate_limits` of `bdev_get_bdevs` (all four keys, 0 = off).
    pub fn to_json(&self) -> Value {
        json!({
            "rw_ios_per_sec": self.rw_ios_per_sec,
            "rw_mbytes_per_sec": self.rw_mbytes_per_sec,
            "r_mbytes_per_sec": self.r_mbytes_per_sec,
            "w_mbytes_per_sec": self.w_mbytes_per_sec,
        })
    }
}

/// `rw_ios_per_sec` as SPDK keeps it: rounded up to a multiple of 1000
/// (0 stays 0: no limit).
pub fn round_ios_per_sec(v: u64) -> u64 {
    v.div_ceil(QOS_IOS_GRANULE) * QOS_IOS_GRANULE
}

impl TargetConfig {
    /// The limits of bdev `name` (all 0 when it has none).
    pub fn qos_limits(&self, name: &str) -> QosLimits {
        self.bdev_qos.get(name).copied().unwrap_or_default()
    }
}

/// `bdev_set_qos_limit {name, rw_ios_per_sec?, rw_mbytes_per_sec?,
/// r_mbytes_per_sec?, w_mbytes_per_sec?}`.
pub(crate) fn set_limit(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let name = p.req_str("name")?;
    let ios = p.opt_u64("rw_ios_per_sec")?;
    let rw = p.opt_u64("rw_mbytes_per_sec")?;
    let r = p.opt_u64("r_mbytes_per_sec")?;
    let w = p.opt_u64("w_mbytes_per_sec")?;
    p.finish()?;
    if cfg.bdev(name).is_none() {
        return Err(p.err("name", format!("no bdev named \"{name}\"")));
    }
    if ios.is_none() && rw.is_none() && r.is_none() && w.is_none() {
        return Err(ConfigError::for_method(
            p.method(),
            "no rate limit given: set at least one of rw_ios_per_sec, rw_mbytes_per_sec, \
             r_mbytes_per_sec, w_mbytes_per_sec (0 turns a limit off)",
        ));
    }
    if let Some(v) = ios.filter(|&v| v > QOS_MAX_IOS_PER_SEC) {
        return Err(p.err(
            "rw_ios_per_sec",
            format!("{v} is too large (at most {QOS_MAX_IOS_PER_SEC}; 0 turns the limit off)"),
        ));
    }
    for (key, v) in [
        ("rw_mbytes_per_sec", rw),
        ("r_mbytes_per_sec", r),
        ("w_mbytes_per_sec", w),
    ] {
        if let Some(v) = v.filter(|&v| v > QOS_MAX_MBYTES_PER_SEC) {
            return Err(p.err(
                key,
                format!(
                    "{v} MiB/s is too large (at most {QOS_MAX_MBYTES_PER_SEC}; 0 turns the limit off)"
                ),
            ));
        }
    }
    let mut l = cfg.qos_limits(name);
    if let Some(v) = ios {
        l.rw_ios_per_sec = round_ios_per_sec(v);
    }
    if let Some(v) = rw {
        l.rw_mbytes_per_sec = v;
    }
    if let Some(v) = r {
        l.r_mbytes_per_sec = v;
    }
    if let Some(v) = w {
        l.w_mbytes_per_sec = v;
    }
    if l.is_unlimited() {
        cfg.bdev_qos.remove(name);
    } else {
        cfg.bdev_qos.insert(name.to_string(), l);
    }
    Ok(())
}

/// The `bdev_set_qos_limit` entry `save_config` writes right after bdev
/// `name`'s creation (all four values, as SPDK writes them); `None` for a
/// bdev without limits.
pub(crate) fn entry(cfg: &TargetConfig, name: &str) -> Option<Value> {
    let l = cfg.bdev_qos.get(name)?;
    let mut params = l.to_json();
    params["name"] = json!(name);
    Some(json!({ "method": "bdev_set_qos_limit", "params": params }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TargetConfig {
        TargetConfig::embedded_default()
    }

    fn set(c: &mut TargetConfig, p: Value) -> Result<(), ConfigError> {
        c.apply_method("bdev_set_qos_limit", Some(&p))
    }

    #[test]
    fn ios_round_up_to_thousands() {
        for (given, kept) in [
            (0, 0),
            (1, 1000),
            (999, 1000),
            (1000, 1000),
            (1001, 2000),
            (5000, 5000),
            (5500, 6000),
        ] {
            assert_eq!(round_ios_per_sec(given), kept, "{given}");
            let mut c = cfg();
            set(&mut c, json!({"name": "Malloc0", "rw_ios_per_sec": given})).unwrap();
            assert_eq!(c.qos_limits("Malloc0").rw_ios_per_sec, kept, "{given}");
        }
    }

    #[test]
    fn absent_is_unchanged_zero_turns_off() {
        let mut c = cfg();
        set(
            &mut c,
            json!({"name": "Malloc0", "rw_ios_per_sec": 2000, "w_mbytes_per_sec": 10}),
        )
        .unwrap();
        set(&mut c, json!({"name": "Malloc0", "r_mbytes_per_sec": 5})).unwrap();
        assert_eq!(
            c.qos_limits("Malloc0"),
            QosLimits {
                rw_ios_per_sec: 2000,
                rw_mbytes_per_sec: 0,
                r_mbytes_per_sec: 5,
                w_mbytes_per_sec: 10
            }
        );
        set(
            &mut c,
            json!({"name": "Malloc0", "rw_ios_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0}),
        )
        .unwrap();
        assert!(c.bdev_qos.is_empty(), "all off: no entry");
    }

    #[test]
    fn bad_values_are_refused_with_the_reason() {
        let mut c = cfg();
        let cases = [
            (
                json!({"name": "Nope", "rw_ios_per_sec": 1000}),
                "no bdev named \"Nope\"",
            ),
            (json!({"name": "Malloc0"}), "no rate limit given"),
            (
                json!({"name": "Malloc0", "rw_ios_per_sec": -1}),
                "rw_ios_per_sec",
            ),
            (
                json!({"name": "Malloc0", "rw_mbytes_per_sec": 1.5}),
                "rw_mbytes_per_sec",
            ),
            (
                json!({"name": "Malloc0", "r_mbytes_per_sec": "10"}),
                "r_mbytes_per_sec",
            ),
            (
                json!({"name": "Malloc0", "w_mbytes_per_sec": 1u64 << 41}),
                "too large",
            ),
            (
                json!({"name": "Malloc0", "rw_ios_per_sec": u64::MAX}),
                "too large",
            ),
            (
                json!({"name": "Malloc0", "rw_ios_per_sec": 1000, "x": 1}),
                "x",
            ),
        ];
        for (p, want) in cases {
            let e = set(&mut c, p.clone()).unwrap_err().to_string();
            assert!(e.contains(want), "{p}: {e}");
            assert!(c.bdev_qos.is_empty(), "{p}: nothing changed");
        }
    }

    #[test]
    fn save_config_writes_the_entry_after_the_bdev_and_loads_back() {
        let mut c = cfg();
        set(
            &mut c,
            json!({"name": "Malloc0", "rw_ios_per_sec": 3000, "rw_mbytes_per_sec": 7}),
        )
        .unwrap();
        let v = c.to_json_value();
        let text = v.to_string();
        let create = text.find("bdev_malloc_create").unwrap();
        let qos = text.find("bdev_set_qos_limit").unwrap();
        assert!(create < qos, "after the bdev's creation: {text}");
        assert!(text.contains("\"r_mbytes_per_sec\":0"), "{text}");
        let back = TargetConfig::from_json_value(&v).unwrap();
        assert_eq!(back.qos_limits("Malloc0"), c.qos_limits("Malloc0"));
        assert_eq!(back, c);
    }

    #[test]
    fn config_file_entry_before_its_bdev_is_refused() {
        let text = r#"{"subsystems":[{"subsystem":"bdev","config":[
            {"method":"bdev_set_qos_limit","params":{"name":"M","rw_ios_per_sec":1000}},
            {"method":"bdev_malloc_create","params":{"name":"M","num_blocks":64,"block_size":512}}
        ]}]}"#;
        let e = TargetConfig::from_json_str(text).unwrap_err().to_string();
        assert!(e.contains("no bdev named \"M\""), "{e}");
    }
}
