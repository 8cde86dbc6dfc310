//! TO's stack from TO's tree: the pin table of a candidate recipe (which
//! of FROM's pins are carried onto TO, per package) and the requirement
//! delta between the two trees, as data and as Markdown sections of the
//! advance report (docs/advance.md, "TO's pins" and "Requirement delta").
//!
//! The trees are read by [`crate::stages::tree_requires`]; nothing here
//! reads a file or runs anything.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::stages::tree_requires::{
    Set, TreeRequirement, TreeRequirements, normalize, same_version,
};

/// How the candidate's pin of one package was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// FROM's pin, kept: TO's tree leaves the package open (or pins the same version).
    Carried,
    /// FROM's pin, dropped: TO's tree pins the package exactly to another
    /// version, which the candidate then gets.
    NotCarried,
    /// `--pin NAME=VERSION` decided it.
    Reviewer,
    /// TO is a PIN (no candidate was derived): its own recipe's pin.
    Recipe,
}

impl Decision {
    /// `carried`, `not carried`, `reviewer`, `TO's recipe`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Carried => "carried",
            Decision::NotCarried => "not carried",
            Decision::Reviewer => "reviewer",
            Decision::Recipe => "TO's recipe",
        }
    }
}

/// One row of the pin table.
#[derive(Debug, Clone, Serialize)]
pub struct PinRow {
    /// The package as the recipe or `--pin` names it.
    pub package: String,
    /// FROM's pin (`None`: FROM does not pin it).
    pub from_pin: Option<String>,
    /// What TO's tree asks for the package, each with its file and line
    /// (empty: it does not name it).
    pub tree: Vec<TreeRequirement>,
    /// The candidate's pin (`None`: TO's tree decides).
    pub candidate: Option<String>,
    /// How it was decided.
    pub decision: Decision,
    /// Why, in one line.
    pub why: String,
    /// Whether the candidate's pin contradicts an exact pin of TO's tree
    /// (a build of it warns).
    pub contradicts_tree: bool,
}

