//! The CycloneDX 1.6 JSON format, for the fields `sbom` emits: plain serde
//! types named and shaped as the official schema `bom-1.6.schema.json`
//! (<https://cyclonedx.org/docs/1.6/json/>) defines them. The maintained
//! Rust crate (`cyclonedx-bom` 0.8) models specifications up to 1.5 only,
//! so the few objects used here are written out; the integration test
//! validates every document against the 1.6 schema.

use serde::Serialize;

/// The specification version emitted.
pub const SPEC_VERSION: &str = "1.6";

/// A BOM (schema root).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bom {
    /// Always `CycloneDX`.
    pub bom_format: &'static str,
    /// [`SPEC_VERSION`].
    pub spec_version: &'static str,
    /// `urn:uuid:<RFC 4122 form>`.
    pub serial_number: String,
    /// The BOM's version (1).
    pub version: u32,
    /// What the BOM describes, when and by what tool.
    pub metadata: Metadata,
    /// Every component.
    pub components: Vec<Component>,
    /// Which component depends on which (by `bom-ref`).
    pub dependencies: Vec<Dependency>,
    /// How the components were made (the toolchains).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub formulation: Vec<Formula>,
}

/// `metadata`.
#[derive(Debug, Clone, Serialize)]
pub struct Metadata {
    /// RFC 3339 date-time.
    pub timestamp: String,
    /// `lifecycles`: the phase the BOM was made in.
    pub lifecycles: Vec<Lifecycle>,
    /// The tool that made the BOM (`tools.components`).
    pub tools: Tools,
    /// The component the BOM describes (the oracle).
    pub component: Component,
    /// Name-value pairs about the BOM.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<Property>,
}

/// One `lifecycles` item (a pre-defined phase).
#[derive(Debug, Clone, Serialize)]
pub struct Lifecycle {
    /// `design`, `pre-build`, `build`, `post-build`, `operations`, `discovery`, `decommission`.
    pub phase: &'static str,
}

/// `metadata.tools` (the 1.5+ object form).
#[derive(Debug, Clone, Serialize)]
pub struct Tools {
    /// The tools, as components.
    pub components: Vec<Component>,
}

/// A `component`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Component {
    /// `application`, `library`, `file`, ... (schema `component.type`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// A reference unique in the BOM.
    #[serde(rename = "bom-ref", skip_serializing_if = "Option::is_none")]
    pub bom_ref: Option<String>,
    /// The name.
    pub name: String,
    /// The version, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// A description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Hashes of the component's bytes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hashes: Vec<Hash>,
    /// The package URL (purl-spec).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purl: Option<String>,
    /// Where it came from (`vcs`, `distribution`, ...).
    #[serde(rename = "externalReferences", skip_serializing_if = "Vec::is_empty")]
    pub external_references: Vec<ExternalReference>,
    /// Its ancestry: the commits it was made from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pedigree: Option<Pedigree>,
    /// Name-value pairs (`oracle-build:*`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<Property>,
    /// Components inside this one (a wheel's compiled extensions).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<Component>,
}

/// A `hash`.
#[derive(Debug, Clone, Serialize)]
pub struct Hash {
    /// `SHA-256`.
    pub alg: &'static str,
    /// Lowercase hex.
    pub content: String,
}

impl Hash {
    /// A SHA-256 hash of lowercase hex `hex`.
    pub fn sha256(hex: &str) -> Hash {
        Hash {
            alg: "SHA-256",
            content: hex.to_string(),
        }
    }
}

/// An `externalReference`.
#[derive(Debug, Clone, Serialize)]
pub struct ExternalReference {
    /// `vcs`, `distribution`, ... (schema `externalReference.type`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The URL.
    pub url: String,
    /// A comment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// A `pedigree` (only `commits` is emitted).
#[derive(Debug, Clone, Serialize)]
pub struct Pedigree {
    /// The commits the component was made from.
    pub commits: Vec<Commit>,
}

/// A `commit`.
#[derive(Debug, Clone, Serialize)]
pub struct Commit {
    /// The commit id.
    pub uid: String,
    /// The repository URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// A `property`.
#[derive(Debug, Clone, Serialize)]
pub struct Property {
    /// The name (`oracle-build:<field>`).
    pub name: String,
    /// The value.
    pub value: String,
}

impl Property {
    /// The property `oracle-build:<name>` = `value`.
    pub fn new(name: &str, value: impl Into<String>) -> Property {
        Property {
            name: format!("oracle-build:{name}"),
            value: value.into(),
        }
    }
}

/// A `dependency`.
#[derive(Debug, Clone, Serialize)]
pub struct Dependency {
    /// The `bom-ref` of the component that depends.
    #[serde(rename = "ref")]
    pub reference: String,
    /// The `bom-ref`s it depends on.
    #[serde(rename = "dependsOn")]
    pub depends_on: Vec<String>,
}

/// A `formula` (only `bom-ref`, `components` and `properties` are emitted).
#[derive(Debug, Clone, Serialize)]
pub struct Formula {
    /// A reference unique in the BOM.
    #[serde(rename = "bom-ref")]
    pub bom_ref: String,
    /// The tools the formula used.
    pub components: Vec<Component>,
    /// Name-value pairs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<Property>,
}
