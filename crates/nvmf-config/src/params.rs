//! Owns typed, strict reading of one method's `params` object: every getter
//! marks its key as known, wrong types and out-of-range numbers are errors
//! that name the (dotted) parameter, and `finish` rejects any key nobody asked
//! for. Parameters SPDK defines but nvmfd does not act on go through `ignore`,
//! which type-checks them and records `method.param` in the ignored list.

use serde_json::{Map, Value};

use crate::ConfigError;

/// JSON type expected of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Str,
    Bool,
    U8,
    U16,
    U32,
    U64,
    I32,
    Object,
    /// Any JSON value (for options whose SPDK type nvmfd does not model).
    Any,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Str => "a string",
            Kind::Bool => "a boolean",
            Kind::U8 => "an unsigned 8-bit integer",
            Kind::U16 => "an unsigned 16-bit integer",
            Kind::U32 => "an unsigned 32-bit integer",
            Kind::U64 => "an unsigned 64-bit integer",
            Kind::I32 => "a signed 32-bit integer",
            Kind::Object => "an object",
            Kind::Any => "any value",
        }
    }

    fn matches(self, v: &Value) -> bool {
        match self {
            Kind::Str => v.is_string(),
            Kind::Bool => v.is_boolean(),
            Kind::U8 => v.as_u64().is_some_and(|n| n <= u64::from(u8::MAX)),
            Kind::U16 => v.as_u64().is_some_and(|n| n <= u64::from(u16::MAX)),
            Kind::U32 => v.as_u64().is_some_and(|n| n <= u64::from(u32::MAX)),
            Kind::U64 => v.as_u64().is_some(),
            Kind::I32 => v.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
            Kind::Object => v.is_object(),
            Kind::Any => true,
        }
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string \"{s}\""),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();

pub(crate) struct Params<'a> {
    method: &'a str,
    prefix: String,
    map: &'a Map<String, Value>,
    seen: Vec<&'a str>,
}

