//! The diagnosis behind `oracle-build doctor`: find every known way an
//! oracle goes wrong (docs/identity.md, "`doctor`") and say how to fix each.
//!
//! Inspects the store (roots, entries, their files), every alias in the
//! registry, and every venv named with `--venv` (built by this tool or not).
//! Each problem is one [`Problem`]: a kind, the thing it is about, what is
//! wrong, and a one-line fix. Exit 0 when healthy, 1 when any problem is found.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::recipe::pin;
use crate::recipe::shell_arg as recipe_arg;
use crate::recipe::{self, Recipe};
use crate::shell::{command_at, shell_quote};
use crate::stages::identity::record;
use crate::stages::identity::{self, Identity, dirty_mark, lacks_history, release_tag, scm_sha};
use crate::stages::oracle::OracleRecord;
use crate::store::alias::{self, Alias, Registry};
use crate::store::engine_cache::EngineCacheRow;
use crate::store::{Bucket, MANIFEST, Manifest, Root, Store};

/// What kind of problem the doctor found. Serialized (`--json`) and printed
/// as the kebab-case name, e.g. `alias-not-pin`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ProblemKind {
    /// `alias-dangling`: an alias points at an oracle that no longer exists.
    AliasDangling,
    /// `alias-missing`: a registered alias path is gone.
    AliasMissing,
    /// `alias-moved`: an alias was repointed outside oracle-build (its root names another oracle).
    AliasMoved,
    /// `alias-not-pin`: an alias points at an oracle that is not its recipe's pin, or fails its checks.
    AliasNotPin,
    /// `alias-not-symlink`: a registered alias path is not a symlink.
    AliasNotSymlink,
    /// `alias-recipe-missing`: the recipe an alias was activated from cannot be found.
    AliasRecipeMissing,
    /// `alias-registry-unreadable`: the store's `aliases.json` cannot be read.
    AliasRegistryUnreadable,
    /// `bad-config`: a table of the store's (or the user's) `config.toml`
    /// is refused, or a `[[mirror]]` drops the repository of a recipe
    /// here: every command refuses to run with it (exit 2).
    BadConfig,
    /// `broken-venv`: a venv whose identity cannot be measured.
    BrokenVenv,
    /// `damaged-entry`: a store oracle without a readable `oracle.json` or
    /// recipe, or another entry whose content does not match its sha256 or manifest.
    DamagedEntry,
    /// `dirty-tree`: vLLM was built from a tree with local changes.
    DirtyTree,
    /// `editable`: vLLM is installed editable.
    Editable,
    /// `engine-cache-orphaned`: an engine cache (`engine-cache/<venv
    /// key>-<device>`) whose oracle's venv entry is gone.
    EngineCacheOrphaned,
    /// `files-missing`: files of an entry are missing or changed (its manifest).
    FilesMissing,
    /// `flashinfer-mismatch`: the installed FlashInfer is not the recipe's.
    FlashinferMismatch,
    /// `identity-mismatch`: the measured identity differs from the recipe.
    IdentityMismatch,
    /// `import-failed`: `import vllm` fails in the venv.
    ImportFailed,
    /// `kernel-family-missing`: the oracle's wheel lacks a kernel family its
    /// recipe's `expect.kernel_families` names, or records none.
    KernelFamilyMissing,
    /// `left-by-killed-run`: a staging directory or partial download that
    /// a run which no longer runs left in the store.
    LeftByKilledRun,
    /// `no-compiled-extensions`: the vLLM install has no compiled extensions.
    NoCompiledExtensions,
    /// `no-history`: vLLM was built from a checkout without history.
    NoHistory,
    /// `no-scm-sha`: the installed vLLM records no commit.
    NoScmSha,
    /// `not-a-venv`: a `--venv` path is not a venv.
    NotAVenv,
    /// `precompiled`: vLLM's extensions came precompiled, not built from source.
    Precompiled,
    /// `root-dangling`: a GC root points at nothing.
    RootDangling,
    /// `root-outside-store`: a GC root points outside the store.
    RootOutsideStore,
    /// `store-filesystem`: the store is on a file system that does not keep
    /// what it needs (a CIFS/SMB/FAT mount, or symlinks, hard links, exec
    /// bits or atomic rename failing there): every command that writes it
    /// refuses (`store::fscheck`).
    StoreFilesystem,
    /// `unreachable`: no GC root reaches a store entry.
    Unreachable,
}

impl ProblemKind {
    /// Every kind, in declaration order.
    pub const ALL: [ProblemKind; 28] = [
        ProblemKind::AliasDangling,
        ProblemKind::AliasMissing,
        ProblemKind::AliasMoved,
        ProblemKind::AliasNotPin,
        ProblemKind::AliasNotSymlink,
        ProblemKind::AliasRecipeMissing,
        ProblemKind::AliasRegistryUnreadable,
        ProblemKind::BadConfig,
        ProblemKind::BrokenVenv,
        ProblemKind::DamagedEntry,
        ProblemKind::DirtyTree,
        ProblemKind::Editable,
        ProblemKind::EngineCacheOrphaned,
        ProblemKind::FilesMissing,
        ProblemKind::FlashinferMismatch,
        ProblemKind::IdentityMismatch,
        ProblemKind::ImportFailed,
        ProblemKind::KernelFamilyMissing,
        ProblemKind::LeftByKilledRun,
        ProblemKind::NoCompiledExtensions,
        ProblemKind::NoHistory,
        ProblemKind::NoScmSha,
        ProblemKind::NotAVenv,
        ProblemKind::Precompiled,
        ProblemKind::RootDangling,
        ProblemKind::RootOutsideStore,
        ProblemKind::StoreFilesystem,
        ProblemKind::Unreachable,
    ];

