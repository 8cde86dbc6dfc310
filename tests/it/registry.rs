//! A real OCI registry for the cache tests: Debian's `docker-registry`
//! (the CNCF distribution server) started on 127.0.0.1 with its own
//! config and storage in a temporary directory, optionally behind htpasswd
//! (bcrypt) auth, and stopped by its pid when dropped.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The registry server binary (`apt-get install docker-registry`).
pub const SERVER: &str = "/usr/bin/docker-registry";

/// A running registry.
pub struct Registry {
    child: Child,
    /// The port it listens on (127.0.0.1 only).
    pub port: u16,
    /// Its storage root.
    pub storage: PathBuf,
    /// Where the Docker config with its credentials is (`DOCKER_CONFIG`).
    pub docker_config: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
}

impl Registry {
    /// Starts a registry; with `auth`, htpasswd auth with that user and
    /// password, and a Docker config holding them.
    pub fn start(auth: Option<(&str, &str)>) -> Registry {
        assert!(
            Path::new(SERVER).exists(),
            "{SERVER} is missing: apt-get install docker-registry"
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        let storage = dir.path().join("storage");
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            storage.display()
        );
        let docker_config = dir.path().join("docker");
        std::fs::create_dir_all(&docker_config).unwrap();
        if let Some((user, password)) = auth {
            let hash = bcrypt::hash(password, 5).expect("bcrypt");
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, format!("{user}:{hash}\n")).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: oracle-build-test\n    path: {}\n",
                htpasswd.display()
            ));
            use base64::Engine;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            std::fs::write(
                docker_config.join("config.json"),
                format!(r#"{{"auths": {{"127.0.0.1:{port}": {{"auth": "{token}"}}}}}}"#),
            )
            .unwrap();
        }
        let cfg = dir.path().join("config.yml");
        std::fs::write(&cfg, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let mut child = Command::new(SERVER)
            .arg("serve")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("docker-registry starts");
        // Ready when it accepts connections (or fail when it exits).
        for _ in 0..400 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Registry {
                    child,
                    port,
                    storage,
                    docker_config,
                    _dir: dir,
                };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("docker-registry exited: {status}");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        panic!("docker-registry did not listen on 127.0.0.1:{port}");
    }

    /// `oci+http://127.0.0.1:<port>/<repo>`.
    pub fn url(&self, repo: &str) -> String {
        format!("oci+http://127.0.0.1:{}/{repo}", self.port)
    }

    /// The tags of `repo`, from the registry's storage.
    pub fn tags(&self, repo: &str) -> Vec<String> {
        let dir = self
            .storage
            .join("docker/registry/v2/repositories")
            .join(repo)
            .join("_manifests/tags");
        let mut out: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    /// The manifests `tag` of `repo` has pointed at (its index of revisions).
    pub fn tag_revisions(&self, repo: &str, tag: &str) -> usize {
        let dir = self
            .storage
            .join("docker/registry/v2/repositories")
            .join(repo)
            .join("_manifests/tags")
            .join(tag)
            .join("index/sha256");
        std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
    }

    /// The data file of blob `hex` (a sha256) in the storage.
    pub fn blob_file(&self, hex: &str) -> PathBuf {
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Stopped by its pid: the child handle is the process we started.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
