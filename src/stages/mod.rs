//! The pipeline stages, one module each, in the order data flows:
//! recipe -> [`source`] -> [`wheel`] -> [`venv`] (install, [`identity`], [`smoke`]) -> record.

pub mod added;
pub mod ext;
pub mod identity;
pub mod installer;
pub mod lock;
pub mod oracle;
pub mod requires;
pub mod rust;
pub mod smoke;
pub mod source;
pub mod toolchain_req;
pub mod tree_requires;
pub mod venv;
pub mod wheel;
pub mod wheelhouse;

use crate::host::toolchain::Toolchain;
use crate::host::uv::Uv;
use crate::recipe::LoadedRecipe;
use crate::store::Store;

/// What every stage of one build works with: the store, the recipe, the
/// toolchain found by the preflight, and uv with the recipe's indexes.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    /// The store.
    pub store: &'a Store,
    /// The recipe being built.
    pub lr: &'a LoadedRecipe,
    /// Python, uv, compilers (recorded in `build.json`).
    pub tc: &'a Toolchain,
    /// uv, configured with the recipe's indexes and `--offline`.
    pub uv: &'a Uv,
}