    /// The kebab-case name, as in the `--json` output.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::AliasDangling => "alias-dangling",
            ProblemKind::AliasMissing => "alias-missing",
            ProblemKind::AliasMoved => "alias-moved",
            ProblemKind::AliasNotPin => "alias-not-pin",
            ProblemKind::AliasNotSymlink => "alias-not-symlink",
            ProblemKind::AliasRecipeMissing => "alias-recipe-missing",
            ProblemKind::AliasRegistryUnreadable => "alias-registry-unreadable",
            ProblemKind::BadConfig => "bad-config",
            ProblemKind::BrokenVenv => "broken-venv",
            ProblemKind::DamagedEntry => "damaged-entry",
            ProblemKind::DirtyTree => "dirty-tree",
            ProblemKind::Editable => "editable",
            ProblemKind::EngineCacheOrphaned => "engine-cache-orphaned",
            ProblemKind::FilesMissing => "files-missing",
            ProblemKind::FlashinferMismatch => "flashinfer-mismatch",
            ProblemKind::IdentityMismatch => "identity-mismatch",
            ProblemKind::ImportFailed => "import-failed",
            ProblemKind::KernelFamilyMissing => "kernel-family-missing",
            ProblemKind::LeftByKilledRun => "left-by-killed-run",
            ProblemKind::NoCompiledExtensions => "no-compiled-extensions",
            ProblemKind::NoHistory => "no-history",
            ProblemKind::NoScmSha => "no-scm-sha",
            ProblemKind::NotAVenv => "not-a-venv",
            ProblemKind::Precompiled => "precompiled",
            ProblemKind::RootDangling => "root-dangling",
            ProblemKind::RootOutsideStore => "root-outside-store",
            ProblemKind::StoreFilesystem => "store-filesystem",
            ProblemKind::Unreachable => "unreachable",
        }
    }
}

impl std::fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem found, with its fix.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Problem {
    /// What kind of problem.
    pub kind: ProblemKind,
    /// What it is about: an alias path, `roots/<name>`, `<bucket>/<name>`, a venv path.
    pub subject: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it, one line.
    pub fix: String,
}

/// The doctor's report (`--json`).
#[derive(Debug, Serialize)]
pub struct Report {
    /// The store root inspected.
    pub store: PathBuf,
    /// Whether a store exists there.
    pub store_exists: bool,
    /// Store entries inspected.
    pub entries: usize,
    /// GC roots inspected.
    pub roots: usize,
    /// Registered aliases inspected.
    pub aliases: usize,
    /// The list roots of `import` and `pull` (`imported-<recipe>`), each
    /// `<name>: <header>, <n> entries`: what they keep from `gc`.
    pub imported: Vec<String>,
    /// The oracles' engine caches (`engine-cache/<venv key>-<device>`),
    /// with their sizes.
    pub engine_caches: Vec<EngineCacheRow>,
    /// Venvs whose identity was measured.
    pub venvs: Vec<PathBuf>,
    /// Every problem found.
    pub problems: Vec<Problem>,
    /// No problems.
    pub healthy: bool,
}

/// What the doctor was asked.
#[derive(Debug, Clone, Default)]
pub struct DoctorOptions {
    /// `--venv PATH`: venvs to inspect besides the store's.
    pub venvs: Vec<PathBuf>,
    /// `--pin PIN`: the recipe to check `--venv` venvs against.
    pub pin: Option<String>,
}

struct Doctor {
    /// The store root the fixes being written act on (`--store` in each
    /// printed command): the doctor's store, or the store owning a venv.
    at: PathBuf,
    problems: Vec<Problem>,
    measured: BTreeMap<PathBuf, Option<Identity>>,
    /// Stores whose unreadable `aliases.json` was already reported.
    bad_registries: BTreeSet<PathBuf>,
}

impl Doctor {
    /// `` `oracle-build <words> --store <at>` ``: a printed command that acts
    /// on the store where the problem is.
    fn cmd(&self, words: &str) -> String {
        format!("`{}`", command_at(words, &self.at))
    }

