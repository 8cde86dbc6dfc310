//! `oracle-build fetch <PIN>`: only the source stage — update the mirror and
//! check out the commit into the store — without any toolchain.

use anyhow::Result;

use crate::ops::{Opened, Session, print_json};
use crate::stages::source;

/// Fetches the pin's commit into the store's mirror and checks it out.
/// Prints the checkout's path (or `--json`: mirror, checkout, whether new).
pub fn run(s: &Session, pin_arg: &str, offline: bool) -> Result<()> {
    let Opened {
        recipe: lr, store, ..
    } = s.open(pin_arg)?;
    let r = &lr.recipe;
    store.init()?;
    store.clean_stale_staging()?;
    let temp = store.temp_roots()?;
    temp.add(&store, &source::mirror_entry(&store, &r.source.repo))?;
    temp.add(&store, &source::checkout_entry(&store, &r.source.commit))?;
    let source::Refreshed {
        entry: mirror,
        fetched,
        ..
    } = source::ensure_mirror_refreshed(
        &store,
        &r.source.repo,
        &r.source.commit,
        offline,
        r.source.moved_tags,
    )?;
    let (src, created) = source::ensure_checkout(&store, &mirror, &r.source.commit)?;
    // The fork-only check, against the branches just fetched; else said not made.
    let (warning, not_checked) = if fetched == source::Fetched::Now {
        let w = source::fork_only_warning(&mirror.path, &r.source.repo, &r.source.commit);
        (w, None)
    } else {
        (
            None,
            Some(source::fork_check_not_made(
                &r.source.repo,
                &r.source.commit,
            )),
        )
    };
    if let Some(w) = &warning {
        crate::progress::stage("source", format!("warning: {w}"));
    }
    if s.json {
        return print_json(&serde_json::json!({
            "mirror": mirror.path, "checkout": src.path, "created": created, "commit": r.source.commit,
            "warnings": warning.iter().collect::<Vec<_>>(), "not_checked": not_checked.iter().collect::<Vec<_>>(),
        }));
    }
    if let Some(n) = &not_checked {
        crate::progress::stage("source", format!("not checked: {n}"));
    }
    println!("{}", src.path.display());
    Ok(())
}
