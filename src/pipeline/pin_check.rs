//! The recipe's pins against its tree's exact pins: a pin (a uv override)
//! that contradicts an exact `==` pin of the pinned tree's requirement
//! files is said by `build` and `plan` (docs/advance.md, "A pin against
//! its tree"). It is a warning, never a refusal: a team may override on
//! purpose.

use crate::recipe::LoadedRecipe;
use crate::stages::source;
use crate::stages::tree_requires;
use crate::store::Store;

/// One warning per pin of `lr` that contradicts an exact pin of its tree
/// at `source.commit`, naming both (the pin with its recipe line, the
/// tree's requirement with its file:line). The tree is read from the
/// store's mirror (nothing is fetched): empty when the mirror does not
/// hold the commit yet.
pub fn warnings(store: &Store, lr: &LoadedRecipe) -> Vec<String> {
    let r = &lr.recipe;
    if r.pins.is_empty() {
        return Vec::new();
    }
    let mirror = source::mirror_entry(store, &r.source.repo);
    let Ok(tree) = tree_requires::read_at(&mirror.path, &r.source.commit, &r.build.target_device)
    else {
        return Vec::new();
    };
    tree_requires::contradictions(&r.pins, &tree)
        .into_iter()
        .map(|(name, version, exact)| {
            let at = crate::recipe::locate(&lr.text, &format!("pins.{name}"))
                .map(|l| format!("{}:{l}", lr.origin))
                .unwrap_or_else(|| lr.origin.clone());
            let tree_says = exact
                .iter()
                .map(|t| format!("`{}` ({})", t.requirement, t.at()))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "pin `{name}: {version}` ({at}) contradicts the tree's exact pin {tree_says} at {}: the pin overrides it (uv override); drop the pin to take the tree's version",
                &r.source.commit[..12.min(r.source.commit.len())]
            )
        })
        .collect()
}