    /// The alias registry of `store`; an unreadable or corrupt one is
    /// reported (once per store) and read as empty, so the rest of the
    /// diagnosis goes on.
    fn registry(&mut self, store: &Store) -> Registry {
        match Registry::load(store) {
            Ok(r) => r,
            Err(e) => {
                let file = Registry::file(store);
                if self.bad_registries.insert(file.clone()) {
                    let f = shell_quote(&file.display().to_string());
                    let aside = shell_quote(&format!("{}.corrupt", file.display()));
                    self.add(
                        ProblemKind::AliasRegistryUnreadable,
                        &file.display().to_string(),
                        format!(
                            "the alias registry cannot be read, so no alias of this store is checked (and `activate` refuses to run): {}",
                            first_line(&format!("{e:#}"))
                        ),
                        format!(
                            "move it aside (`mv {f} {aside}`), then register each alias again: `{}`",
                            command_at("activate <PIN> <PATH>", store.root())
                        ),
                    );
                }
                Registry::default()
            }
        }
    }

    fn add(
        &mut self,
        kind: ProblemKind,
        subject: &str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.problems.push(Problem {
            kind,
            subject: subject.into(),
            message: message.into(),
            fix: fix.into(),
        });
    }

    /// Measures (once) and diagnoses the venv at `venv`. `recipe` is what it
    /// should be (if known), `pin` how to name that recipe in a fix (already
    /// shell-quoted: see [`recipe_arg`]).
    fn venv(
        &mut self,
        venv: &Path,
        subject: &str,
        recipe: Option<&Recipe>,
        pin: &str,
    ) -> Option<Identity> {
        let canon = venv.canonicalize().unwrap_or_else(|_| venv.to_path_buf());
        if let Some(done) = self.measured.get(&canon) {
            return done.clone();
        }
        let record = OracleRecord::read(&canon).ok();
        let package = recipe.map_or("vllm", |r| r.source.package.as_str());
        let commit = recipe.map_or("", |r| r.source.commit.as_str());
        // Tags at the commit (the evidence for a release-tag version without
        // +g<sha>) and the history's version were recorded at build time.
        let id =
            match crate::stages::oracle::measure_oracle(&canon, package, commit, record.as_ref()) {
                Ok(id) => id,
                Err(e) => {
                    self.add(
                        ProblemKind::BrokenVenv,
                        subject,
                        format!(
                            "its Python cannot report the identity: {}",
                            first_line(&format!("{e:#}"))
                        ),
                        format!("recreate it: {}", self.cmd(&format!("build {pin}"))),
                    );
                    self.measured.insert(canon, None);
                    return None;
                }
            };
        let covered = self.findings(&id, subject, recipe, pin);
        if let Some(r) = recipe {
            // Without an import there is no runtime version: the
            // distribution's still names the commit it was built from.
            let mut seen = id.clone();
            let substituted = seen.runtime_version.is_none() && seen.distribution_version.is_some();
            if substituted {
                seen.runtime_version = seen.distribution_version.clone();
            }
            // Kernels as `verify` judges them: what the recorded gate loaded.
            let cov = record
                .as_ref()
                .and_then(|x| x.smoke.kernel_coverage.as_ref());
            let failed: Vec<String> =
                identity::checks_with(&seen, r, identity::KernelRule::Recorded(cov))
                    .into_iter()
                    .filter(|c| !c.ok && !covered.contains(c.field.as_str()))
                    .map(|c| {
                        let note = if substituted && c.field == "commit" {
                            " (the distribution version: the import fails)"
                        } else {
                            ""
                        };
                        format!(
                            "{}: expected {}, found {}{note}",
                            c.field, c.expected, c.found
                        )
                    })
                    .collect();
            if !failed.is_empty() {
                self.add(
                    ProblemKind::IdentityMismatch,
                    subject,
                    format!("is not the pin of {}: {}", r.name, failed.join("; ")),
                    format!(
                        "build the pin and use that: {}",
                        self.cmd(&format!("build {pin}"))
                    ),
                );
            }
        }
        if let (Some(r), Some(rec)) = (recipe, &record) {
            self.families(&canon, subject, r, rec, pin);
        }
        self.files(&canon, subject, package, id.import_error.is_none(), pin);
        self.measured.insert(canon, Some(id.clone()));
        Some(id)
    }

    /// The kernel families `recipe` expects (`expect.kernel_families`)
    /// against those the tree's configure reported for the oracle's wheel
    /// (`rec.wheel_key` in the store owning `venv`): one problem naming
    /// each family not built and the tree's reason, or that none is recorded.
    fn families(
        &mut self,
        venv: &Path,
        subject: &str,
        recipe: &Recipe,
        rec: &OracleRecord,
        pin: &str,
    ) {
        let expected = &recipe.expect.kernel_families;
        if expected.is_empty() {
            return;
        }
        let recorded = alias::owning_root(venv)
            .and_then(|root| Store::open_existing(&root))
            .and_then(|store| {
                let dir = store.entry(Bucket::Wheels, &rec.wheel_key).path;
                crate::stages::wheel::BuildRecord::read(&dir)
                    .ok()?
                    .kernel_families(&dir)
            });
        let unmet = crate::stages::wheel::families::unmet(expected, recorded.as_deref());
        if unmet.is_empty() {
            return;
        }
        self.add(
            ProblemKind::KernelFamilyMissing,
            subject,
            format!(
                "its wheel lacks the kernel families {} expects: {}",
                recipe.name,
                unmet.join("; ")
            ),
            format!(
                "build the pin ({}), which refuses such a wheel before the venv naming the tree's reason; change what the tree's configure decides on (build.cuda_arch_list, the compiler) until it builds them",
                self.cmd(&format!("build {pin}"))
            ),
        );
    }

