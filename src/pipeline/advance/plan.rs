//! `advance --plan`: the tree-level part of the review, written before
//! either oracle is built (docs/advance.md, "Before building"): the
//! commits, the recipe delta, TO's pin table and the requirement delta.

use std::path::PathBuf;

use serde::Serialize;

use super::requirements::{self, PinRow, RequirementDelta};
use super::{Commits, Delta};

/// The tree-level review of an advance, nothing built.
#[derive(Debug, Clone, Serialize)]
pub struct AdvancePlan {
    /// Always true: nothing was built or gated.
    pub plan_only: bool,
    /// FROM's recipe name.
    pub from_recipe: String,
    /// Where FROM's recipe was read.
    pub from_origin: String,
    /// FROM's commit.
    pub from_commit: String,
    /// TO's recipe name.
    pub to_recipe: String,
    /// Where TO's recipe was read (the candidate's path for a commit TO).
    pub to_origin: String,
    /// TO's commit.
    pub to_commit: String,
    /// The candidate recipe written for a commit TO, if any.
    pub candidate_recipe: Option<PathBuf>,
    /// Commit range and upstream reachability.
    pub commits: Commits,
    /// Recipe fields that differ.
    pub recipe_delta: Vec<Delta>,
    /// TO's pins, per package.
    pub pins: Vec<PinRow>,
    /// The trees' own requirement changes (`None`: a tree could not be read).
    pub requirements: Option<RequirementDelta>,
    /// Why the requirement delta is missing, when it is.
    pub requirements_not_read: Option<String>,
}

/// The plan as Markdown.
pub fn markdown(p: &AdvancePlan) -> String {
    let mut m = vec![
        format!(
            "# Pin advance (plan, nothing built): {} → {}",
            p.from_recipe, p.to_recipe
        ),
        String::new(),
        format!("- FROM `{}` ({})", p.from_commit, p.from_origin),
        format!("- TO `{}` ({})", p.to_commit, p.to_origin),
    ];
    if let Some(c) = &p.candidate_recipe {
        m.push(format!("- candidate recipe written: `{}`", c.display()));
    }
    m.push(String::new());
    m.push(super::report::commits_markdown(&p.commits));
    m.push(String::new());
    m.push("## Recipe delta".into());
    m.push(String::new());
    if p.recipe_delta.is_empty() {
        m.push("No field differs besides the name.".into());
    } else {
        m.push("| field | FROM | TO |".into());
        m.push("|---|---|---|".into());
        for d in &p.recipe_delta {
            let show = |v: &serde_json::Value| match v {
                serde_json::Value::Null => "—".to_string(),
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            m.push(format!(
                "| `{}` | {} | {} |",
                d.field,
                show(&d.from),
                show(&d.to)
            ));
        }
    }
    m.push(String::new());
    m.push(requirements::pins_markdown(&p.pins));
    m.push(String::new());
    match &p.requirements {
        Some(d) => m.push(requirements::delta_markdown(d)),
        None => m.push(format!(
            "## Requirement delta\n\nNot read: {}",
            p.requirements_not_read.as_deref().unwrap_or("unknown")
        )),
    }
    m.push(String::new());
    m.push("This plan builds neither oracle: the lock delta, identities, kernel families and smoke cases come from `advance` without `--plan`.".into());
    m.join("\n") + "\n"
}
