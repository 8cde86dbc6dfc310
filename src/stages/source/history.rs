//! What a commit's history fixes of the version the tree gives it, read
//! from the mirror alone (no build venv): the tag `git describe` finds (its
//! name and commit), the number of commits since it, and the commit itself.
//!
//! The version itself is the tree's to compute (setuptools-scm, run in the
//! build venv by the wheel stage: `stages::wheel::history_version`). This
//! module compares a version with what the history determines of it under
//! setuptools-scm's default schemes (`guess-next-dev`, `node-and-date`), the
//! ones vLLM's `pyproject.toml` `[tool.setuptools_scm]` uses, so a recipe
//! whose `expect.runtime_version` the history contradicts fails before any
//! wheel-stage work, and a refused wheel's message can name the version
//! this box's history gives. A tree that sets another scheme (or tag regex,
//! or describe command) is not compared here ([`tree_uses_default_schemes`]);
//! the wheel stage's check, which asks the tree, still runs.

use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use anyhow::Result;
use pep440_rs::{LocalSegment, Version};

use super::{Describe, describe};
use crate::recipe::LoadedRecipe;

/// What the history of one commit fixes of its version (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// The commit (full sha).
    pub commit: String,
    /// The tag `git describe --tags --match '*[0-9]*'` finds (`None`: no tag reaches it).
    pub describe: Option<Describe>,
    /// Commits in `commit`'s history that the tag's does not hold (every
    /// commit of its history when no tag reaches it): `git describe`'s distance.
    pub distance: usize,
}

/// The [`History`] of `commit` in the bare mirror at `mirror` (the tag as
/// [`describe`] finds it, the distance by a libgit2 walk); `None` when the
/// mirror cannot be read or lacks the commit.
pub fn of(mirror: &Path, commit: &str) -> Option<History> {
    let describe = describe(mirror, commit);
    let repo = git2::Repository::open_bare(mirror).ok()?;
    let oid = git2::Oid::from_str(commit).ok()?;
    repo.find_commit(oid).ok()?;
    let mut walk = repo.revwalk().ok()?;
    walk.push(oid).ok()?;
    if let Some(d) = &describe {
        walk.hide(git2::Oid::from_str(&d.commit).ok()?).ok()?;
    }
    let distance = walk.count();
    Some(History {
        commit: commit.to_string(),
        describe,
        distance,
    })
}

/// The version setuptools-scm reads from the tag name `tag` with its
/// default `tag_regex` (`^(?:[\w-]+-)?(?P<version>[vV]?\d+(?:\.\d+){0,2}[^\+]*)(?:\+.*)?$`):
/// an optional `<prefix>-`, an optional `v`, then a PEP 440 version; any
/// `+local` part dropped. `None` when no such version is in the name.
pub fn tag_version(tag: &str) -> Option<Version> {
    let tag = tag.split('+').next().unwrap_or_default();
    let word = |s: &str| {
        s.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
    };
    // The longest `<prefix>-` whose rest is a version wins (the regex's
    // greedy group), else none.
    let mut starts: Vec<usize> = tag.match_indices('-').map(|(i, _)| i + 1).collect();
    starts.reverse();
    starts.push(0);
    starts.into_iter().find_map(|i| {
        let (prefix, rest) = tag.split_at(i);
        if i > 0 && (prefix.len() < 2 || !word(&prefix[..prefix.len() - 1])) {
            return None;
        }
        let digits = rest.strip_prefix(['v', 'V']).unwrap_or(rest);
        if !digits.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        Version::from_str(digits).ok()
    })
}

/// Which of the two recipe fields a version is checked as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `expect.runtime_version`: the history's version exactly (setuptools-scm
    /// writes it into the package's `_version.py`).
    Runtime,
    /// `expect.distribution_version`: the history's version, with local
    /// labels the tree may append (vLLM appends `cpu`, `cu130`, ...).
    Distribution,
}

impl History {
    /// The tag's version, `0.0` when no tag reaches the commit (setuptools-scm's
    /// start when `git describe` finds nothing); `None` when the tag's name
    /// holds no version.
    fn base(&self) -> Option<Version> {
        match &self.describe {
            Some(d) => tag_version(&d.tag),
            None => Some(Version::from_str("0.0").ok()?),
        }
    }

