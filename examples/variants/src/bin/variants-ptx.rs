//! Writes the example's variant module ([`fa3_variants_example::PTX`], the kernels of
//! `VARIANTS`) to a file, for bindings that load it at run time (the PyTorch extension's
//! `VariantModule`, candle-flash-attn3's `load_variants`) on machines without Rust.
//!
//! usage: variants-ptx OUT.ptx
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out] = &args[..] else { return Err("usage: variants-ptx OUT.ptx".into()) };
    std::fs::write(out, fa3_variants_example::PTX)?;
    println!("{out}: {} bytes, variants {:?}", fa3_variants_example::PTX.len(), fa3_variants_example::VARIANTS);
    Ok(())
}
