//! Exit codes of the command-line contract (README.md, "Exit codes").
//!
//! Any error that reaches `main` exits 1 unless an [`Exit`] sits in its chain,
//! in which case the [`Exit`]'s code is used.
//!
//! Answers map onto the same codes: `contains` says `no` with the generic
//! 1 and `unknown` (a shallow mirror lacks the commit, so no answer can be given
//! from it) with [`Exit::BadInput`]'s 2 (docs/sbom.md).

/// A failure with a contract exit code other than the generic 1.
///
/// Build it with the helpers ([`bad_input`], [`mismatch`], [`not_gateable`])
/// and return it through `anyhow`; `main` finds it with `downcast_ref`.
#[derive(Debug, thiserror::Error)]
pub enum Exit {
    /// Exit 2: bad input or usage (a recipe, a flag, a PIN). Nothing was changed.
    #[error("{0}")]
    BadInput(String),
    /// Exit 3: the oracle's measured identity differs from what was expected.
    #[error("{0}")]
    Mismatch(String),
    /// Exit 4: the oracle was built but is not gateable.
    #[error("{0}")]
    NotGateable(String),
}

impl Exit {
    /// The process exit code of this failure (2, 3 or 4).
    pub fn code(&self) -> i32 {
        match self {
            Exit::BadInput(_) => 2,
            Exit::Mismatch(_) => 3,
            Exit::NotGateable(_) => 4,
        }
    }
}

/// An `anyhow::Error` that exits 2 with `msg`.
pub fn bad_input(msg: impl Into<String>) -> anyhow::Error {
    Exit::BadInput(msg.into()).into()
}

/// An `anyhow::Error` that exits 3 with `msg`.
pub fn mismatch(msg: impl Into<String>) -> anyhow::Error {
    Exit::Mismatch(msg.into()).into()
}

/// An `anyhow::Error` that exits 4 with `msg`.
pub fn not_gateable(msg: impl Into<String>) -> anyhow::Error {
    Exit::NotGateable(msg.into()).into()
}

/// The exit code for an error: the first [`Exit`] in its chain, else 1.
pub fn code_of(err: &anyhow::Error) -> i32 {
    err.chain()
        .find_map(|e| e.downcast_ref::<Exit>())
        .map_or(1, Exit::code)
}
