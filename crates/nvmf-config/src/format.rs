//! Owns the format version of the files nvmfd writes for itself (the `--state` file, the
//! packaged configuration): a top-level `"nvmfd": {"format": N, "version": "X.Y.Z"}` object
//! beside SPDK's `"subsystems"` array (SPDK's own loaders read only `"subsystems"`).
//!
//! * Format 0 is a file without that object: SPDK's `save_config` output and every file nvmfd
//!   wrote before the format was versioned. It is read as it is.
//! * [`FORMAT_VERSION`] is what this build writes; it reads every format up to it.
//! * A file in a newer format was written by a newer nvmfd (after an upgrade, then a
//!   downgrade of the package): it is refused with a message naming both versions, rather
//!   than half-understood.

use serde_json::{json, Map, Value};

use crate::ConfigError;

/// The top-level key of the format object.
pub const FORMAT_KEY: &str = "nvmfd";
/// The format this build writes, and the newest it reads.
pub const FORMAT_VERSION: u64 = 1;

/// The format object this build writes.
pub fn format_object() -> Value {
    json!({"format": FORMAT_VERSION, "version": env!("CARGO_PKG_VERSION")})
}

/// `doc` with the format object added (a document that is not an object is returned as is).
pub fn with_format(mut doc: Value) -> Value {
    if let Value::Object(m) = &mut doc {
        // Written first, so that a reader sees it before the configuration.
        let mut out = Map::new();
        out.insert(FORMAT_KEY.into(), format_object());
        for (k, v) in std::mem::take(m) {
            if k != FORMAT_KEY {
                out.insert(k, v);
            }
        }
        *m = out;
    }
    doc
}

/// The format of a document's top-level object (0 without the format object); an error for
/// a malformed object or a format newer than [`FORMAT_VERSION`].
pub(crate) fn check(top: &Map<String, Value>) -> Result<u64, ConfigError> {
    let Some(v) = top.get(FORMAT_KEY) else {
        return Ok(0);
    };
    let obj = v.as_object().ok_or_else(|| {
        ConfigError::invalid(format!(
            "\"{FORMAT_KEY}\" must be an object {{\"format\": N, \"version\": \"X.Y.Z\"}}"
        ))
    })?;
    for k in obj.keys() {
        if k != "format" && k != "version" {
            return Err(ConfigError::invalid(format!(
                "unknown key \"{k}\" in \"{FORMAT_KEY}\" (expected \"format\" and \"version\")"
            )));
        }
    }
    let format = obj.get("format").and_then(Value::as_u64).ok_or_else(|| {
        ConfigError::invalid(format!(
            "\"{FORMAT_KEY}\".\"format\" must be a non-negative integer"
        ))
    })?;
    if format > FORMAT_VERSION {
        let by = obj
            .get("version")
            .and_then(Value::as_str)
            .map(|v| format!("nvmfd {v}"))
            .unwrap_or_else(|| "a newer nvmfd".into());
        return Err(ConfigError::invalid(format!(
            "written by {by} in file format {format}; this nvmfd ({}) reads formats up to \
             {FORMAT_VERSION}. Refusing to misread it: run nvmfd {} or newer again, or start this \
             version from a configuration it can read (a downgrade does not convert state)",
            env!("CARGO_PKG_VERSION"),
            obj.get("version")
                .and_then(Value::as_str)
                .unwrap_or("(that version)")
        )));
    }
    Ok(format)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn absent_is_format_0_current_is_read_newer_is_refused_naming_both_versions() {
        assert_eq!(check(&top(json!({"subsystems": []}))).unwrap(), 0);
        let cur = with_format(json!({"subsystems": []}));
        assert_eq!(check(&top(cur.clone())).unwrap(), FORMAT_VERSION);
        assert_eq!(cur.as_object().unwrap().keys().next().unwrap(), FORMAT_KEY);
        let newer = json!({"nvmfd": {"format": FORMAT_VERSION + 1, "version": "9.9.9"}});
        let e = check(&top(newer)).unwrap_err().to_string();
        assert!(e.contains("nvmfd 9.9.9"), "{e}");
        assert!(e.contains(env!("CARGO_PKG_VERSION")), "{e}");
        assert!(e.contains("Refusing to misread"), "{e}");
        for bad in [
            json!({"nvmfd": 1}),
            json!({"nvmfd": {"format": "1"}}),
            json!({"nvmfd": {"format": -1}}),
            json!({"nvmfd": {"format": 1, "extra": true}}),
        ] {
            assert!(check(&top(bad.clone())).is_err(), "{bad}");
        }
    }
}
