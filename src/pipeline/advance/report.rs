//! The advance report as Markdown, and the standing limits of what it shows.

use serde_json::Value;

use super::AdvanceReport;

/// The standing limits of the comparison, plus any that apply to this one.
pub fn does_not_establish(r: &AdvanceReport) -> Vec<String> {
    let mut out = vec![
        "A match on these prompts does not establish parity on other prompts, lengths, batch sizes or sampling settings.".to_string(),
        "A near-tie flip is not evidence of a regression: the two candidates were within the threshold, and a different engine configuration can flip them.".to_string(),
        "Identical identities and outputs do not establish identical performance; tokens/s here are smoke-run figures, not benchmarks.".to_string(),
        "Greedy agreement at batch 1 does not establish agreement of log-probabilities beyond the recorded top-k.".to_string(),
    ];
    if r.commits.flag.is_some() {
        out.push("TO is not on an upstream branch or tag: nothing here says it was reviewed or released upstream.".into());
    }
    if r.cases.iter().any(|c| c.status == "not comparable") {
        out.push("Cases marked not comparable say nothing about drift either way.".into());
    }
    out
}

fn show(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(show).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

fn short(c: &str) -> &str {
    &c[..12.min(c.len())]
}

/// The `## Commits` section (range, counts, upstream refs, flag), without
/// a trailing newline.
pub fn commits_markdown(c: &super::Commits) -> String {
    let mut m = String::new();
    let mut line = |s: String| {
        m.push_str(&s);
        m.push('\n');
    };
    line("## Commits".into());
    line(String::new());
    line(format!("- range `{}`", c.range));
    match &c.counts {
        Some(n) => line(format!(
            "- {} commit(s) in FROM..TO, {} in TO..FROM; TO {} FROM",
            n.ahead,
            n.behind,
            if n.descends {
                "descends from"
            } else {
                "does not descend from"
            }
        )),
        None => line("- the commits are not in one repository: no count".into()),
    }
    match &c.upstream_refs {
        Some(refs) if !refs.is_empty() => {
            let shown: Vec<&str> = refs.iter().take(5).map(String::as_str).collect();
            line(format!(
                "- TO is reachable from upstream `{}`: {}",
                c.upstream,
                shown.join(", ")
            ))
        }
        _ => {}
    }
    if let Some(flag) = &c.flag {
        line(format!("- **FLAG:** {flag}"));
    }
    m.pop();
    m
}

/// The report as Markdown.
pub fn markdown(r: &AdvanceReport) -> String {
    let mut m = String::new();
    let mut line = |s: String| {
        m.push_str(&s);
        m.push('\n');
    };
    line(format!(
        "# Pin advance: {} → {}",
        r.from.recipe, r.to.recipe
    ));
    line(String::new());
    line(format!(
        "- FROM `{}` ({}) — verdict **{}**",
        r.from.commit, r.from.origin, r.from.verdict
    ));
    line(format!(
        "- TO `{}` ({}) — verdict **{}**",
        r.to.commit, r.to.origin, r.to.verdict
    ));
    if let Some(p) = &r.candidate_recipe {
        line(format!("- candidate recipe written: `{}`", p.display()));
    }
    for (side, s) in [("FROM", &r.from), ("TO", &r.to)] {
        for reason in &s.reasons {
            line(format!("  - {side} not gateable: {reason}"));
        }
    }
    line(String::new());
    line(commits_markdown(&r.commits));
    line(String::new());
    line(super::requirements::pins_markdown(&r.pins));
    if let Some(d) = &r.requirements {
        line(String::new());
        line(super::requirements::delta_markdown(d));
    }
    line(String::new());
    line("## Recipe delta".into());
    line(String::new());
    if r.recipe_delta.is_empty() {
        line("No field differs besides the name.".into());
    } else {
        line("| field | FROM | TO |".into());
        line("|---|---|---|".into());
        for d in &r.recipe_delta {
            line(format!(
                "| `{}` | {} | {} |",
                d.field,
                show(&d.from),
                show(&d.to)
            ));
        }
    }
    line(String::new());
    line("## Lock delta (installed distributions)".into());
    line(String::new());
    let p = &r.package_delta;
    line(format!(
        "{} added, {} removed, {} changed, {} unchanged.",
        p.added.len(),
        p.removed.len(),
        p.changed.len(),
        p.unchanged
    ));
    if !(p.added.is_empty() && p.removed.is_empty() && p.changed.is_empty()) {
        line(String::new());
        line("| package | FROM | TO |".into());
        line("|---|---|---|".into());
        for (n, a, b) in &p.changed {
            line(format!("| {n} | {a} | {b} |"));
        }
        for (n, v) in &p.added {
            line(format!("| {n} | — | {v} |"));
        }
        for (n, v) in &p.removed {
            line(format!("| {n} | {v} | — |"));
        }
    }
    line(super::deltas::markdown(&r.deltas));
    line(String::new());
    line("## Identity".into());
    line(String::new());
    line("| field | FROM | TO | |".into());
    line("|---|---|---|---|".into());
    for d in &r.identity {
        line(format!(
            "| {} | {} | {} | {} |",
            d.field,
            show(&d.from),
            show(&d.to),
            if d.changed { "**changed**" } else { "" }
        ));
    }
    line(String::new());
    line("## Kernel families (as each tree's configure reported them)".into());
    line(String::new());
    let k = &r.kernel_families;
    match &k.not_known {
        Some(why) => line(format!("Not compared: {why}.")),
        None => {
            line(format!(
                "{} gained, {} lost, {} built by both.",
                k.gained.len(),
                k.lost.len(),
                k.kept
            ));
            for g in &k.gained {
                line(format!("- gained: {}", g.replace('|', "\\|")));
            }
            for l in &k.lost {
                line(format!("- **lost**: {}", l.replace('|', "\\|")));
            }
        }
    }
    line(String::new());
    line("## Build".into());
    line(String::new());
    line("| | FROM | TO |".into());
    line("|---|---|---|".into());
    line(format!(
        "| build mode | {} | {} |",
        r.from.build_mode, r.to.build_mode
    ));
    line(format!(
        "| wheel sha256 | `{}` | `{}` |",
        short(&r.from.wheel_sha256),
        short(&r.to.wheel_sha256)
    ));
    let secs = |s: Option<f64>| s.map_or("—".into(), |s| format!("{s:.1} s"));
    line(format!(
        "| build time | {} | {} |",
        secs(r.from.build_seconds),
        secs(r.to.build_seconds)
    ));
    let cc = |s: &Option<crate::stages::wheel::CacheStats>| {
        s.as_ref().map_or("—".into(), |c| {
            format!(
                "{} hits ({} local, {} team), {} misses",
                c.hits, c.local_hits, c.remote_hits, c.misses
            )
        })
    };
    line(format!(
        "| compiler cache | {} | {} |",
        cc(&r.from.compiler_cache_stats),
        cc(&r.to.compiler_cache_stats)
    ));
    if let Some(c) = &r.compile_cost {
        line(String::new());
        line(format!(
            "Compile cost expected before TO was built: {}.",
            c.summary
        ));
    }
    line(String::new());
    line("## Golden campaign (every case run on both sides, same configuration)".into());
    line(String::new());
    line("| case | prompt | result | detail | TO's runs |".into());
    line("|---|---|---|---|---|".into());
    for c in &r.cases {
        let prompt = match (c.prompt_index, &c.prompt) {
            (Some(i), Some(p)) => format!("{i}: {p:?}"),
            (Some(i), None) => i.to_string(),
            (None, Some(p)) => format!("{p:?}"),
            (None, None) => "(token ids)".into(),
        };
        line(format!(
            "| {} | {} | **{}** | {} | {} |",
            c.name,
            prompt.replace('|', "\\|"),
            c.status,
            c.detail.replace('|', "\\|"),
            c.to_runs
        ));
    }
    if let Some(g) = &r.goldens {
        line(String::new());
        for a in &g.accepted_drift {
            line(format!(
                "- drift of case {} accepted: {}",
                a.case,
                a.reason.replace('\n', " ")
            ));
        }
        for rec in &g.recorded {
            line(format!(
                "- TO's golden of case {} recorded: `{}`",
                rec.case,
                rec.path.display()
            ));
        }
    }
    line(String::new());
    line("## Verdict".into());
    line(String::new());
    line(format!("- FROM: {}", r.from.verdict));
    line(format!("- TO: {}", r.to.verdict));
    if let Some(a) = &r.accepted {
        line(format!(
            "- accepted: the alias now points at TO ({})",
            show(&a["path"])
        ));
    }
    line(String::new());
    line("## What this comparison does not establish".into());
    line(String::new());
    for s in &r.does_not_establish {
        line(format!("- {s}"));
    }
    m
}