    /// The commit's first nine hex digits (what a `+g<sha>` label is compared with).
    fn short(&self) -> &str {
        &self.commit[..self.commit.len().min(9)]
    }

    /// The next release setuptools-scm's default `guess-next-dev` scheme
    /// guesses after the tag's version (`0.0` without a tag), as its
    /// `guess_next_version` does: a `.dev0` tag gives its release
    /// (`1.0.dev0` -> `1.0`), any other its last number bumped (`0.7.2` ->
    /// `0.7.3`, `0.23.1rc1` -> `0.23.1rc2`, `1.0.post1` -> `1.0.post2`).
    /// `None` when the tag holds no version, or a `.devN` with N other than
    /// 0 (setuptools-scm refuses it).
    fn guessed(&self) -> Option<String> {
        let base = self.base()?.without_local().to_string();
        if let Some((prefix, tail)) = base.rsplit_once(".dev") {
            return (tail == "0").then(|| prefix.to_string());
        }
        let digits = base.len() - base.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, tail) = base.split_at(base.len() - digits);
        let n: u64 = tail.parse().ok()?;
        Some(format!("{prefix}{}", n.checked_add(1)?))
    }

    /// The whole version this history gives under setuptools-scm's default
    /// schemes (`guess-next-dev`, `node-and-date`, a clean tree): the tag's
    /// version on a tagged commit (`0.2.0`), else the guessed next release
    /// ([`History::guessed`]), `.dev<distance>`, `+g<first 9 hex digits of
    /// the commit>` (`0.7.3.dev14671+g56d875cf1`). `None` when the tag
    /// holds no version setuptools-scm can bump.
    pub fn version(&self) -> Option<String> {
        if self.distance == 0 && self.describe.is_some() {
            return self.base().map(|v| v.to_string());
        }
        Some(format!(
            "{}.dev{}+g{}",
            self.guessed()?,
            self.distance,
            self.short()
        ))
    }

    /// How setuptools-scm's default scheme makes [`History::version`] from
    /// this history, in words: `the tag's version 0.23.1rc1 with its last
    /// number bumped (0.23.1rc2), .dev1511 for the commits since the tag,
    /// +g<the commit's first 9 hex digits>` (or that a tagged commit's
    /// version is the tag's).
    pub fn rule(&self) -> String {
        if self.distance == 0 && self.describe.is_some() {
            return "setuptools-scm gives a tagged commit the tag's version".into();
        }
        let base = self
            .base()
            .map_or_else(|| "(none)".to_string(), |v| v.to_string());
        let from = if self.describe.is_some() {
            format!("the tag's version {base}")
        } else {
            "0.0 (no tag reaches the commit)".to_string()
        };
        format!(
            "setuptools-scm's default guess-next-dev scheme takes {from} with its last number bumped ({}), appends .dev{} for the {} commit{} since, and +g{} (the commit's first 9 hex digits)",
            self.guessed()
                .unwrap_or_else(|| "which it cannot do here".into()),
            self.distance,
            self.distance,
            if self.distance == 1 { "" } else { "s" },
            self.short()
        )
    }

    /// The version this history gives, as far as the history fixes it:
    /// the whole version ([`History::version`]) when it is known, else `a
    /// development version N commits after <tag version> (.devN+g<sha>)`.
    pub fn gives(&self) -> String {
        if let Some(v) = self.version() {
            return v;
        }
        let base = self
            .base()
            .map_or_else(|| "(no version in the tag)".to_string(), |v| v.to_string());
        if self.distance == 0 && self.describe.is_some() {
            return base;
        }
        format!(
            "a development version {} commit{} after {base} (.dev{}+g{}…)",
            self.distance,
            if self.distance == 1 { "" } else { "s" },
            self.distance,
            self.short()
        )
    }

    /// Where the version comes from: `tag v0.2.0 at <sha>`, or `no tag reaches it`.
    pub fn from(&self) -> String {
        self.describe
            .as_ref()
            .map_or_else(|| "no tag reaches it".to_string(), ToString::to_string)
    }

    /// Why `version` (a recipe's `field`) is not the version this history
    /// gives; `None` when the history does not contradict it. Compared:
    /// on a tagged commit (distance 0), the public version is the tag's
    /// ([`tag_version`]) and a runtime version has no local label; after
    /// the tag, the public version is the guessed next release with
    /// `.devN`, N the distance ([`History::version`]; when the tag cannot
    /// be bumped: greater than the tag's and `.devN`), and the first local
    /// label is `g` and at least 7 leading hex digits of the commit (a
    /// runtime version has no other label). Versions compare as PEP 440
    /// versions (`pep440_rs`), so `0.2` and `0.2.0` are the same here; the
    /// identity gate compares the strings.
    pub fn contradiction(&self, version: &str, field: Field) -> Option<String> {
        let Ok(want) = Version::from_str(version) else {
            return Some(format!("{version} is not a PEP 440 version"));
        };
        let base = self.base()?;
        let public = want.clone().without_local();
        let local = want.local();
        if self.distance == 0 && self.describe.is_some() {
            if public != base {
                return Some(format!("its public version is not the tag's {base}"));
            }
            if field == Field::Runtime && !local.is_empty() {
                return Some("a tagged commit's version has no local label".into());
            }
            return None;
        }
        let guessed = self.guessed().and_then(|g| {
            let v = Version::from_str(&format!("{g}.dev{}", self.distance)).ok()?;
            Some((g, v))
        });
        if let Some((g, v)) = &guessed
            && public != *v
        {
            return Some(format!(
                "its public version is not {g}.dev{}, which setuptools-scm makes of {} commit(s) after {base}",
                self.distance, self.distance
            ));
        }
        if public <= base {
            return Some(format!(
                "the commit is {} commit(s) after {base}, so its version is greater than {base}",
                self.distance
            ));
        }
        if want.dev() != Some(self.distance as u64) {
            return Some(format!(
                "the commit is {} commit(s) after the tag, so its version ends .dev{}",
                self.distance, self.distance
            ));
        }
        let node = match local.first() {
            Some(LocalSegment::String(s)) => s.strip_prefix('g'),
            _ => None,
        };
        let ok_node = node.is_some_and(|h| {
            h.len() >= 7 && h.chars().all(|c| c.is_ascii_hexdigit()) && self.commit.starts_with(h)
        });
        if !ok_node {
            return Some(format!(
                "its local label is not +g{} (the commit)",
                self.short()
            ));
        }
        if field == Field::Runtime && local.len() > 1 {
            return Some(format!("its local label is more than +g{}", self.short()));
        }
        None
    }
}