impl<'a> Params<'a> {
    /// `params` of a method; absent means `{}`.
    pub(crate) fn new(method: &'a str, v: Option<&'a Value>) -> Result<Params<'a>, ConfigError> {
        match v {
            None => Ok(Params {
                method,
                prefix: String::new(),
                map: EMPTY.get_or_init(Map::new),
                seen: Vec::new(),
            }),
            Some(Value::Object(map)) => Ok(Params {
                method,
                prefix: String::new(),
                map,
                seen: Vec::new(),
            }),
            Some(other) => Err(ConfigError::for_param(
                method,
                "params",
                format!("expected an object, got {}", describe(other)),
            )),
        }
    }

    pub(crate) fn method(&self) -> &'a str {
        self.method
    }

    /// Full dotted name of a parameter.
    pub(crate) fn full(&self, name: &str) -> String {
        format!("{}{}", self.prefix, name)
    }

    /// An error about parameter `name`.
    pub(crate) fn err(&self, name: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::for_param(self.method, &self.full(name), problem)
    }

    fn get(&mut self, name: &'a str, kind: Kind) -> Result<Option<&'a Value>, ConfigError> {
        self.seen.push(name);
        match self.map.get(name) {
            None => Ok(None),
            Some(v) if kind.matches(v) => Ok(Some(v)),
            Some(v) => Err(self.err(
                name,
                format!("expected {}, got {}", kind.name(), describe(v)),
            )),
        }
    }

    fn required(&self, name: &str) -> ConfigError {
        self.err(name, "missing required parameter")
    }

    /// Any JSON value (the caller checks its shape).
    pub(crate) fn opt_any(&mut self, name: &'a str) -> Result<Option<&'a Value>, ConfigError> {
        self.get(name, Kind::Any)
    }

    pub(crate) fn opt_str(&mut self, name: &'a str) -> Result<Option<&'a str>, ConfigError> {
        Ok(self.get(name, Kind::Str)?.and_then(Value::as_str))
    }

    pub(crate) fn req_str(&mut self, name: &'a str) -> Result<&'a str, ConfigError> {
        self.opt_str(name)?.ok_or_else(|| self.required(name))
    }

    pub(crate) fn opt_bool(&mut self, name: &'a str) -> Result<Option<bool>, ConfigError> {
        Ok(self.get(name, Kind::Bool)?.and_then(Value::as_bool))
    }

    pub(crate) fn req_bool(&mut self, name: &'a str) -> Result<bool, ConfigError> {
        self.opt_bool(name)?.ok_or_else(|| self.required(name))
    }

    pub(crate) fn opt_u64(&mut self, name: &'a str) -> Result<Option<u64>, ConfigError> {
        Ok(self.get(name, Kind::U64)?.and_then(Value::as_u64))
    }

    pub(crate) fn req_u64(&mut self, name: &'a str) -> Result<u64, ConfigError> {
        self.opt_u64(name)?.ok_or_else(|| self.required(name))
    }

    pub(crate) fn opt_u32(&mut self, name: &'a str) -> Result<Option<u32>, ConfigError> {
        Ok(self
            .get(name, Kind::U32)?
            .and_then(Value::as_u64)
            .map(|n| n as u32))
    }

    pub(crate) fn req_u32(&mut self, name: &'a str) -> Result<u32, ConfigError> {
        self.opt_u32(name)?.ok_or_else(|| self.required(name))
    }

    pub(crate) fn opt_u16(&mut self, name: &'a str) -> Result<Option<u16>, ConfigError> {
        Ok(self
            .get(name, Kind::U16)?
            .and_then(Value::as_u64)
            .map(|n| n as u16))
    }

    pub(crate) fn opt_i64(
        &mut self,
        name: &'a str,
        kind: Kind,
    ) -> Result<Option<i64>, ConfigError> {
        Ok(self.get(name, kind)?.and_then(Value::as_i64))
    }

    /// An object parameter whose values must all be strings (SPDK's
    /// "string map", e.g. librados configuration), as an ordered map.
    pub(crate) fn opt_string_map(
        &mut self,
        name: &'a str,
    ) -> Result<Option<std::collections::BTreeMap<String, String>>, ConfigError> {
        let Some(v) = self.get(name, Kind::Object)? else {
            return Ok(None);
        };
        let mut out = std::collections::BTreeMap::new();
        for (k, val) in v.as_object().expect("checked object") {
            let Some(s) = val.as_str() else {
                return Err(self.err(
                    &format!("{name}.{k}"),
                    format!("expected a string, got {}", describe(val)),
                ));
            };
            if k.is_empty() {
                return Err(self.err(name, "a key must not be empty"));
            }
            out.insert(k.clone(), s.to_string());
        }
        Ok(Some(out))
    }

    /// A nested object parameter, read with the same rules (`name.` prefix).
    pub(crate) fn req_object(&mut self, name: &'a str) -> Result<Params<'a>, ConfigError> {
        let v = self
            .get(name, Kind::Object)?
            .ok_or_else(|| self.required(name))?;
        Ok(Params {
            method: self.method,
            prefix: format!("{}{}.", self.prefix, name),
            map: v.as_object().expect("checked object"),
            seen: Vec::new(),
        })
    }

    /// Accepts parameters SPDK defines but nvmfd does not act on: type-checks
    /// each present one and records `method.param` in `ignored` (once).
    pub(crate) fn ignore(
        &mut self,
        names: &[(&'a str, Kind)],
        ignored: &mut Vec<String>,
    ) -> Result<(), ConfigError> {
        for &(name, kind) in names {
            if self.get(name, kind)?.is_some() {
                let entry = format!("{}.{}", self.method, self.full(name));
                if !ignored.contains(&entry) {
                    ignored.push(entry);
                }
            }
        }
        Ok(())
    }

    /// Errors on the first parameter no getter asked for.
    pub(crate) fn finish(&self) -> Result<(), ConfigError> {
        for key in self.map.keys() {
            if !self.seen.iter().any(|s| s == key) {
                return Err(self.err(
                    key,
                    format!(
                        "unknown parameter (SPDK's {} defines no such parameter)",
                        self.method
                    ),
                ));
            }
        }
        Ok(())
    }
}
