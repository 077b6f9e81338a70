//! Owns `--state FILE` persistence: the configuration as `save_config` JSON
//! with nvmf-config's file format object (an older nvmfd refuses a newer file),
//! rewritten crash-safely after every successful state-changing RPC (write a
//! temporary file in the same directory, fsync it, rename it over FILE, fsync
//! the directory), so FILE always holds either the previous or the new
//! complete configuration, never a torn one. Restore at startup is
//! `nvmf_config::load_file`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use nvmf_config::{ConfigError, TargetConfig};

/// The state file of one daemon.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
    tmp: PathBuf,
    dir: PathBuf,
}

impl StateFile {
    /// A state file at `path` (not touched until `load` or `write`).
    pub fn new(path: impl Into<PathBuf>) -> StateFile {
        let path = path.into();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "state.json".to_string());
        let tmp = dir.join(format!(".{name}.tmp"));
        StateFile { path, tmp, dir }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The saved configuration, or `None` when FILE does not exist yet.
    pub fn load(&self) -> Result<Option<TargetConfig>, ConfigError> {
        if !self.path.exists() {
            return Ok(None);
        }
        nvmf_config::load_file(&self.path).map(Some)
    }

    /// Writes `cfg` (pretty `save_config` JSON) crash-safely.
    pub fn write(&self, cfg: &TargetConfig) -> io::Result<()> {
        self.write_bytes(cfg.to_versioned_json_string_pretty().as_bytes())
    }

    /// Replaces FILE's contents with `bytes` atomically and durably.
    pub fn write_bytes(&self, bytes: &[u8]) -> io::Result<()> {
        let ctx = |what: &str, p: &Path, e: io::Error| {
            io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
        };
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&self.tmp)
                .map_err(|e| ctx("cannot create", &self.tmp, e))?;
            f.write_all(bytes)
                .map_err(|e| ctx("cannot write", &self.tmp, e))?;
            f.sync_all().map_err(|e| ctx("cannot fsync", &self.tmp, e))
        })();
        if let Err(e) = written {
            // FILE itself is untouched; don't leave a partial temp file.
            let _ = fs::remove_file(&self.tmp);
            return Err(e);
        }
        fs::rename(&self.tmp, &self.path).map_err(|e| ctx("cannot rename onto", &self.path, e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| ctx("cannot fsync directory", &self.dir, e))?;
        Ok(())
    }
}
