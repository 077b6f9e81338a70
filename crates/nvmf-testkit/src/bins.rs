//! Where the workspace's binaries under test are: `nvmfd` (the daemon) and `nvmf` (the
//! initiator CLI). `$NVMFD_BIN` / `$NVMF_BIN` name them explicitly; otherwise they are in the
//! profile directory of the running test executable (`target/<profile>/`, the test itself
//! being in `target/<profile>/deps/`), built there with cargo if missing (a test of one
//! package may need the other package's binary).

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/` of the running test executable.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// The `nvmfd` daemon binary.
pub fn nvmfd() -> PathBuf {
    locate("NVMFD_BIN", "nvmfd", "nvmfd")
}

/// `Command::new(nvmfd())`.
pub fn nvmfd_command() -> Command {
    Command::new(nvmfd())
}

/// The `nvmf` CLI binary.
pub fn nvmf() -> PathBuf {
    locate("NVMF_BIN", "nvmf-host", "nvmf")
}

fn locate(var: &str, package: &str, bin: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return PathBuf::from(p);
    }
    let dir = profile_dir();
    let p = dir.join(bin);
    if !p.is_file() {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", package, "--bin", bin]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run cargo to build {bin}: {e}"));
        assert!(
            st.success() && p.is_file(),
            "{bin} is not at {} and `cargo build -p {package} --bin {bin}` did not put it there \
             (build it first, or set {var})",
            p.display()
        );
    }
    p
}