/// The pins of FROM (`from_pins`) decided for a candidate at TO's tree
/// `to`, with the reviewer's `--pin` decisions `reviewer` (name, version)
/// first: a reviewer's pin is taken as given; a FROM pin whose package TO's
/// tree pins exactly (`==`, build or runtime set) to another version is not
/// carried (the candidate leaves it to the tree); any other FROM pin is
/// carried. With `is_candidate` false (TO is a PIN), the rows describe TO's
/// own pins (`to_pins`) against its tree instead. Pure.
///
/// Returns the rows, one per package, sorted by package, and the
/// candidate's `pins` map.
pub fn decide(
    from_pins: &BTreeMap<String, String>,
    reviewer: &[(String, String)],
    to: &TreeRequirements,
    to_pins: Option<&BTreeMap<String, String>>,
) -> (Vec<PinRow>, BTreeMap<String, String>) {
    let from_of = |n: &str| {
        from_pins
            .iter()
            .find(|(k, _)| normalize(k) == normalize(n))
            .map(|(_, v)| v.clone())
    };
    let mut rows: BTreeMap<String, PinRow> = BTreeMap::new();
    let mut pins = BTreeMap::new();
    let tree_of = |n: &str| to.of(n).into_iter().cloned().collect::<Vec<_>>();
    let contradicts = |n: &str, v: &str| {
        let exact = to.exact_pins(n);
        !exact.is_empty()
            && !exact
                .iter()
                .any(|r| r.exact.as_deref().is_some_and(|e| same_version(e, v)))
    };
    let exact_text = |n: &str| {
        to.exact_pins(n)
            .iter()
            .map(|r| format!("`{}` ({})", r.requirement, r.at()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(own) = to_pins {
        for (n, v) in own {
            let c = contradicts(n, v);
            rows.insert(
                normalize(n),
                PinRow {
                    package: n.clone(),
                    from_pin: from_of(n),
                    tree: tree_of(n),
                    candidate: Some(v.clone()),
                    decision: Decision::Recipe,
                    why: if c {
                        format!("TO's recipe pins {v}, against its tree's {}", exact_text(n))
                    } else {
                        "TO's recipe".into()
                    },
                    contradicts_tree: c,
                },
            );
            pins.insert(n.clone(), v.clone());
        }
        return (rows.into_values().collect(), pins);
    }
    for (n, v) in reviewer {
        let c = contradicts(n, v);
        rows.insert(
            normalize(n),
            PinRow {
                package: n.clone(),
                from_pin: from_of(n),
                tree: tree_of(n),
                candidate: Some(v.clone()),
                decision: Decision::Reviewer,
                why: if c {
                    format!(
                        "--pin {n}={v}: the reviewer overrides TO's tree's {}",
                        exact_text(n)
                    )
                } else {
                    format!("--pin {n}={v}")
                },
                contradicts_tree: c,
            },
        );
        pins.insert(n.clone(), v.clone());
    }
    for (n, v) in from_pins {
        if rows.contains_key(&normalize(n)) {
            continue;
        }
        let exact = to.exact_pins(n);
        let (candidate, decision, why) = if contradicts(n, v) {
            let tree_v = exact
                .first()
                .and_then(|r| r.exact.clone())
                .unwrap_or_default();
            (
                None,
                Decision::NotCarried,
                format!(
                    "TO's tree pins {tree_v} at {} (FROM pinned {v}); `--pin {n}={v}` keeps FROM's",
                    exact_locations(&exact)
                ),
            )
        } else if exact.is_empty() {
            (
                Some(v.clone()),
                Decision::Carried,
                match (to.of(n).is_empty(), excluded_by(to, n, v)) {
                    (true, _) => "TO's tree does not name it".to_string(),
                    (false, None) => "TO's tree leaves it open".to_string(),
                    (false, Some(ranges)) => format!(
                        "TO's tree asks a range, but **{v} is outside** {ranges}: the override installs a version TO's tree excludes"
                    ),
                },
            )
        } else {
            (
                Some(v.clone()),
                Decision::Carried,
                "TO's tree pins the same version".to_string(),
            )
        };
        if let Some(c) = &candidate {
            pins.insert(n.clone(), c.clone());
        }
        rows.insert(
            normalize(n),
            PinRow {
                package: n.clone(),
                from_pin: Some(v.clone()),
                tree: tree_of(n),
                candidate,
                decision,
                why,
                contradicts_tree: false,
            },
        );
    }
    (rows.into_values().collect(), pins)
}

/// The requirements of `name` in `to` whose version range excludes
/// `version` (PEP 440), as `` `req` (file:line) `` joined; `None` when every
/// range admits it (or `version` is no PEP 440 version).
fn excluded_by(to: &TreeRequirements, name: &str, version: &str) -> Option<String> {
    use std::str::FromStr;
    let v = pep440_rs::Version::from_str(version).ok()?;
    let out: Vec<String> = to
        .of(name)
        .into_iter()
        .filter(|r| {
            pep440_rs::VersionSpecifiers::from_str(&r.specifier)
                .is_ok_and(|s| !r.specifier.is_empty() && !s.contains(&v))
        })
        .map(|r| format!("`{}` ({})", r.requirement, r.at()))
        .collect();
    (!out.is_empty()).then(|| out.join(", "))
}

fn exact_locations(exact: &[&TreeRequirement]) -> String {
    exact.iter().map(|r| r.at()).collect::<Vec<_>>().join(", ")
}

/// One requirement that differs between the two trees.
#[derive(Debug, Clone, Serialize)]
pub struct ReqChange {
    /// The set.
    pub set: Set,
    /// The normalized package name.
    pub package: String,
    /// `added`, `removed` or `changed` (specifier or marker).
    pub change: String,
    /// FROM's requirements of it in this set, with file:line (empty: none).
    pub from: Vec<TreeRequirement>,
    /// TO's requirements of it in this set, with file:line (empty: none).
    pub to: Vec<TreeRequirement>,
}

/// How the two trees' requirements differ.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RequirementDelta {
    /// The files read on each side.
    pub from_files: Vec<String>,
    /// The files read on TO's side.
    pub to_files: Vec<String>,
    /// Every package whose requirements differ, build set first, by name.
    pub changes: Vec<ReqChange>,
    /// Packages of both sets asked for the same way on both sides.
    pub unchanged: usize,
    /// What could not be read or parsed on either side (`FROM: ...`, `TO: ...`).
    pub problems: Vec<String>,
}

/// The requirement delta from `from` to `to`, per set and package: a
/// package only TO names is added, only FROM names removed; one whose
/// requirements (specifier and marker, in order) differ is changed. A
/// requirement that only moved to another line or file is not a change.
/// Pure.
pub fn delta(from: &TreeRequirements, to: &TreeRequirements) -> RequirementDelta {
    let mut out = RequirementDelta {
        from_files: from.files.clone(),
        to_files: to.files.clone(),
        ..Default::default()
    };
    for (side, t) in [("FROM", from), ("TO", to)] {
        for p in &t.problems {
            out.problems.push(format!("{side}: {p}"));
        }
        for u in &t.unparsed {
            out.problems.push(format!(
                "{side}: {}:{}: `{}` is no PEP 508 requirement ({})",
                u.file, u.line, u.text, u.error
            ));
        }
    }
    for (set, a, b) in [
        (Set::Build, &from.build, &to.build),
        (Set::Runtime, &from.runtime, &to.runtime),
    ] {
        let group = |v: &Vec<TreeRequirement>| {
            let mut m: BTreeMap<String, Vec<TreeRequirement>> = BTreeMap::new();
            for r in v {
                m.entry(r.name.clone()).or_default().push(r.clone());
            }
            m
        };
        let (ga, gb) = (group(a), group(b));
        let names: BTreeSet<&String> = ga.keys().chain(gb.keys()).collect();
        for n in names {
            let (x, y) = (
                ga.get(n).cloned().unwrap_or_default(),
                gb.get(n).cloned().unwrap_or_default(),
            );
            let asks = |v: &[TreeRequirement]| {
                v.iter()
                    .map(|r| (r.specifier.clone(), r.marker.clone(), r.requirement.clone()))
                    .collect::<Vec<_>>()
            };
            let change = match (x.is_empty(), y.is_empty()) {
                (true, false) => "added",
                (false, true) => "removed",
                _ if asks(&x) != asks(&y) => "changed",
                _ => {
                    out.unchanged += 1;
                    continue;
                }
            };
            out.changes.push(ReqChange {
                set,
                package: n.clone(),
                change: change.into(),
                from: x,
                to: y,
            });
        }
    }
    out
}

fn cell(v: &[TreeRequirement]) -> String {
    if v.is_empty() {
        return "—".into();
    }
    v.iter()
        .map(|r| format!("`{}` ({})", r.requirement, r.at()))
        .collect::<Vec<_>>()
        .join("<br>")
        .replace('|', "\\|")
}

/// The pin table as a Markdown section (`## TO's pins`), without a
/// trailing newline.
pub fn pins_markdown(rows: &[PinRow]) -> String {
    let mut m = vec!["## TO's pins (from TO's tree)".to_string(), String::new()];
    if rows.is_empty() {
        m.push("Neither FROM nor the reviewer pins any package.".into());
        return m.join("\n");
    }
    m.push("| package | FROM pin | TO's tree asks | candidate pin | why |".into());
    m.push("|---|---|---|---|---|".into());
    for r in rows {
        m.push(format!(
            "| {} | {} | {} | {} | **{}**: {} |",
            r.package,
            r.from_pin.as_deref().unwrap_or("—"),
            cell(&r.tree),
            r.candidate.as_deref().unwrap_or("— (TO's tree decides)"),
            r.decision.as_str(),
            r.why.replace('|', "\\|")
        ));
    }
    m.join("\n")
}

/// The requirement delta as a Markdown section (`## Requirement delta`),
/// without a trailing newline.
pub fn delta_markdown(d: &RequirementDelta) -> String {
    let mut m = vec![
        "## Requirement delta (the trees' own requirement files)".to_string(),
        String::new(),
        format!(
            "- FROM read: {}",
            if d.from_files.is_empty() {
                "none".into()
            } else {
                d.from_files.join(", ")
            }
        ),
        format!(
            "- TO read: {}",
            if d.to_files.is_empty() {
                "none".into()
            } else {
                d.to_files.join(", ")
            }
        ),
        String::new(),
    ];
    let count = |set: Set, c: &str| {
        d.changes
            .iter()
            .filter(|x| x.set == set && x.change == c)
            .count()
    };
    for set in [Set::Build, Set::Runtime] {
        m.push(format!(
            "{}: {} added, {} removed, {} changed.",
            set.as_str(),
            count(set, "added"),
            count(set, "removed"),
            count(set, "changed")
        ));
    }
    m.push(format!("{} unchanged.", d.unchanged));
    if !d.changes.is_empty() {
        m.push(String::new());
        m.push("| set | package | change | FROM | TO |".into());
        m.push("|---|---|---|---|---|".into());
        for c in &d.changes {
            m.push(format!(
                "| {} | {} | **{}** | {} | {} |",
                c.set.as_str(),
                c.package,
                c.change,
                cell(&c.from),
                cell(&c.to)
            ));
        }
    }
    for p in &d.problems {
        m.push(format!("- not read: {}", p.replace('|', "\\|")));
    }
    m.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stages::tree_requires::read_with;

    fn t(common: &'static str, build: &'static str) -> TreeRequirements {
        read_with(
            &move |rel: &str| match rel {
                "requirements/common.txt" => Some(common.to_string()),
                "requirements/build.txt" => Some(build.to_string()),
                _ => None,
            },
            "cpu",
        )
    }

    #[test]
    fn a_contradicted_pin_is_not_carried_an_open_one_is_and_the_reviewer_decides() {
        let to = t("packaging==24.2\nidna\nsix>=1.17\n", "setuptools>=70\n");
        let from = BTreeMap::from([
            ("packaging".to_string(), "24.1".to_string()),
            ("idna".to_string(), "3.7".to_string()),
            ("six".to_string(), "1.16.0".to_string()),
        ]);
        let (rows, pins) = decide(&from, &[], &to, None);
        assert_eq!(
            pins,
            BTreeMap::from([
                ("idna".into(), "3.7".into()),
                ("six".into(), "1.16.0".into())
            ])
        );
        // A carried pin outside the tree's range is carried, and said.
        let six = rows.iter().find(|r| r.package == "six").unwrap();
        assert_eq!(six.decision, Decision::Carried);
        assert!(
            six.why
                .contains("1.16.0 is outside** `six>=1.17` (requirements/common.txt:3)"),
            "{}",
            six.why
        );
        let p = rows.iter().find(|r| r.package == "packaging").unwrap();
        assert_eq!(p.decision, Decision::NotCarried);
        assert!(p.why.contains("requirements/common.txt:1"), "{}", p.why);
        let i = rows.iter().find(|r| r.package == "idna").unwrap();
        assert_eq!(i.decision, Decision::Carried);
        let (rows, pins) = decide(&from, &[("packaging".into(), "24.1".into())], &to, None);
        assert_eq!(pins["packaging"], "24.1");
        let p = rows.iter().find(|r| r.package == "packaging").unwrap();
        assert_eq!((p.decision, p.contradicts_tree), (Decision::Reviewer, true));
        assert!(pins_markdown(&rows).contains("**reviewer**"));
    }

    #[test]
    fn the_delta_names_added_removed_and_changed_with_lines() {
        let from = t("packaging==24.1\nidna\nold\n", "setuptools>=69\nwheel\n");
        let to = t("packaging==24.2\nidna\nsix\n", "setuptools>=70\nwheel\n");
        let d = delta(&from, &to);
        let got: Vec<(Set, &str, &str)> = d
            .changes
            .iter()
            .map(|c| (c.set, c.package.as_str(), c.change.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (Set::Build, "setuptools", "changed"),
                (Set::Runtime, "old", "removed"),
                (Set::Runtime, "packaging", "changed"),
                (Set::Runtime, "six", "added"),
            ]
        );
        assert_eq!(d.unchanged, 2);
        let md = delta_markdown(&d);
        assert!(
            md.contains("`packaging==24.1` (requirements/common.txt:1)")
                && md.contains("`six` (requirements/common.txt:3)"),
            "{md}"
        );
    }
}
