//! Comparing a kernel's output with the CPU references under FlashAttention's rule.
use crate::reference::{AttnResult, Problem, attention_f64, attention_lowp, max_abs_err, within_budget};
use common::DType;

/// Absolute slack on O (FlashAttention's "tiny absolute slack").
pub const O_SLACK: f64 = 1e-5;
/// Absolute slack on the LSE: the kernels use the SFU's `ex2`/`lg2` approximations, and
/// 1e-4 in log space is a 1e-4 relative change of the probabilities.
pub const LSE_SLACK: f64 = 1e-4;

/// Errors of a kernel and of the naive low-precision implementation, both against f64.
#[derive(Clone, Copy, Debug)]
pub struct CheckReport {
    /// Largest absolute error of the kernel's O.
    pub o_err: f64,
    /// Largest absolute error of the naive O ([`attention_lowp`]).
    pub o_err_naive: f64,
    /// Largest absolute error of the kernel's LSE.
    pub lse_err: f64,
    /// Largest absolute error of the naive LSE.
    pub lse_err_naive: f64,
}

impl CheckReport {
    /// Whether O and LSE are both within budget: at most twice the naive error plus
    /// [`O_SLACK`] or [`LSE_SLACK`].
    pub fn passed(&self) -> bool {
        within_budget(self.o_err, self.o_err_naive, O_SLACK) && within_budget(self.lse_err, self.lse_err_naive, LSE_SLACK)
    }
}

impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max |O - O_f64| = {:.3e} (naive {:.3e}, budget {:.3e}); max |LSE - LSE_f64| = {:.3e} (naive {:.3e}, budget {:.3e}): {}",
            self.o_err,
            self.o_err_naive,
            2.0 * self.o_err_naive + O_SLACK,
            self.lse_err,
            self.lse_err_naive,
            2.0 * self.lse_err_naive + LSE_SLACK,
            if self.passed() { "PASS" } else { "FAIL" }
        )
    }
}

/// Scores `got` (O packed like q, LSE `[b, h, sq]`) against the references of `p`.
pub fn check(p: &Problem<'_>, dtype: DType, got: &AttnResult<f32>) -> CheckReport {
    let exact = attention_f64(p);
    let naive = attention_lowp(p, dtype);
    CheckReport {
        o_err: max_abs_err(&got.o, &exact.o),
        o_err_naive: max_abs_err(&naive.o, &exact.o),
        lse_err: max_abs_err(&got.lse, &exact.lse),
        lse_err_naive: max_abs_err(&naive.lse, &exact.lse),
    }
}
