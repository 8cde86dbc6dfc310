//! The trust policy of the cache (issue 13, docs/cache.md).
//!
//! Content pinned by reviewed files (a commit, a lock's hashes, a
//! `URL_HASH`) needs only its digest. The mapping key -> built wheel needs a
//! signature, as a Nix narinfo does: the box that built it signs a
//! [`Statement`] (kind, key, the full key inputs, the files with sha256 and
//! size, builder, time) and the pulling box accepts it only with
//! `min_signatures` valid signatures from its `trusted_signers`.
//!
//! - The statement is signed as canonical JSON ([`Statement::canonical`]):
//!   RFC 8785 (JCS) for the subset emitted here: objects with members sorted
//!   by the UTF-16 code units of their names, no whitespace, strings escaped
//!   as JSON.stringify does (only `"`, `\`, and control characters, which
//!   become `\b \t \n \f \r` or `\u00xx`), integers in plain decimal with at
//!   most 2^53 magnitude; floats are refused (never emitted).
//! - Signatures are SSHSIG (OpenSSH `PROTOCOL.sshsig`), namespace
//!   [`NAMESPACE`], hash sha512, ed25519 keys, armored as
//!   `-----BEGIN SSH SIGNATURE-----`, so an operator checks one with
//!   `ssh-keygen -Y verify -n oracle-build -f allowed_signers -I <builder>
//!   -s statement.sig < statement.json`.
//! - Trusted keys come from an OpenSSH `allowed_signers` file (ssh-keygen(1),
//!   "ALLOWED SIGNERS"): `principals [options] keytype base64 [comment]`.
//!   A statement's `builder` must match one of the principals of the line
//!   whose key made the signature, as `-I` must for `ssh-keygen -Y verify`.
//!
//! One file a job: [`statement`] (what is signed, canonical JSON),
//! [`keys`] (keys and SSHSIG signing), [`allowed_signers`] (the trusted
//! keys file), [`verdict`] (the policy and the verdict), [`rule`] (the one
//! rule and table every reader consults: what is checked here, what must
//! be signed).

mod allowed_signers;
mod keys;
pub mod rule;
mod statement;
mod verdict;

pub use allowed_signers::*;
pub use keys::*;
pub use statement::*;
pub use verdict::*;

#[cfg(test)]
mod tests {
    use super::statement::canonical_into;
    use super::*;
    use crate::store::key::content_key;
    use serde_json::Value;
    use serde_json::json;
    use std::path::Path;
    use std::path::PathBuf;
    use std::process::Command;