    /// The identity-derived problems; returns the check fields they cover.
    fn findings(
        &mut self,
        id: &Identity,
        subject: &str,
        recipe: Option<&Recipe>,
        pin: &str,
    ) -> BTreeSet<&'static str> {
        let mut covered = BTreeSet::new();
        let package = recipe.map_or("vllm", |r| r.source.package.as_str());
        let rebuild = self.cmd(&format!("build {pin}"));
        if id.editable {
            covered.extend(["editable", "package_path", "import", "compiled_extensions"]);
            let gone: Vec<&String> = id
                .editable_sources
                .iter()
                .filter(|s| !Path::new(s).exists())
                .collect();
            let source = if id.editable_sources.is_empty() {
                String::new()
            } else if gone.is_empty() {
                format!(
                    "; its source tree {} still exists, and any edit or pruning there changes the oracle",
                    id.editable_sources.join(", ")
                )
            } else {
                format!(
                    "; its source tree {} no longer exists, so `import {package}` fails",
                    gone.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            self.add(
                ProblemKind::Editable,
                subject,
                format!(
                    "editable install ({}){source}",
                    id.editable_evidence.join("; ")
                ),
                format!(
                    "replace it with a non-editable oracle: {} and use PATH instead",
                    self.cmd(&format!("build {pin} --activate <PATH>"))
                ),
            );
        } else if let Some(err) = &id.import_error {
            covered.extend(["import", "package_path", "compiled_extensions"]);
            self.add(
                ProblemKind::ImportFailed,
                subject,
                format!("`import {package}` fails: {err}"),
                format!("rebuild it: {rebuild}"),
            );
        }
        let wants_ext =
            recipe.is_none_or(|r| r.build.device() != crate::recipe::TargetDevice::Empty);
        if id.package_dir.is_some() && id.compiled_extensions.is_empty() && wants_ext {
            covered.insert("compiled_extensions");
            self.add(
                ProblemKind::NoCompiledExtensions,
                subject,
                format!("no compiled extension modules under {package}/ (a precompiled or pure-Python install: no kernels)"),
                format!("build from source (build.mode: source, VLLM_USE_PRECOMPILED unset): {rebuild}"),
            );
        }
        let versions: Vec<&String> = [&id.runtime_version, &id.distribution_version]
            .into_iter()
            .flatten()
            .collect();
        if id.build_mode == "precompiled" || versions.iter().any(|v| v.contains("precompiled")) {
            covered.insert("build_mode");
            self.add(
                ProblemKind::Precompiled,
                subject,
                format!(
                    "precompiled build (build mode {}, version {}): its kernels are not built from the commit",
                    id.build_mode,
                    versions.first().map_or("(none)", |v| v.as_str())
                ),
                format!("build from source (build.mode: source): {rebuild}"),
            );
        }
        // The runtime version when the package imports, else the distribution's.
        if let Some(v) = id
            .runtime_version
            .as_ref()
            .or(id.distribution_version.as_ref())
        {
            if scm_sha(v).is_none() && release_tag(v, &id.tags_at_commit).is_none() {
                covered.insert("commit");
                self.add(
                    ProblemKind::NoScmSha,
                    subject,
                    format!(
                    "version {v} carries no +g<sha>, so nothing ties it to a commit (a tarball, or SETUPTOOLS_SCM_PRETEND_VERSION){}",
                    if id.tags_at_commit.is_empty() {
                        String::new()
                    } else {
                        format!("; the tags at the commit ({}) do not name it", id.tags_at_commit.join(", "))
                    }
                ),
                    format!("rebuild from the git commit with full history: {rebuild}"),
                );
            } else if lacks_history(v) {
                self.add(
                    ProblemKind::NoHistory,
                    subject,
                    format!("version {v} is setuptools-scm's 0.1.devN fallback: no tag was reachable when it was built (shallow clone or repository without tags), so it is not the version upstream reports for this commit"),
                    format!("give the recipe's source.repo full history and tags (`git fetch --unshallow --tags`), then rebuild: {rebuild}"),
                );
            }
        }
        let dirty: BTreeSet<&str> = versions.iter().filter_map(|v| dirty_mark(v)).collect();
        if !dirty.is_empty() {
            covered.insert("clean_tree");
            self.add(
                ProblemKind::DirtyTree,
                subject,
                format!(
                    "version {} carries the dirty-tree mark .{}: built from a modified tree, not exactly the commit",
                    versions.first().map_or("", |v| v.as_str()),
                    dirty.into_iter().collect::<Vec<_>>().join(", .")
                ),
                format!("rebuild from the clean commit: {rebuild}"),
            );
        }
        let mut fi: BTreeMap<String, String> = id.flashinfer_packages.clone();
        if let Some(v) = &id.flashinfer_version {
            fi.insert("flashinfer.__version__".into(), v.clone());
        }
        let distinct: BTreeSet<&String> = fi.values().collect();
        if distinct.len() > 1 {
            self.add(
                ProblemKind::FlashinferMismatch,
                subject,
                format!(
                    "FlashInfer packages at different versions: {}",
                    fi.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
                ),
                format!("pin every flashinfer-* package to one version in the recipe's pins, then {rebuild}"),
            );
        }
        covered
    }

    /// Files missing or changed, by content (sha256): for a store entry its
    /// manifest (every file of the venv, hashed) and the package's RECORD by
    /// size; for any other venv the RECORD by hash.
    fn files(&mut self, venv: &Path, subject: &str, package: &str, imports: bool, pin: &str) {
        let mut problems = Vec::new();
        let in_store = venv.join(MANIFEST).is_file();
        match record::check(venv, package, !in_store) {
            Ok(rc) => problems.extend(rc.problems.into_iter().map(|p| format!("{p} (RECORD)"))),
            Err(e) if imports => problems.push(format!("{e:#}")),
            Err(_) => {}
        }
        if in_store {
            match Manifest::read(venv) {
                Ok(m) => problems.extend(
                    m.check(venv, true)
                        .into_iter()
                        .map(|p| format!("{p} (manifest)")),
                ),
                Err(e) => problems.push(format!("unreadable manifest: {e:#}")),
            }
        }
        if problems.is_empty() {
            return;
        }
        let shown = problems
            .iter()
            .take(6)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        let more = problems.len().saturating_sub(6);
        let fix = if in_store {
            // Not "delete it and rebuild": a file rewritten in place is shared
            // with the store's caches, which a plain rebuild links again.
            format!(
                "the entry is damaged: {} hashes every file, moves the entry aside, drops its damaged files from the store's caches and rebuilds it",
                self.cmd(&format!("build {pin} --deep"))
            )
        } else {
            format!(
                "reinstall, or replace it with an oracle: {}",
                self.cmd(&format!("build {pin}"))
            )
        };
        self.add(
            ProblemKind::FilesMissing,
            subject,
            format!(
                "{} file problem(s): {shown}{}",
                problems.len(),
                if more > 0 {
                    format!("; and {more} more")
                } else {
                    String::new()
                }
            ),
            fix,
        );
    }

    /// A registered alias: present, a symlink, live, and pointing at an oracle of its recipe's pin.
    fn alias(&mut self, store: &Store, a: &Alias) {
        // Its fixes act on the store that registered it.
        self.at = store.root().to_path_buf();
        let subject = a.path.display().to_string();
        let pin_arg = alias_recipe_arg(a);
        let quoted = shell_quote(&subject);
        let activate = self.cmd(&format!("activate {pin_arg} {quoted}"));
        let build_activate = self.cmd(&format!("build {pin_arg} --activate {quoted}"));
        let meta = match std::fs::symlink_metadata(&a.path) {
            Ok(m) => m,
            Err(_) => {
                self.add(
                    ProblemKind::AliasMissing,
                    &subject,
                    format!("the alias of {} no longer exists", a.recipe),
                    activate,
                );
                return;
            }
        };
        if !meta.file_type().is_symlink() {
            self.add(
                ProblemKind::AliasNotSymlink,
                &subject,
                "is no longer a symlink to an oracle (something replaced it with a directory or file)",
                format!("move it away, then {activate}"),
            );
            return;
        }
        let link = std::fs::read_link(&a.path).unwrap_or_default();
        let Ok(target) = a.path.canonicalize() else {
            self.add(
                ProblemKind::AliasDangling,
                &subject,
                format!("points at {}, which no longer exists", link.display()),
                build_activate,
            );
            return;
        };
        let lr = match alias::recipe_of(a) {
            Ok(lr) => lr,
            Err(e) => {
                self.add(
                    ProblemKind::AliasRecipeMissing,
                    &subject,
                    format!(
                        "its recipe {} cannot be read: {}",
                        a.recipe,
                        first_line(&format!("{e:#}"))
                    ),
                    format!(
                        "restore the recipe, or re-activate the alias with the right one: {}",
                        self.cmd("activate <PIN> <PATH>")
                    ),
                );
                return;
            }
        };
        let r = &lr.recipe;
        let recipe_oracle = store
            .roots_dir()
            .join(&r.name)
            .canonicalize()
            .ok()
            .filter(|p| {
                OracleRecord::read(p).is_ok_and(|rec| rec.identity.commit == r.source.commit)
            });
        let fix = if recipe_oracle.is_some() {
            activate.clone()
        } else {
            build_activate.clone()
        };
        let rooted = store.roots_dir().join(&a.root).canonicalize().ok();
        // The same directory, compared as a file (device and inode): the
        // store may be reached by another path (a bind mount) than the
        // alias's target.
        let moved = if rooted.as_ref().is_some_and(|p| same_file(p, &target)) {
            String::new()
        } else {
            format!(
                "; it was moved outside oracle-build (its root roots/{} names {})",
                a.root,
                rooted.map_or("nothing".into(), |p| p.display().to_string())
            )
        };
        let record = OracleRecord::read(&target).ok();
        let built_commit = record.as_ref().map(|rec| rec.identity.commit.clone());
        if built_commit.as_deref() != Some(r.source.commit.as_str()) {
            let what = match &record {
                Some(rec) => format!(
                    "the oracle of {} @ {} ({})",
                    rec.recipe,
                    short(&rec.identity.commit),
                    rec.identity
                        .runtime_version
                        .as_deref()
                        .unwrap_or("no version")
                ),
                None => format!(
                    "{}, which is not an oracle built by oracle-build",
                    target.display()
                ),
            };
            self.add(
                ProblemKind::AliasNotPin,
                &subject,
                format!(
                    "points at {what}, but recipe {} pins {}{moved}",
                    r.name,
                    short(&r.source.commit)
                ),
                fix,
            );
            return;
        }
        // Same commit: the oracle must still pass the recipe's checks.
        let measured = self.venv(&target, &format!("{}", target.display()), Some(r), &pin_arg);
        if let Some(mut id) = measured {
            id.commit = r.source.commit.clone();
            let cov = OracleRecord::read(&target)
                .ok()
                .and_then(|x| x.smoke.kernel_coverage);
            let failed = identity::describe_failures(&identity::checks_with(
                &id,
                r,
                identity::KernelRule::Recorded(cov.as_ref()),
            ));
            if !failed.is_empty() {
                self.add(
                    ProblemKind::AliasNotPin,
                    &subject,
                    format!(
                        "points at {}, which fails recipe {}'s checks:\n{failed}",
                        target.display(),
                        r.name
                    ),
                    fix,
                );
                return;
            }
        }
        if !moved.is_empty() {
            self.add(
                ProblemKind::AliasMoved,
                &subject,
                moved.trim_start_matches("; ").to_string(),
                activate,
            );
        }
    }
}

/// Whether `a` and `b` are the same file or directory (device and inode).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn short(commit: &str) -> &str {
    &commit[..12.min(commit.len())]
}

