//! Builds this crate's variants (`kernels/`) into the library's kernels: one PTX module,
//! embedded by `src/lib.rs`. `FA3_VARIANTS_PTX=/path/variants.ptx` uses a prebuilt one.
fn main() {
    println!("cargo:rerun-if-env-changed=FA3_VARIANTS_PTX");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("variants.ptx");
    if let Ok(prebuilt) = std::env::var("FA3_VARIANTS_PTX") {
        println!("cargo:rerun-if-changed={prebuilt}");
        std::fs::copy(&prebuilt, &out).unwrap_or_else(|e| panic!("FA3_VARIANTS_PTX={prebuilt}: {e}"));
        return;
    }
    // The library's kernel sources too: the module compiles them.
    let root = ptx_builder::repo_root();
    for dir in ["kernels-gpu/src", "common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    if let Err(e) = ptx_builder::build_variant_module("kernels".as_ref(), &crate::VARIANTS, "variants.ptx") {
        panic!("building the variant kernels failed: {e}");
    }
}

/// The variants `kernels/src/lib.rs` passes to `variant_kernels!`.
const VARIANTS: [&str; 2] = ["rel_bias", "prefix_lm"];
