//! User-defined attention variants from another crate, end to end:
//!
//! 1. `kernels/` defines the variants ([`RelBias`], [`PrefixLm`], [`LocalGlobal`]) as `common::variant::Variant`
//!    impls, `no_std`, and instantiates the library's kernels for them with
//!    `kernels_gpu::variant_kernels!`;
//! 2. `build.rs` builds that crate into one PTX module with
//!    `ptx_builder::build_variant_module` ([`PTX`]);
//! 3. the host loads it once ([`flash_attn3::VariantModule::load`]) and passes a variant
//!    and its buffer with `AttnOptions::variant`, forward and backward, and for a mask
//!    no key bound describes ([`LocalGlobal`]) a block mask built from it
//!    ([`flash_attn3::BlockMask`], `AttnOptions::block_mask`);
//! 4. the CPU reference evaluates the same impls ([`flash_attn3::reference::HostVariantOf`]),
//!    so the GPU tests (`tests/device.rs`) compare the kernels with the variants'
//!    own definition.
pub use variants::{LocalGlobal, PrefixLm, RelBias, VARIANTS};

/// The module: the library's kernels for the three variants.
pub static PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/variants.ptx"));

/// [`RelBias`]'s name in [`PTX`] (of [`VARIANTS`]).
pub const REL_BIAS: &str = VARIANTS[0];
/// [`PrefixLm`]'s name.
pub const PREFIX_LM: &str = VARIANTS[1];

/// [`LocalGlobal`]'s name.
pub const LOCAL_GLOBAL: &str = VARIANTS[2];

/// [`LocalGlobal`]'s buffer: the band's half-width and the number of global tokens.
pub fn local_global_data(window: u32, globals: u32) -> Vec<u32> {
    vec![window, globals]
}

/// [`RelBias`]'s buffer: the table `[heads][RelBias::BUCKETS]`, as words.
pub fn rel_bias_data(table: &[f32]) -> Vec<u32> {
    table.iter().map(|x| x.to_bits()).collect()
}

/// [`PrefixLm`]'s buffer: each batch element's prefix length.
pub fn prefix_lm_data(prefixes: &[u32]) -> Vec<u32> {
    prefixes.to_vec()
}