/// How a fix names the recipe of alias `a`: the file it was activated from
/// while it exists (absolute, shell-quoted), else the recipe's name.
fn alias_recipe_arg(a: &Alias) -> String {
    match a.recipe_file.as_ref().filter(|f| f.is_file()) {
        Some(f) => shell_quote(&f.display().to_string()),
        None => shell_quote(&a.recipe),
    }
}

/// How a fix names the recipe an oracle was built from: its `recipe_origin`
/// when that is a recipe file that still exists and still holds a recipe of
/// that name (absolute, shell-quoted), else the recipe's name.
fn record_recipe_arg(rec: &OracleRecord) -> String {
    let origin = Path::new(&rec.recipe_origin);
    match recipe::load_file(origin) {
        Ok(lr) if origin.is_file() && lr.recipe.name == rec.recipe => recipe_arg(&lr),
        _ => shell_quote(&rec.recipe),
    }
}

/// `chmod -R u+w DIR && rm -rf DIR`, DIR shell-quoted.
fn delete_cmd(dir: &Path) -> String {
    format!(
        "chmod -R u+w {0} && rm -rf {0}",
        shell_quote(&dir.display().to_string())
    )
}

/// The fix for a dangling root `name` of the store at `store_root`.
fn dangling_fix(root: &Root, registry: &Registry, store_root: &Path) -> String {
    let rm = format!(
        "remove it: `rm {}`",
        shell_quote(&root.path.display().to_string())
    );
    if let Some(base) = root.name.strip_suffix("-rollback")
        && base.starts_with("alias-")
    {
        return format!("the rollback oracle is gone, so there is nothing to roll back to; {rm}");
    }
    if let Some(a) = registry.aliases.values().find(|a| a.root == root.name) {
        return format!(
            "`{}`",
            command_at(
                &format!(
                    "build {} --activate {}",
                    alias_recipe_arg(a),
                    shell_quote(&a.path.display().to_string())
                ),
                store_root
            )
        );
    }
    match pin::resolve(&root.name) {
        Ok(lr) => format!(
            "rebuild (it re-roots): `{}`",
            command_at(&format!("build {}", recipe_arg(&lr)), store_root)
        ),
        Err(_) => rm,
    }
}

