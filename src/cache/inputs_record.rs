//! The record of a pin's `inputs-<key>` artifact: what a box needs to
//! build a pin, as the pushing box found it (`push` writes it, `pull` and
//! `cache gc` read it), and the key it is found by.

/// The record of an `inputs-<key>` artifact: what a box needs to build a
/// pin, as the pushing box found it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InputsRecord {
    /// Recipe name.
    pub recipe: String,
    /// The pinned commit.
    pub commit: String,
    /// The recipe's repository URL.
    pub repo: String,
    /// The platform it was built for (uv's `--python-platform` spelling).
    pub platform: Option<String>,
    /// The store entries it needs (`wheelhouse/<sha>`, `ext/<name>`,
    /// `lockfiles/<key>`, `wheels/<key>`), in pipeline order.
    pub entries: Vec<String>,
    /// The wheel key of the pushing box's oracle.
    pub wheel_key: String,
    /// The venv key of the pushing box's oracle (evidence: the pulling box
    /// installs and measures its own).
    pub venv_key: String,
    /// The tag each entry was pushed under (by label; the source as
    /// `src/<commit>`), so `pull` takes exactly what the pushing box built
    /// with; empty in inputs pushed before issue 23.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tags: std::collections::BTreeMap<String, String>,
    /// The wheelhouse entry (`wheelhouse/<sha256>`, also in `entries`) of
    /// the pinned uv's wheel for the platform, which `pull` installs into
    /// the store's tools; absent from older pushes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uv: Option<String>,
}

/// The key of the `inputs-<key>` artifact of recipe `lr` on this host: the
/// sha256 of the recipe's exact text and the host platform, so any box with
/// the same recipe finds it without a lock or a checkout.
pub fn inputs_key(lr: &crate::recipe::LoadedRecipe) -> String {
    use sha2::{Digest, Sha256};
    crate::store::key::content_key(&serde_json::json!({
        "schema": crate::store::key::KEY_SCHEMA, "stage": "inputs",
        "recipe_sha256": hex::encode(Sha256::digest(lr.text.as_bytes())),
        "platform": crate::host::platform::Platform::host().map(|p| p.spelled),
    }))
}
