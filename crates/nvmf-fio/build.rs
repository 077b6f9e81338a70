//! build.rs — compiles the fio shim (csrc/nvmf_fio.c) when FIO_SRC names a
//! configured fio source tree (one with config-host.h, made by fio's
//! ./configure) and sets cfg `nvmf_fio_shim`, which exports `get_ioengine`.
//! Without FIO_SRC nothing fio-specific is built, so the workspace builds
//! anywhere. scripts/build-fio-engine.sh sets FIO_SRC.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=FIO_SRC");
    println!("cargo:rerun-if-changed=csrc/nvmf_fio.c");
    println!("cargo::rustc-check-cfg=cfg(nvmf_fio_shim)");
    let Some(src) = std::env::var_os("FIO_SRC").filter(|s| !s.is_empty()) else {
        return;
    };
    let src = PathBuf::from(src);
    let config = src.join("config-host.h");
    if !config.is_file() || !src.join("ioengines.h").is_file() {
        panic!(
            "FIO_SRC={} is not a configured fio source tree (no config-host.h or ioengines.h; run fio's ./configure there)",
            src.display()
        );
    }
    println!("cargo:rerun-if-changed={}", config.display());
    // The flags fio's own Makefile and configure compile every object with, so
    // the shim sees the same structure layouts as the fio binary.
    cc::Build::new()
        .file("csrc/nvmf_fio.c")
        .include(&src)
        .flag("-std=gnu99")
        .flag("-include")
        .flag(config.to_str().expect("FIO_SRC is not UTF-8"))
        .define("_GNU_SOURCE", None)
        .define("_LARGEFILE_SOURCE", None)
        .define("_FILE_OFFSET_BITS", "64")
        .define("FIO_INTERNAL", None)
        .define("FIO_INC_DEBUG", None)
        .flag("-fPIC")
        .warnings(false)
        .compile("nvmf_fio_shim");
    println!("cargo:rustc-cfg=nvmf_fio_shim");
    // fio's symbols (log_err, ...) come from the fio executable at load time.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,undefs");
}