/// Inspects the store at `root`, its aliases and `opts.venvs`.
///
/// Errors: `--pin` does not resolve (exit 2), or the store cannot be listed.
pub fn diagnose(root: &Path, opts: &DoctorOptions) -> Result<Report> {
    let pinned = opts.pin.as_deref().map(pin::resolve).transpose()?;
    let mut d = Doctor {
        at: root.to_path_buf(),
        problems: Vec::new(),
        measured: BTreeMap::new(),
        bad_registries: BTreeSet::new(),
    };
    let store = Store::open_existing(root);
    let (mut n_entries, mut n_roots, mut n_aliases) = (0, 0, 0);
    let mut imported = Vec::new();
    let mut engine_caches = Vec::new();
    let mut checked: BTreeSet<PathBuf> = BTreeSet::new();
    // Every table of both `config.toml` files, whether or not the root
    // holds a store yet: the store's file, the user's or
    // ORACLE_BUILD_CACHE (each message names which).
    for problem in crate::cache::site::problems(root)? {
        d.add(
            ProblemKind::BadConfig,
            "config",
            problem,
            "fix the file (docs/cache.md lists its fields): every command refuses to run with it (exit 2)",
        );
    }
    // The repositories of the store's oracles and of `--pin`: a
    // `[[mirror]]` that drops one (`url = "none"`) is a bad configuration
    // for them (checked below).
    let mut repos: BTreeSet<String> = pinned
        .iter()
        .map(|lr| lr.recipe.source.repo.clone())
        .collect();
    if let Some(store) = &store {
        if let Some(why) = crate::store::fscheck::problem(store.root()) {
            d.add(
                ProblemKind::StoreFilesystem,
                &store.root().display().to_string(),
                why,
                "move the store to a local Linux file system (ext4, xfs, btrfs, tmpfs, NFS) and name it with --store or ORACLE_BUILD_HOME: builds refuse this one (exit 2)",
            );
        }
        let roots = store.roots()?;
        n_roots = roots.len();
        for r in roots.iter().filter(|r| r.is_list()) {
            imported.push(format!(
                "{}: {}, {} entries",
                r.name,
                r.header.as_deref().unwrap_or("a list root"),
                r.entries.len()
            ));
        }
        for path in store.left_by_dead()? {
            let rel = path.strip_prefix(store.root()).unwrap_or(&path);
            d.add(
                ProblemKind::LeftByKilledRun,
                &rel.display().to_string(),
                format!(
                    "left by a run that was killed ({:.1} MiB)",
                    crate::store::disk_usage(&path) as f64 / (1u64 << 20) as f64
                ),
                format!(
                    "`{}` removes it (so does the next build, pull or import)",
                    command_at("gc", store.root())
                ),
            );
        }
        for c in store.engine_caches()? {
            let row = c.row(store);
            if row.orphaned {
                d.add(
                    ProblemKind::EngineCacheOrphaned,
                    &row.entry,
                    format!(
                        "the engine cache of {}, which is gone: removed, or a build killed before its oracle landed ({:.1} MiB)",
                        row.oracle,
                        row.bytes as f64 / (1u64 << 20) as f64
                    ),
                    format!(
                        "`{}` removes it (a rebuild of that oracle would use it again)",
                        command_at("gc", store.root())
                    ),
                );
            }
            engine_caches.push(row);
        }
        let registry = d.registry(store);
        n_aliases = registry.aliases.len();
        for r in roots.iter().filter(|r| !r.live) {
            d.add(
                ProblemKind::RootDangling,
                &format!("roots/{}", r.name),
                format!("points at {}, which no longer exists", r.target.display()),
                dangling_fix(r, &registry, store.root()),
            );
        }
        for r in roots.iter().filter(|r| r.live && !r.is_list()) {
            let target = r.path.canonicalize().unwrap_or_else(|_| r.target.clone());
            if store.entry_of_path(&target).is_none() {
                d.add(
                    ProblemKind::RootOutsideStore,
                    &format!("roots/{}", r.name),
                    format!(
                        "points at {}, which is not an entry of the store {}: a GC root names a store entry (`gc` ignores this one, and it keeps nothing alive)",
                        target.display(),
                        store.root().join("store").display()
                    ),
                    format!(
                        "remove it: `rm {}`",
                        shell_quote(&r.path.display().to_string())
                    ),
                );
            }
        }
        // Reachable through roots and the entries' `requires` (as `gc` sees it).
        let reached = crate::store::gc::reachable(store)?;
        // Every entry is counted (as `status` lists them) and checked for
        // damage; the wheelhouse and resolved locks, the inputs' caches, are
        // not said to be unreachable.
        for bucket in Bucket::ALL {
            for e in store.entries(bucket)? {
                n_entries += 1;
                let label = e.label();
                // Every entry but an oracle or a wheel (checked below, file
                // by file) is checked as `pull` checks one it would keep: a
                // wheelhouse file against its sha256, a checkout against its
                // commit (git status), the rest against their manifests,
                // hashes included.
                if !matches!(bucket, Bucket::Venvs | Bucket::Wheels) {
                    let problems = if bucket == Bucket::Src {
                        crate::stages::source::checkout_damage(&e)
                    } else {
                        crate::cache::fetcher::damage_of(&e)
                    };
                    if !problems.is_empty() {
                        d.add(
                            ProblemKind::DamagedEntry,
                            &label,
                            problems.join("; "),
                            format!(
                                "delete it (`{}`); the next build or pull fetches or makes it again",
                                delete_cmd(&e.path)
                            ),
                        );
                    }
                }
                if matches!(bucket, Bucket::Wheelhouse | Bucket::Locks) {
                    continue;
                }
                if !reached.contains(&label) {
                    d.add(
                        ProblemKind::Unreachable,
                        &label,
                        "no root reaches this entry (a superseded build, or its root was removed)",
                        format!(
                            "`{}` deletes it; to keep it, rebuild or activate its recipe so a root points at it",
                            command_at("gc", store.root())
                        ),
                    );
                }
                match bucket {
                    Bucket::Venvs => match OracleRecord::read(&e.path) {
                        Ok(rec) => {
                            match recipe::parse(&rec.recipe_text, &format!("{label}/oracle.json")) {
                                Ok(r) => {
                                    repos.insert(r.source.repo.clone());
                                    d.venv(&e.path, &label, Some(&r), &record_recipe_arg(&rec));
                                }
                                Err(err) => d.add(
                                    ProblemKind::DamagedEntry,
                                    &label,
                                    format!(
                                        "its oracle.json recipe does not parse: {}",
                                        first_line(&format!("{err:#}"))
                                    ),
                                    format!("delete it (`{}`) and rebuild", delete_cmd(&e.path)),
                                ),
                            }
                        }
                        Err(err) => d.add(
                            ProblemKind::DamagedEntry,
                            &label,
                            format!(
                                "no readable oracle.json: {}",
                                first_line(&format!("{err:#}"))
                            ),
                            format!("delete it (`{}`) and rebuild", delete_cmd(&e.path)),
                        ),
                    },
                    Bucket::Wheels => {
                        let problems = Manifest::read(&e.path)
                            .map(|m| m.check(&e.path, true))
                            .unwrap_or_else(|err| vec![format!("unreadable manifest: {err:#}")]);
                        if !problems.is_empty() {
                            d.add(
                                ProblemKind::FilesMissing,
                                &label,
                                problems.join("; "),
                                format!(
                                    "delete it (`{}`); the next build rebuilds it",
                                    delete_cmd(&e.path)
                                ),
                            );
                        }
                    }
                    _ => {}
                }
            }
        }
        for a in registry.aliases.values() {
            d.alias(store, a);
            checked.insert(a.path.clone());
        }
    }
    for v in &opts.venvs {
        let subject = v.display().to_string();
        if !v.join("pyvenv.cfg").is_file() {
            d.add(
                ProblemKind::NotAVenv,
                &subject,
                "is not a venv (no pyvenv.cfg)",
                "name the venv directory itself (the one holding bin/python and pyvenv.cfg)",
            );
            continue;
        }
        let own = OracleRecord::read(v).ok().and_then(|rec| {
            let r = recipe::parse(&rec.recipe_text, &subject).ok()?;
            Some((r, record_recipe_arg(&rec)))
        });
        let (recipe, pin_name) = match (&pinned, own) {
            (Some(lr), _) => (Some(lr.recipe.clone()), recipe_arg(lr)),
            (None, Some((r, arg))) => (Some(r), arg),
            (None, None) => (None, "<PIN>".to_string()),
        };
        // An oracle of another store is fixed in that store.
        d.at = alias::owning_root(v)
            .filter(|r| Store::open_existing(r).is_some())
            .unwrap_or_else(|| root.to_path_buf());
        d.venv(v, &subject, recipe.as_ref(), &pin_name);
        // An alias (or a link to one) registered in this store or in the
        // store that owns the venv is also checked against its recipe.
        let owner = alias::owning_root(v).and_then(|r| Store::open_existing(&r));
        for s in store.iter().chain(owner.as_ref()) {
            let Some(a) = d.registry(s).find(v).cloned() else {
                continue;
            };
            if checked.insert(a.path.clone()) {
                d.alias(s, &a);
            }
        }
    }
    if let Ok(mirrors) = crate::host::mirror::load(root) {
        for repo in &repos {
            if let Err(e) = mirrors.git_url(repo, "the recipe's repository") {
                d.add(
                    ProblemKind::BadConfig,
                    "config",
                    format!("{e:#}"),
                    "fix the file (docs/cache.md, \"Mirrors\"): every command on a recipe of that repository refuses to run with it (exit 2)",
                );
            }
        }
    }
    // Most consequential first: aliases, then what the venvs are, their
    // files, and last the store's bookkeeping.
    let rank = |p: &Problem| match p.kind {
        k if k.as_str().starts_with("alias-") => 0,
        ProblemKind::FilesMissing | ProblemKind::DamagedEntry => 2,
        ProblemKind::RootDangling => 3,
        ProblemKind::Unreachable
        | ProblemKind::LeftByKilledRun
        | ProblemKind::EngineCacheOrphaned => 4,
        _ => 1,
    };
    d.problems.sort_by_key(rank);
    let healthy = d.problems.is_empty();
    Ok(Report {
        store: std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf()),
        store_exists: store.is_some(),
        entries: n_entries,
        roots: n_roots,
        aliases: n_aliases,
        imported,
        engine_caches,
        venvs: d.measured.keys().cloned().collect(),
        problems: d.problems,
        healthy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_kinds_serialize_to_their_kebab_names() {
        for k in ProblemKind::ALL {
            let json = serde_json::to_value(k).unwrap();
            assert_eq!(json, serde_json::Value::String(k.as_str().into()), "{k:?}");
            assert_eq!(k.to_string(), k.as_str());
        }
        assert_eq!(ProblemKind::NoScmSha.as_str(), "no-scm-sha");
        assert_eq!(
            ProblemKind::AliasRegistryUnreadable.as_str(),
            "alias-registry-unreadable"
        );
    }
}