/// Whether the checkout at `tree` versions itself with setuptools-scm's
/// default schemes: its `pyproject.toml` (read up to 4 MiB) has a
/// `[tool.setuptools_scm]` table setting nothing but where the version is
/// written (`version_file`, `write_to`, their templates) and the fallback.
/// `Err` names why the history is not compared before the wheel stage
/// (no `pyproject.toml`, no such table, another setting).
pub fn tree_uses_default_schemes(tree: &Path) -> std::result::Result<(), String> {
    const ALLOWED: &[&str] = &[
        "version_file",
        "write_to",
        "version_file_template",
        "write_to_template",
        "fallback_version",
    ];
    let path = tree.join("pyproject.toml");
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(4 << 20).read_to_string(&mut text))
        .map_err(|e| format!("{} cannot be read ({e})", path.display()))?;
    let doc: toml::Table =
        toml::from_str(&text).map_err(|e| format!("{} does not parse ({e})", path.display()))?;
    let Some(scm) = doc
        .get("tool")
        .and_then(|t| t.get("setuptools_scm"))
        .and_then(toml::Value::as_table)
    else {
        return Err(format!("{} has no [tool.setuptools_scm]", path.display()));
    };
    let other: Vec<&str> = scm
        .keys()
        .map(String::as_str)
        .filter(|k| !ALLOWED.contains(k))
        .collect();
    if other.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} [tool.setuptools_scm] sets {}",
            path.display(),
            other.join(", ")
        ))
    }
}