    /// A fresh ed25519 key made by the real ssh-keygen: (private path, public line).
    fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
        let path = dir.join(name);
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(&path)
            .output()
            .expect("ssh-keygen runs (openssh-client)");
        assert!(out.status.success(), "{out:?}");
        let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
        (path, public.trim().to_string())
    }

    fn inputs() -> Value {
        json!({"schema": 1, "commit": "abc", "nested": {"z": [1, "é\n"], "a": null}})
    }

    fn statement(builder: &str, wheel_sha: &str) -> Statement {
        let inputs = inputs();
        Statement {
            kind: "wheel".into(),
            key: content_key(&inputs),
            inputs,
            files: vec![FileDigest {
                path: "pkg-1.0-py3-none-any.whl".into(),
                sha256: wheel_sha.into(),
                size: 42,
            }],
            builder: builder.into(),
            time: "2026-12-01T10:00:00Z".into(),
        }
    }

    fn policy(allowed: &str, min: u32) -> Policy {
        Policy {
            allowed: Some(AllowedSigners::parse(allowed, "allowed_signers").unwrap()),
            min_signatures: min,
        }
    }

    const NOW: i64 = 1_796_000_000;

    #[test]
    fn canonical_form_is_sorted_compact_and_escaped_as_rfc8785() {
        let mut out = String::new();
        let v = json!({"b": 1, "a": [true, null, "x\"\\\u{1}é/"], "\u{e000}": 0, "\u{10000}": 0});
        canonical_into(&v, &mut out).unwrap();
        // U+10000 is the surrogate pair D800 DC00, which sorts before U+E000 in UTF-16.
        assert_eq!(
            out,
            "{\"a\":[true,null,\"x\\\"\\\\\\u0001é/\"],\"b\":1,\"\u{10000}\":0,\"\u{e000}\":0}"
        );
        let mut out = String::new();
        assert!(canonical_into(&json!({"f": 1.5}), &mut out).is_err());
        assert!(canonical_into(&json!(9_007_199_254_740_993u64), &mut String::new()).is_err());
    }

    #[test]
    fn statement_round_trips_only_in_canonical_form() {
        let s = statement("alice@box", &"a".repeat(64));
        let bytes = s.canonical().unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with("{\"builder\":\"alice@box\",\"files\":[{\"path\":"));
        assert!(!text.contains(' ') && !text.contains('\n'));
        assert_eq!(Statement::from_canonical(&bytes).unwrap(), s);
        let pretty = serde_json::to_vec_pretty(&s).unwrap();
        let err = Statement::from_canonical(&pretty).unwrap_err();
        assert!(
            format!("{err:#}").contains("not in canonical form"),
            "{err:#}"
        );
    }

    #[test]
    fn our_signature_verifies_with_ssh_keygen() {
        let dir = tempfile::tempdir().unwrap();
        let (key_path, public) = keygen(dir.path(), "alice");
        let key = SigningKey::load(&key_path).unwrap();
        let att = sign(&statement("alice@box", &"a".repeat(64)), &key).unwrap();
        let stmt = dir.path().join("statement.json");
        let sig = dir.path().join("statement.json.sig");
        std::fs::write(&stmt, &att.statement).unwrap();
        std::fs::write(&sig, &att.signature).unwrap();
        let allowed = dir.path().join("allowed_signers");
        std::fs::write(
            &allowed,
            format!("alice@box namespaces=\"oracle-build\" {public}\n"),
        )
        .unwrap();
        let verify = |ns: &str, id: &str| {
            Command::new("ssh-keygen")
                .args(["-Y", "verify", "-n", ns, "-I", id, "-f"])
                .arg(&allowed)
                .arg("-s")
                .arg(&sig)
                .stdin(std::fs::File::open(&stmt).unwrap())
                .output()
                .unwrap()
        };
        let ok = verify(NAMESPACE, "alice@box");
        assert!(ok.status.success(), "{ok:?}");
        assert!(String::from_utf8_lossy(&ok.stdout).contains("Good \"oracle-build\" signature"));
        assert!(!verify("file", "alice@box").status.success());
        assert!(!verify(NAMESPACE, "mallory@box").status.success());
        // A changed statement no longer verifies.
        std::fs::write(&stmt, att.statement.replace("alice@box", "alice@box2")).unwrap();
        assert!(!verify(NAMESPACE, "alice@box").status.success());
    }

    #[test]
    fn ssh_keygen_signature_verifies_with_us() {
        let dir = tempfile::tempdir().unwrap();
        let (key_path, public) = keygen(dir.path(), "bob");
        let s = statement("bob@gb10", &"b".repeat(64));
        let stmt = dir.path().join("statement.json");
        std::fs::write(&stmt, s.canonical().unwrap()).unwrap();
        let out = Command::new("ssh-keygen")
            .args(["-Y", "sign", "-n", NAMESPACE, "-f"])
            .arg(&key_path)
            .arg(&stmt)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let att = Attestation {
            statement: std::fs::read_to_string(&stmt).unwrap(),
            signature: std::fs::read_to_string(dir.path().join("statement.json.sig")).unwrap(),
        };
        let files = s.files.clone();
        let verdict = verify(
            "wheel",
            &s.key,
            &files,
            std::slice::from_ref(&att),
            &policy(&format!("bob@* {public}"), 1),
            NOW,
        );
        let Verdict::Trusted { signers } = &verdict else {
            panic!("{verdict}")
        };
        assert_eq!(signers.len(), 1);
        assert_eq!(signers[0].builder, "bob@gb10");
        assert!(signers[0].fingerprint.starts_with("SHA256:"));
        // Signed in another namespace: refused.
        std::fs::remove_file(dir.path().join("statement.json.sig")).unwrap();
        let out = Command::new("ssh-keygen")
            .args(["-Y", "sign", "-n", "file", "-f"])
            .arg(&key_path)
            .arg(&stmt)
            .output()
            .unwrap();
        assert!(out.status.success());
        let other = Attestation {
            signature: std::fs::read_to_string(dir.path().join("statement.json.sig")).unwrap(),
            ..att
        };
        let v = verify(
            "wheel",
            &s.key,
            &files,
            &[other],
            &policy(&format!("bob@* {public}"), 1),
            NOW,
        );
        assert!(v.to_string().contains("namespace `file`"), "{v}");
    }

    #[test]
    fn verdicts_untrusted_not_enough_trusted_and_reproducibility() {
        let dir = tempfile::tempdir().unwrap();
        let (a_path, a_pub) = keygen(dir.path(), "a");
        let (b_path, b_pub) = keygen(dir.path(), "b");
        let (m_path, _) = keygen(dir.path(), "m");
        let (a, b, m) = (
            SigningKey::load(&a_path).unwrap(),
            SigningKey::load(&b_path).unwrap(),
            SigningKey::load(&m_path).unwrap(),
        );
        let good = "c".repeat(64);
        let s_a = statement("a@one", &good);
        let key = s_a.key.clone();
        let files = s_a.files.clone();
        let att_a = sign(&s_a, &a).unwrap();
        let att_b = sign(&statement("b@two", &good), &b).unwrap();
        let allowed = format!("# team\n\na@one {a_pub}\nb@two {b_pub}\n");

        // An unknown key is untrusted.
        let att_m = sign(&statement("a@one", &good), &m).unwrap();
        let v = verify(
            "wheel",
            &key,
            &files,
            std::slice::from_ref(&att_m),
            &policy(&allowed, 1),
            NOW,
        );
        assert!(
            matches!(&v, Verdict::Untrusted { why } if why[0].contains("is not in allowed_signers")),
            "{v}"
        );

        // No trusted_signers at all: untrusted.
        let none = Policy {
            allowed: None,
            min_signatures: 1,
        };
        assert!(matches!(
            verify(
                "wheel",
                &key,
                &files,
                std::slice::from_ref(&att_a),
                &none,
                NOW
            ),
            Verdict::Untrusted { .. }
        ));

        // One of two needed.
        let v = verify(
            "wheel",
            &key,
            &files,
            &[att_a.clone(), att_m],
            &policy(&allowed, 2),
            NOW,
        );
        assert!(
            matches!(
                &v,
                Verdict::NotEnough {
                    have: 1,
                    need: 2,
                    ..
                }
            ),
            "{v}"
        );
        // The same key twice is still one signer.
        let again = sign(
            &Statement {
                time: "2026-12-02T00:00:00Z".into(),
                ..s_a.clone()
            },
            &a,
        )
        .unwrap();
        let v = verify(
            "wheel",
            &key,
            &files,
            &[att_a.clone(), again],
            &policy(&allowed, 2),
            NOW,
        );
        assert!(matches!(&v, Verdict::NotEnough { have: 1, .. }), "{v}");
        // Two distinct trusted keys.
        let v = verify(
            "wheel",
            &key,
            &files,
            &[att_a.clone(), att_b.clone()],
            &policy(&allowed, 2),
            NOW,
        );
        assert!(
            matches!(&v, Verdict::Trusted { signers } if signers.len() == 2),
            "{v}"
        );

        // A second trusted builder with another wheel sha256: reproducibility failure.
        let att_b_other = sign(&statement("b@two", &"d".repeat(64)), &b).unwrap();
        let v = verify(
            "wheel",
            &key,
            &files,
            &[att_a.clone(), att_b_other],
            &policy(&allowed, 1),
            NOW,
        );
        let Verdict::Reproducibility(d) = &v else {
            panic!("{v}")
        };
        assert_eq!(d.one.1[0].sha256, good);
        assert_eq!(d.other.1[0].sha256, "d".repeat(64));
        assert!(v.to_string().contains("reproducibility failure"));

        // Signed, but the entry holds other bytes.
        let mut held = files.clone();
        held[0].sha256 = "e".repeat(64);
        let v = verify(
            "wheel",
            &key,
            &held,
            std::slice::from_ref(&att_a),
            &policy(&allowed, 1),
            NOW,
        );
        assert!(v.to_string().contains("names other files"), "{v}");

        // Builder not a principal of the signing key's line.
        let att_wrong = sign(&statement("b@two", &good), &a).unwrap();
        let v = verify(
            "wheel",
            &key,
            &files,
            &[att_wrong],
            &policy(&allowed, 1),
            NOW,
        );
        assert!(
            v.to_string().contains("is not one of its principals"),
            "{v}"
        );

        // A statement for another key, and inputs that do not hash to the key.
        let v = verify(
            "wheel",
            &"0".repeat(32),
            &files,
            std::slice::from_ref(&att_a),
            &policy(&allowed, 1),
            NOW,
        );
        assert!(v.to_string().contains("not wheel 000"), "{v}");
        let forged = Statement {
            inputs: json!({"other": true}),
            ..s_a.clone()
        };
        let v = verify(
            "wheel",
            &key,
            &files,
            &[sign(&forged, &a).unwrap()],
            &policy(&allowed, 1),
            NOW,
        );
        assert!(v.to_string().contains("hash to key"), "{v}");

        // A tampered statement.
        let tampered = Attestation {
            statement: att_a.statement.replace("2026-12-01", "2026-12-09"),
            ..att_a.clone()
        };
        let v = verify(
            "wheel",
            &key,
            &files,
            &[tampered],
            &policy(&allowed, 1),
            NOW,
        );
        assert!(v.to_string().contains("does not verify"), "{v}");

        // Namespaces and validity on the line.
        let ns = format!("a@one namespaces=\"git,file\" {a_pub}");
        let v = verify(
            "wheel",
            &key,
            &files,
            std::slice::from_ref(&att_a),
            &policy(&ns, 1),
            NOW,
        );
        assert!(v.to_string().contains("does not admit"), "{v}");
        let expired = format!("a@one valid-before=\"20200101Z\" {a_pub}");
        let v = verify(
            "wheel",
            &key,
            &files,
            std::slice::from_ref(&att_a),
            &policy(&expired, 1),
            NOW,
        );
        assert!(v.to_string().contains("not valid now"), "{v}");
        let fine =
            format!("a@one valid-after=\"20200101Z\",namespaces=\"oracle-*\" {a_pub} comment");
        assert!(verify("wheel", &key, &files, &[att_a], &policy(&fine, 1), NOW).is_trusted());
    }

    #[test]
    fn allowed_signers_refuses_what_it_cannot_parse_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let (_, public) = keygen(dir.path(), "k");
        let cases = [
            (format!("a@b cert-authority {public}"), "cert-authority"),
            (
                format!("a@b no-such-option {public}"),
                "unknown or malformed option",
            ),
            (
                "a@b ssh-rsa AAAAB3NzaC1yc2E".to_string(),
                "key type `ssh-rsa` is not supported",
            ),
            ("a@b ssh-ed25519 bm90IGEga2V5".to_string(), "does not parse"),
            ("a@b".to_string(), "no public key"),
            (
                format!("a@b valid-after=\"2020\" {public}"),
                "is not YYYYMMDD",
            ),
        ];
        for (line, want) in cases {
            let text = format!("# comment\n\n{line}\n");
            let err = AllowedSigners::parse(&text, "/etc/allowed").unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.starts_with("/etc/allowed: line 3: "), "{msg}");
            assert!(msg.contains(want), "{line}: {msg}");
            assert_eq!(crate::exit::code_of(&err), 2);
        }
    }

    #[test]
    fn signing_key_refuses_encrypted_and_non_ed25519_keys() {
        let dir = tempfile::tempdir().unwrap();
        let enc = dir.path().join("enc");
        let st = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "secret", "-f"])
            .arg(&enc)
            .status()
            .unwrap();
        assert!(st.success());
        let err = SigningKey::load(&enc).unwrap_err();
        assert!(
            format!("{err:#}").contains("encrypted with a passphrase"),
            "{err:#}"
        );
        assert_eq!(crate::exit::code_of(&err), 2);
        let ec = dir.path().join("ec");
        let st = Command::new("ssh-keygen")
            .args(["-q", "-t", "ecdsa", "-N", "", "-f"])
            .arg(&ec)
            .status()
            .unwrap();
        assert!(st.success());
        let err = SigningKey::load(&ec).unwrap_err();
        assert!(format!("{err:#}").contains("only with ed25519"), "{err:#}");
        let err = SigningKey::from_openssh("hello", "k").unwrap_err();
        assert!(format!("{err:#}").contains("k: signing_key: not an OpenSSH private key"));
    }

    #[test]
    fn patterns_follow_openssh_match_pattern_list() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(matches_patterns("alice@gb10", &p(&["alice@*"])));
        assert!(matches_patterns("alice@gb10", &p(&["bob", "alice@gb1?"])));
        assert!(!matches_patterns("alice@gb10", &p(&["alice@gb1"])));
        assert!(!matches_patterns("alice@gb10", &p(&["*", "!alice@*"])));
        assert!(!matches_patterns("x", &p(&["!y"])));
    }
}
