//! Builds the Rust GPU kernels to PTX (embedded by `gpu.rs`).
//! `FA3_PTX=/path/kernels.ptx` uses a prebuilt module instead.
use std::path::PathBuf;

fn main() {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let out_ptx = out_dir.join("kernels.ptx");
    println!("cargo:rerun-if-env-changed=FA3_PTX");
    if let Ok(prebuilt) = std::env::var("FA3_PTX") {
        println!("cargo:rerun-if-changed={prebuilt}");
        std::fs::copy(&prebuilt, &out_ptx).unwrap_or_else(|e| panic!("FA3_PTX={prebuilt}: {e}"));
        return;
    }
    let root = ptx_builder::repo_root();
    for dir in ["kernels-gpu/src", "common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!("cargo:rerun-if-changed={}", root.join("kernels-gpu/Cargo.toml").display());
    let cfg = ptx_builder::BuildConfig::in_repo(&out_dir, out_ptx);
    match ptx_builder::build(&cfg) {
        Ok(_) => {}
        Err(e) => panic!("building the GPU kernels failed: {e}"),
    }
}
