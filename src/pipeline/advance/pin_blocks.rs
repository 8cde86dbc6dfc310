//! The pin block each side of an advance would get (issue 37): the
//! recipe `pins` of FROM and of TO (the candidate recipe for a commit TO),
//! side by side.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// One pinned package.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PinRow {
    /// The package as the recipes name it.
    pub package: String,
    /// FROM's pin (absent: not pinned).
    pub from: Option<String>,
    /// TO's pin (absent: not pinned).
    pub to: Option<String>,
    /// Whether they differ.
    pub changed: bool,
}

/// Every package either recipe pins, by name.
pub fn pin_blocks(from: &BTreeMap<String, String>, to: &BTreeMap<String, String>) -> Vec<PinRow> {
    let names: BTreeSet<&String> = from.keys().chain(to.keys()).collect();
    names
        .into_iter()
        .map(|n| PinRow {
            package: n.clone(),
            from: from.get(n).cloned(),
            to: to.get(n).cloned(),
            changed: from.get(n) != to.get(n),
        })
        .collect()
}

/// The section as Markdown lines.
pub fn markdown(rows: &[PinRow]) -> Vec<String> {
    let mut out = vec![
        "## Pin blocks (recipe `pins` of each side)".to_string(),
        String::new(),
    ];
    if rows.is_empty() {
        out.push("Neither recipe pins a package.".into());
        return out;
    }
    out.push("| package | FROM | TO | |".into());
    out.push("|---|---|---|---|".into());
    let v = |x: &Option<String>| x.clone().unwrap_or_else(|| "—".into());
    for r in rows {
        out.push(format!(
            "| {} | {} | {} | {} |",
            r.package,
            v(&r.from),
            v(&r.to),
            if r.changed { "**changed**" } else { "" }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_pin_blocks_side_by_side() {
        let a: BTreeMap<String, String> = [
            ("torch".into(), "2.13.0".into()),
            ("flashinfer-python".into(), "0.6.15.post1".into()),
        ]
        .into();
        let b: BTreeMap<String, String> = [
            ("torch".into(), "2.13.0".into()),
            ("flashinfer-python".into(), "0.6.18".into()),
            ("x".into(), "1".into()),
        ]
        .into();
        let rows = pin_blocks(&a, &b);
        assert_eq!(rows.len(), 3);
        assert!(rows[0].changed && !rows[1].changed && rows[2].from.is_none());
        let md = markdown(&rows).join("\n");
        assert!(
            md.contains("| flashinfer-python | 0.6.15.post1 | 0.6.18 | **changed** |"),
            "{md}"
        );
        assert!(md.contains("| x | — | 1 | **changed** |"), "{md}");
    }
}