/// The recipe's `expect.runtime_version` and `expect.distribution_version`
/// against what the history of its commit in the mirror at `mirror` fixes
/// ([`History::contradiction`]), for the checkout at `tree`: the build's
/// step before the wheel stage, so a wrong version fails in seconds, before
/// any build venv or wheel staging. Nothing is read when the recipe expects
/// no version; a tree not on setuptools-scm's default schemes
/// ([`tree_uses_default_schemes`]) is not compared here (said on stderr),
/// and the wheel stage's check, which asks the tree, still runs.
///
/// Errors (exit 3, identity mismatch): a field the history contradicts,
/// naming the expected version, the version the history gives and the tag
/// (name and commit) it comes from.
pub fn check_expected(lr: &LoadedRecipe, mirror: &Path, tree: &Path) -> Result<()> {
    let r = &lr.recipe;
    let fields = [
        (
            "expect.runtime_version",
            &r.expect.runtime_version,
            Field::Runtime,
        ),
        (
            "expect.distribution_version",
            &r.expect.distribution_version,
            Field::Distribution,
        ),
    ];
    if fields.iter().all(|(_, want, _)| want.is_none()) {
        return Ok(());
    }
    if let Err(why) = tree_uses_default_schemes(tree) {
        crate::progress::stage(
            "version",
            format!(
                "the expected versions are not compared with the history before the wheel stage: {why}; the wheel stage compares them with the version the tree computes"
            ),
        );
        return Ok(());
    }
    let Some(h) = of(mirror, &r.source.commit) else {
        return Ok(());
    };
    let wrong: Vec<String> = fields
        .iter()
        .filter_map(|(name, want, field)| {
            let want = want.as_ref()?;
            let why = h.contradiction(want, *field)?;
            Some(format!("{name} is {want} ({why})"))
        })
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    let unconfirmed = super::unconfirmed_tags(mirror, &r.source.commit);
    let aside = if unconfirmed.is_empty() {
        String::new()
    } else {
        format!(
            "; the mirror also holds tags a cache or bundle brought unsigned ({}), which are not used for versions until confirmed: build online (a fetch from the repository confirms them) or take a source whose tags trusted builders signed",
            unconfirmed.join(", ")
        )
    };
    Err(crate::exit::mismatch(format!(
        "{}: {}, but the history of {} gives {} (from {}; {}){aside}; refusing before the wheel stage (no build venv was made, nothing was built)",
        lr.origin,
        wrong.join(" and "),
        r.source.commit,
        h.gives(),
        h.from(),
        h.rule()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "56d875cf1e0a6f1b2c3d4e5f60718293a4b5c6d7";

    fn at(tag: Option<&str>, distance: usize) -> History {
        History {
            commit: SHA.into(),
            describe: tag.map(|t| Describe {
                tag: t.into(),
                commit: "0".repeat(40),
            }),
            distance,
        }
    }

    #[test]
    fn a_tag_s_version_is_read_as_setuptools_scm_reads_it() {
        let v = |t: &str| tag_version(t).map(|v| v.to_string());
        assert_eq!(v("v0.2.0").as_deref(), Some("0.2.0"));
        assert_eq!(v("0.6.3.post1").as_deref(), Some("0.6.3.post1"));
        assert_eq!(v("vllm-v1.2.3").as_deref(), Some("1.2.3"));
        assert_eq!(v("v1.0+local").as_deref(), Some("1.0"));
        assert_eq!(v("release-candidate").as_deref(), None);
        assert_eq!(v("nightly2024").as_deref(), None);
    }

    #[test]
    fn a_tagged_commit_gives_the_tag_s_version() {
        let h = at(Some("v0.2.0"), 0);
        assert_eq!(h.gives(), "0.2.0");
        assert_eq!(h.contradiction("0.2.0", Field::Runtime), None);
        assert_eq!(h.contradiction("0.2.0+cpu", Field::Distribution), None);
        for wrong in ["9.9.9", "0.2.0+cpu", "0.2.1.dev1+g56d875cf1"] {
            assert!(h.contradiction(wrong, Field::Runtime).is_some(), "{wrong}");
        }
    }

    #[test]
    fn a_commit_after_the_tag_gives_a_development_version_of_its_distance_and_sha() {
        let h = at(Some("v0.1.0"), 1);
        assert!(h.gives().contains(".dev1+g56d875cf1"), "{}", h.gives());
        // As setuptools-scm 8 wrote it for the fixture (guess-next-dev, node-and-date).
        for right in ["0.1.1.dev1+g56d875cf1", "0.1.1.dev1+g56d875c"] {
            assert_eq!(h.contradiction(right, Field::Runtime), None, "{right}");
        }
        assert_eq!(
            h.contradiction("0.1.1.dev1+g56d875cf1.cpu", Field::Distribution),
            None
        );
        for wrong in [
            "0.1.0",
            "0.1.1",
            "0.1.1.dev2+g56d875cf1",
            "0.1.1.dev1+gdeadbeef",
            "0.1.1.dev1+g56d875cf1.cpu",
            "0.0.9.dev1+g56d875cf1",
        ] {
            assert!(h.contradiction(wrong, Field::Runtime).is_some(), "{wrong}");
        }
        let none = at(None, 3);
        assert_eq!(
            none.contradiction("0.1.dev3+g56d875cf1", Field::Runtime),
            None
        );
        assert!(none.contradiction("1.0", Field::Runtime).is_some());
    }

    #[test]
    fn the_whole_version_and_the_rule_are_said_as_setuptools_scm_guesses_them() {
        // vLLM's case: 14671 commits after v0.7.2.
        let h = at(Some("v0.7.2"), 14671);
        assert_eq!(h.gives(), "0.7.3.dev14671+g56d875cf1");
        // A release candidate's last number is bumped: rc1 -> rc2.
        let rc = at(Some("v0.23.1rc1"), 1511);
        assert_eq!(rc.gives(), "0.23.1rc2.dev1511+g56d875cf1");
        assert!(
            rc.rule()
                .contains("0.23.1rc1 with its last number bumped (0.23.1rc2)"),
            "{}",
            rc.rule()
        );
        assert!(
            rc.rule().contains(".dev1511 for the 1511 commits since"),
            "{}",
            rc.rule()
        );
        let why = rc
            .contradiction("0.23.1rc1.dev1511", Field::Runtime)
            .unwrap();
        assert!(why.contains("not 0.23.1rc2.dev1511"), "{why}");
        assert_eq!(
            rc.contradiction("0.23.1rc2.dev1511+g56d875cf1", Field::Runtime),
            None
        );
        assert_eq!(
            at(Some("v1.0.post1"), 2).gives(),
            "1.0.post2.dev2+g56d875cf1"
        );
        assert_eq!(at(Some("v1.0.dev0"), 2).gives(), "1.0.dev2+g56d875cf1");
        assert_eq!(at(None, 3).gives(), "0.1.dev3+g56d875cf1");
        assert_eq!(at(Some("v0.2.0"), 0).gives(), "0.2.0");
        // A .devN tag setuptools-scm refuses to bump: said in words.
        assert!(
            at(Some("v1.0.dev3"), 2)
                .gives()
                .starts_with("a development version 2 commits after")
        );
    }

    #[test]
    fn only_a_tree_on_the_default_schemes_is_compared() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pyproject.toml");
        assert!(tree_uses_default_schemes(d.path()).is_err());
        std::fs::write(
            &p,
            "[tool.setuptools_scm]\nversion_file = \"x/_version.py\"\n",
        )
        .unwrap();
        assert_eq!(tree_uses_default_schemes(d.path()), Ok(()));
        std::fs::write(
            &p,
            "[tool.setuptools_scm]\nversion_scheme = \"post-release\"\n",
        )
        .unwrap();
        let e = tree_uses_default_schemes(d.path()).unwrap_err();
        assert!(e.contains("version_scheme"), "{e}");
        std::fs::write(&p, "[project]\nname = \"x\"\n").unwrap();
        assert!(tree_uses_default_schemes(d.path()).is_err());
    }
}
