//! `oracle-build contains <PIN|VENV> <COMMIT>`: is COMMIT in the history of
//! the oracle's commit? Answered from the store's mirror alone, with no
//! network ([`source::contains`], docs/sbom.md).
//!
//! Exit 0: yes (with the first-parent distance); 1: no (the mirror holds
//! the commit outside the oracle's history, or lacks it while holding that
//! whole history); 2: unknown (a shallow mirror lacks the commit), as for
//! any other input the tool cannot act on ([`crate::exit::Exit::BadInput`]).

use anyhow::{Result, anyhow};

use crate::exit::bad_input;
use crate::ops::{Session, print_json, target};
use crate::stages::source::{self, Containment};

/// Answers, prints the answer (text, or `--json`: the answer, the commit,
/// the oracle's commit and the mirror), and maps it to the exit code.
///
/// A venv is asked about through its `oracle.json` ([`target::locate`]); a
/// PIN through its recipe's commit, so a pin fetched but not built can be
/// asked too.
///
/// Errors: exit 2 for a bad target or commit, and for `unknown`; exit 1
/// for `no`, and when the store has no mirror of the repository.
pub fn run(s: &Session, target_arg: &str, commit: &str) -> Result<()> {
    let (head, repo, name, store, oracle) = if std::path::Path::new(target_arg)
        .join("pyvenv.cfg")
        .is_file()
    {
        let t = target::locate(s, target_arg)?;
        (
            t.record.identity.commit.clone(),
            t.recipe.source.repo.clone(),
            t.recipe.name.clone(),
            t.store,
            Some(t.venv),
        )
    } else {
        let o = s.open(target_arg)?;
        let r = o.recipe.recipe;
        (r.source.commit, r.source.repo, r.name, o.store, None)
    };
    let head = &head;
    let mirror = source::mirror_entry(&store, &repo);
    if !mirror.exists() {
        return Err(anyhow!(
            "the store {} has no mirror of {repo} (looked at {}); run `{}`",
            store.root().display(),
            mirror.path.display(),
            crate::shell::command_at(
                &format!("fetch {}", crate::shell::shell_quote(target_arg)),
                store.root()
            )
        ));
    }
    let answer = source::contains(&mirror.path, head, commit)?;
    if s.json {
        let mut doc = serde_json::to_value(&answer)?;
        doc["oracle_commit"] = serde_json::json!(head);
        doc["oracle"] = serde_json::json!(oracle);
        doc["mirror"] = serde_json::json!(mirror.path);
        print_json(&doc)?;
    }
    match answer {
        Containment::Yes {
            commit,
            first_parent_distance,
            merged_by,
            ..
        } => {
            if !s.json {
                match merged_by {
                    None => println!(
                        "yes: {commit} is in the oracle ({first_parent_distance} first-parent commit(s) before {head})"
                    ),
                    Some(m) => println!(
                        "yes: {commit} is in the oracle, merged by {m} ({first_parent_distance} first-parent commit(s) before {head})"
                    ),
                }
            }
            Ok(())
        }
        Containment::No { commit, in_mirror } => {
            if !s.json {
                if in_mirror {
                    println!("no: {commit} is not in the history of {head}");
                } else {
                    println!(
                        "no: {commit} is not in the history of {head} (the mirror holds that whole history, and no commit {commit})"
                    );
                }
            }
            Err(anyhow!(
                "{commit} is not in the oracle of {name} (commit {head})"
            ))
        }
        Containment::Unknown { commit } => {
            if !s.json {
                println!(
                    "unknown: the mirror does not hold {commit}, and it is shallow (the history of {head} is not all there)"
                );
            }
            Err(bad_input(format!(
                "unknown: the mirror {} does not hold a commit {commit} and is shallow, so the history of {head} is not all there to answer from; a full fetch of the repository into it answers",
                mirror.path.display()
            )))
        }
    }
}
