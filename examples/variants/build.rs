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
    for path in ["kernels-gpu/src", "kernels-gpu/Cargo.toml", "common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    if let Err(e) = ptx_builder::build_variant_module("kernels".as_ref(), &variants::VARIANTS, "variants.ptx") {
        panic!("building the variant kernels failed: {e}");
    }
}
