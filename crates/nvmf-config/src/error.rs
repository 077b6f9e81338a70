//! Owns `ConfigError`: every way loading a config can fail, with enough context
//! (file, config entry, SPDK method, parameter) for a person to fix the file.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a config could not be loaded. Display reads like
/// `nvmf_subsystem_add_ns: parameter "namespace.bdev_name": no bdev named "Malloc9" (config entry subsystems[1].config[3])`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The text is not JSON.
    #[error("{}malformed JSON: {source}", PathPrefix(path.as_deref()))]
    Json {
        path: Option<PathBuf>,
        #[source]
        source: serde_json::Error,
    },
    /// The JSON is not a valid nvmfd config.
    #[error("{}", Invalid { path: path.as_deref(), entry: entry.as_deref(), method: method.as_deref(), param: param.as_deref(), problem })]
    Invalid {
        /// The file, when loaded with [`crate::load_file`].
        path: Option<PathBuf>,
        /// Where in the document, e.g. `subsystems[1].config[3]`.
        entry: Option<String>,
        /// The SPDK method of that entry.
        method: Option<String>,
        /// The parameter, dotted for nested ones (`namespace.nguid`).
        param: Option<String>,
        /// What is wrong.
        problem: String,
    },
}

struct PathPrefix<'a>(Option<&'a Path>);

impl fmt::Display for PathPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(p) => write!(f, "{}: ", p.display()),
            None => Ok(()),
        }
    }
}

struct Invalid<'a> {
    path: Option<&'a Path>,
    entry: Option<&'a str>,
    method: Option<&'a str>,
    param: Option<&'a str>,
    problem: &'a str,
}

impl fmt::Display for Invalid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", PathPrefix(self.path))?;
        if let Some(m) = self.method {
            write!(f, "{m}: ")?;
        }
        if let Some(p) = self.param {
            write!(f, "parameter \"{p}\": ")?;
        }
        f.write_str(self.problem)?;
        if let Some(e) = self.entry {
            write!(f, " (config entry {e})")?;
        }
        Ok(())
    }
}

impl ConfigError {
    /// An `Invalid` error with only a problem text.
    pub(crate) fn invalid(problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: None,
            entry: None,
            method: None,
            param: None,
            problem: problem.into(),
        }
    }

    /// An `Invalid` error about one parameter of one method.
    pub(crate) fn for_param(method: &str, param: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: None,
            entry: None,
            method: Some(method.to_string()),
            param: Some(param.to_string()),
            problem: problem.into(),
        }
    }

    /// An `Invalid` error about a method as a whole.
    pub(crate) fn for_method(method: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: None,
            entry: None,
            method: Some(method.to_string()),
            param: None,
            problem: problem.into(),
        }
    }

    /// Attaches the config entry location if none is set yet.
    pub(crate) fn at_entry(mut self, loc: &str) -> ConfigError {
        if let ConfigError::Invalid { entry, .. } = &mut self {
            if entry.is_none() {
                *entry = Some(loc.to_string());
            }
        }
        self
    }

    /// Attaches the file path.
    pub(crate) fn with_path(mut self, p: &Path) -> ConfigError {
        match &mut self {
            ConfigError::Json { path, .. } | ConfigError::Invalid { path, .. } => {
                *path = Some(p.to_path_buf());
            }
            ConfigError::Io { .. } => {}
        }
        self
    }

    /// The SPDK method the error is about, if any.
    pub fn method(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { method, .. } => method.as_deref(),
            _ => None,
        }
    }

    /// The parameter the error is about (dotted for nested ones), if any.
    pub fn param(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { param, .. } => param.as_deref(),
            _ => None,
        }
    }

    /// The config entry location (e.g. `subsystems[1].config[3]`), if any.
    pub fn entry(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { entry, .. } => entry.as_deref(),
            _ => None,
        }
    }
}
