//! The installer of every oracle, uv, pinned by the binary (issues 40 and
//! 41): its wheel is fetched by the sha256 compiled into this tool
//! ([`crate::host::uv_wheels`]), through the site's `[[mirror]]` tables,
//! with the tool's own downloader ([`crate::host::http`], through the
//! wheelhouse), into the store's wheelhouse; it is then unpacked into the
//! tools directory ([`toolchain::install_uv_wheel`]). No pip, no index, no
//! record from a cache or bundle decides which uv runs; nothing is written
//! outside the store and the tools directory.

use anyhow::{Result, anyhow};

use crate::host::mirror::Mapped;
use crate::host::platform::Platform;
use crate::host::toolchain::{self, Tool, UV_VERSION};
use crate::host::{http, uv_wheels};
use crate::progress;
use crate::stages::lock::pylock::{Artifact, LockedPackage};
use crate::stages::wheelhouse;
use crate::store::{Entry, Store, TempRoots};

/// The wheelhouse entry of the pinned uv's wheel for `platform`
/// ([`uv_wheels::for_platform`]), downloaded when the store lacks it: from
/// its PyPI URL as the site's `[[mirror]]` tables map it, hash-checked
/// against the compiled-in sha256 before the entry is written. The entry is
/// registered in `temp` first. Returns the entry and the artifact as
/// recorded (`url` is the URL fetched).
///
/// Errors: uv has no pinned wheel for `platform`; a `[[mirror]]` drops the
/// URL (exit 2, naming the table); the download fails; the bytes served
/// have another sha256 (the message names both, and the URL).
pub fn wheel_entry(
    store: &Store,
    platform: &Platform,
    temp: Option<&TempRoots>,
) -> Result<(Entry, Artifact)> {
    let w = uv_wheels::for_platform(platform)
        .ok_or_else(|| anyhow!("uv {UV_VERSION} has no pinned wheel for {platform}"))?;
    let mirrors = crate::host::mirror::load(store.root())?;
    let url = match mirrors.map(w.url) {
        Mapped::Unchanged(u) | Mapped::Mirrored(u, _) => u,
        Mapped::Dropped(m) => {
            return Err(crate::exit::bad_input(format!(
                "the pinned uv's wheel {} is dropped by {} (url = \"none\"); give that mirror a URL that serves it, or put uv {UV_VERSION} on PATH",
                w.url,
                m.describe()
            )));
        }
    };
    let artifact = Artifact {
        package: "uv".into(),
        version: UV_VERSION.into(),
        filename: w.filename.into(),
        url: Some(url.clone()),
        path: None,
        sha256: w.sha256.into(),
        size: Some(w.size),
    };
    let pkg = LockedPackage {
        name: "uv".into(),
        version: UV_VERSION.into(),
        marker: None,
        wheels: vec![artifact.clone()],
        sdist: None,
    };
    let entry = wheelhouse::entry(store, w.sha256);
    if !entry.exists() {
        progress::stage(
            "toolchain",
            format!("fetching uv {UV_VERSION} for {platform} from {url}"),
        );
    }
    wheelhouse::ensure(store, &[pkg], store.root(), false, temp).map_err(|e| {
        match e.downcast_ref::<http::DownloadError>() {
            Some(http::DownloadError::Hash { actual, url, .. }) => {
                let what = format!("uv's wheel {} from {url}", w.filename);
                uv_wheels::check(actual, &platform.arch, &what)
                    .err()
                    .unwrap_or(e)
            }
            _ => e.context(format!("fetching uv {UV_VERSION}'s wheel {}", w.filename)),
        }
    })?;
    Ok((entry, artifact))
}

/// Fetches the pinned uv's wheel for this host ([`wheel_entry`]) and
/// installs it into the tools directory ([`toolchain::install_uv_wheel`]).
///
/// Errors: this host is not a platform uv has a pinned wheel for; the
/// fetch, the hash check or the install fails.
pub fn provision(store: &Store) -> Result<Tool> {
    let platform = Platform::host().ok_or_else(|| {
        anyhow!(
            "this host ({}, without glibc?) has no pinned uv wheel: put uv {UV_VERSION} on PATH or set ORACLE_BUILD_UV",
            std::env::consts::ARCH
        )
    })?;
    progress::stage(
        "toolchain",
        format!(
            "provisioning uv {UV_VERSION} into {}",
            toolchain::uv_dir(store).display()
        ),
    );
    let (entry, _) = wheel_entry(store, &platform, None)?;
    let file = wheelhouse::file_of(&entry)?;
    toolchain::install_uv_wheel(store, &file, &format!("the wheel {}", entry.label()))
}

/// The uv [`toolchain::find_uv`] finds, else the pinned one provisioned
/// ([`provision`]).
///
/// Errors: as [`toolchain::find_uv`] for a bad `ORACLE_BUILD_UV`; as
/// [`provision`] (the message says how else to get uv).
pub fn find_or_provision_uv(store: &Store) -> Result<Tool> {
    if std::env::var_os("ORACLE_BUILD_UV").is_some_and(|v| !v.is_empty()) {
        return toolchain::find_uv(store);
    }
    match toolchain::find_uv(store) {
        Ok(t) => Ok(t),
        Err(_) => provision(store).map_err(|e| {
            e.context(format!(
                "provisioning uv {UV_VERSION}: install it yourself (https://docs.astral.sh/uv/), set ORACLE_BUILD_UV, or map its URL with a [[mirror]]"
            ))
        }),
    }
}
