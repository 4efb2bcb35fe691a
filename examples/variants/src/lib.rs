//! User-defined attention variants from another crate, end to end:
//!
//! 1. `kernels/` defines the variants ([`RelBias`], [`PrefixLm`]) as `common::variant::Variant`
//!    impls, `no_std`, and instantiates the library's kernels for them with
//!    `kernels_gpu::variant_kernels!`;
//! 2. `build.rs` builds that crate into one PTX module with
//!    `ptx_builder::build_variant_module` ([`PTX`]);
//! 3. the host loads it once ([`flash_attn3::VariantModule::load`]) and passes a variant
//!    and its buffer with `AttnOptions::variant`, forward and backward;
//! 4. the CPU reference evaluates the same impls ([`flash_attn3::reference::HostVariantOf`]),
//!    so the GPU tests (`tests/device.rs`) compare the kernels with the variants'
//!    own definition.
pub use variants::{PrefixLm, RelBias, VARIANTS};

/// The module: the library's kernels for both variants.
pub static PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/variants.ptx"));

/// [`RelBias`]'s name in [`PTX`] (of [`VARIANTS`]).
pub const REL_BIAS: &str = VARIANTS[0];
/// [`PrefixLm`]'s name.
pub const PREFIX_LM: &str = VARIANTS[1];

/// [`RelBias`]'s buffer: the table `[heads][RelBias::BUCKETS]`, as words.
pub fn rel_bias_data(table: &[f32]) -> Vec<u32> {
    table.iter().map(|x| x.to_bits()).collect()
}

/// [`PrefixLm`]'s buffer: each batch element's prefix length.
pub fn prefix_lm_data(prefixes: &[u32]) -> Vec<u32> {
    prefixes.to_vec()
}
