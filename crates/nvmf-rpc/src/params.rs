//! Owns parameter checking for the methods implemented in this crate (deletes,
//! removes, queries): the params must be an object (or absent/null), each
//! named parameter must have the right JSON type, and unknown parameters are
//! rejected, as SPDK's JSON object decoders do. Errors are "invalid params"
//! and name the method and the parameter.

use serde_json::{Map, Value};

use crate::error::RpcError;

pub(crate) struct Params<'a> {
    method: &'a str,
    map: Option<&'a Map<String, Value>>,
    used: Vec<&'a str>,
}

impl<'a> Params<'a> {
    pub(crate) fn new(method: &'a str, params: Option<&'a Value>) -> Result<Params<'a>, RpcError> {
        let map = match params {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => {
                return Err(RpcError::invalid_params(format!(
                    "{method}: params must be an object"
                )))
            }
        };
        Ok(Params {
            method,
            map,
            used: Vec::new(),
        })
    }

    pub(crate) fn err(&self, param: &str, problem: impl std::fmt::Display) -> RpcError {
        RpcError::invalid_params(format!("{}: parameter \"{param}\": {problem}", self.method))
    }

    fn get(&mut self, name: &'a str) -> Option<&'a Value> {
        self.used.push(name);
        match self.map.and_then(|m| m.get(name)) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub(crate) fn opt_str(&mut self, name: &'a str) -> Result<Option<&'a str>, RpcError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.err(name, "expected a string")),
        }
    }

    pub(crate) fn req_str(&mut self, name: &'a str) -> Result<&'a str, RpcError> {
        self.opt_str(name)?
            .ok_or_else(|| self.err(name, "missing required parameter"))
    }

    pub(crate) fn opt_u64(&mut self, name: &'a str, max: u64) -> Result<Option<u64>, RpcError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= max => Ok(Some(n)),
                _ => Err(self.err(name, format!("expected an integer in 0..={max}"))),
            },
        }
    }

    pub(crate) fn opt_bool(&mut self, name: &'a str) -> Result<Option<bool>, RpcError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.err(name, "expected true or false")),
        }
    }

    pub(crate) fn opt_str_list(&mut self, name: &'a str) -> Result<Option<Vec<&'a str>>, RpcError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| self.err(name, "expected an array of strings"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(self.err(name, "expected an array of strings")),
        }
    }

    pub(crate) fn opt_object(
        &mut self,
        name: &'a str,
    ) -> Result<Option<&'a Map<String, Value>>, RpcError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(self.err(name, "expected an object")),
        }
    }

    /// Accepts these parameters (any type) without acting on them.
    pub(crate) fn ignore(&mut self, names: &[&'a str]) {
        self.used.extend_from_slice(names);
    }

    /// Fails on any parameter that was not looked at.
    pub(crate) fn finish(self) -> Result<(), RpcError> {
        if let Some(m) = self.map {
            if let Some(k) = m.keys().find(|k| !self.used.contains(&k.as_str())) {
                return Err(self.err(k, "unknown parameter"));
            }
        }
        Ok(())
    }
}
