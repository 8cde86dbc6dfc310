//! Goldens in the team's files (`golden export` / `golden import`), end to
//! end: a real fixture oracle's golden exported and loaded by real numpy, and
//! files written by numpy (as the team's capture script writes them)
//! imported and gated by `smoke`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::support::*;
use serde_json::Value;

/// What `model` generates for the canonical prompt (tests/fixture/README.md).
const MODEL_IDS: [i64; 16] = [
    10, 4, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
];
/// What `model-b` generates: equal to `MODEL_IDS` through step 6.
const MODEL_B_IDS: [i64; 16] = [
    10, 4, 11, 12, 13, 14, 15, 25, 26, 27, 28, 29, 30, 31, 32, 33,
];
/// The canonical prompt's token ids.
const PROMPT_IDS: [i64; 9] = [2, 3, 4, 5, 6, 7, 8, 9, 2];

/// A Python with numpy: `python3` when it has it, else a venv made once
/// under the target directory with numpy from PyPI.
fn numpy_python() -> PathBuf {
    static MADE: Mutex<()> = Mutex::new(());
    let _guard = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let has = |py: &Path| {
        Command::new(py)
            .args(["-c", "import numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let system = PathBuf::from("python3");
    if has(&system) {
        return system;
    }
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("numpy-venv");
    let py = venv.join("bin/python");
    if !has(&py) {
        let ok = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
        ok(Command::new("python3").args(["-m", "venv"]).arg(&venv));
        ok(Command::new(&py).args(["-m", "pip", "install", "-q", "numpy"]));
    }
    py
}

/// Runs `script` with numpy in `dir`; its stdout.
fn numpy(dir: &Path, script: &str) -> String {
    let out = Command::new(numpy_python())
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "numpy script failed:\n{}", text(&out));
    String::from_utf8(out.stdout).unwrap()
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// Writes the team's files into `dir` as their capture script does: N
/// prompts, T = 16, K = 3 runs, `greedy_ids.npy` padded with 0 and
/// `greedy_dist.npy` with -1; `rows` are (prompt ids, output ids).
fn team_files(dir: &Path, rows: &[(&[i64], &[i64])]) {
    std::fs::create_dir_all(dir).unwrap();
    let rows: Vec<String> = rows
        .iter()
        .map(|(p, o)| format!("({p:?}, {o:?})"))
        .collect();
    numpy(
        dir,
        &format!(
            r#"
import numpy as np
rows = [{}]
N, T, K = len(rows), 16, 3
dist = np.full((N, T, K), -1, dtype="<i4")
run0 = np.zeros((N, T), dtype="<i4")
for i, (prompt, out) in enumerate(rows):
    for k in range(K):
        for j in range(min(T, len(out))):
            dist[i, j, k] = out[j]
    run0[i, :len(out)] = out
    np.array(prompt, dtype="<i4").tofile(f"p{{i}}_prompt.i32")
np.save("greedy_ids.npy", run0)
np.save("greedy_dist.npy", dist)
"#,
            rows.join(", ")
        ),
    );
}

#[test]
fn team_goldens_export_to_numpy_and_imported_ones_gate() {
    let fx = Fx::new();
    fx.pin();
    fx.exits(&["build", "fx.yaml"], 0);
    fx.exits(&["smoke", "fx.yaml", "--record-golden"], 0);
    let recorded = fx.dir().join("goldens/fx/small.json");

    // Export: the team's files load in numpy with the documented shapes and dtypes.
    let out = fx.dir().join("exported");
    let e = fx.json(&[
        "golden",
        "export",
        "fx.yaml",
        "--case",
        "small",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(e["golden"], recorded.to_str().unwrap());
    let seen: Value = serde_json::from_str(&numpy(
        &out,
        r#"
import io, json, numpy as np
def saved(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()
ids = np.load("greedy_ids.npy")
dist = np.load("greedy_dist.npy")
p = np.fromfile("p0_prompt.i32", dtype="<i4")
print(json.dumps({
    "ids": [str(ids.dtype), list(ids.shape), ids.tolist()],
    "dist": [str(dist.dtype), list(dist.shape), [dist[:, :, k].tolist() for k in range(dist.shape[2])]],
    "prompt": p.tolist(),
    "same_bytes_as_np_save": [open(f, "rb").read() == saved(a) for f, a in [("greedy_ids.npy", ids), ("greedy_dist.npy", dist)]],
}))
"#,
    ))
    .unwrap();
    assert_eq!(seen["ids"][0], "int32");
    assert_eq!(seen["ids"][1], serde_json::json!([1, 16]));
    assert_eq!(ids(&seen["ids"][2][0]), MODEL_IDS);
    assert_eq!(seen["dist"][0], "int32");
    assert_eq!(
        seen["dist"][1],
        serde_json::json!([1, 16, 3]),
        "K = smoke.runs"
    );
    for run in seen["dist"][2].as_array().unwrap() {
        assert_eq!(ids(&run[0]), MODEL_IDS);
    }
    assert_eq!(ids(&seen["prompt"]), PROMPT_IDS);
    assert_eq!(
        seen["same_bytes_as_np_save"],
        serde_json::json!([true, true])
    );
    assert_eq!(
        std::fs::read(out.join("small.json")).unwrap(),
        std::fs::read(&recorded).unwrap()
    );

    // Importing them back over the recorded golden keeps it (it records more).
    let k = fx.json(&[
        "golden",
        "import",
        "fx.yaml",
        "--case",
        "small",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(k["kept"], true);
    assert!(read_json(&recorded)["logprobs"].as_array().unwrap().len() == 16);

    // Import: files written by numpy, two prompts, row 1 this case's.
    for g in [&recorded, &fx.store().join("goldens/fx/small.json")] {
        std::fs::remove_file(g).unwrap();
    }
    let team = fx.dir().join("team");
    team_files(
        &team,
        &[(&[5, 6, 7], &[5, 6, 1]), (&PROMPT_IDS, &MODEL_IDS)],
    );
    let team_arg = team.to_str().unwrap();
    let args = |extra: &[&'static str]| {
        let mut a = vec!["golden", "import", "fx.yaml", "--case", "small", team_arg];
        a.extend_from_slice(extra);
        a
    };
    let o = fx.exits(&args(&[]), 2);
    assert!(
        text(&o).contains("has 2 rows") && text(&o).contains("--row"),
        "{}",
        text(&o)
    );
    let i = fx.json(&args(&["--row", "1", "--json"]));
    assert_eq!(i["golden"], recorded.to_str().unwrap());
    assert_eq!((i["row"].as_u64(), i["runs"].as_u64()), (Some(1), Some(3)));
    let g = read_json(&recorded);
    assert_eq!(ids(&g["prompt_token_ids"]), PROMPT_IDS);
    assert_eq!(ids(&g["output_token_ids"]), MODEL_IDS);
    assert_eq!(g["oracle"]["imported"]["row"], 1);
    let smoke = |want: i32| json(&fx.exits(&["smoke", "fx.yaml", "--json"], want));
    let s = smoke(0);
    assert_eq!(s["smoke"]["cases"][0]["golden"], "matched", "{s:#}");
    // Row 0 stopped early: 0-padded in greedy_ids.npy, -1 in greedy_dist.npy.
    let i0 = fx.run(&[
        "golden", "import", "fx.yaml", "--case", "small", team_arg, "--row", "0", "--force",
        "--json",
    ]);
    assert_eq!(code(&i0), 0, "{}", text(&i0));
    assert_eq!(ids(&read_json(&recorded)["output_token_ids"]), [5, 6, 1]);
    let s = smoke(4);
    assert_eq!(
        s["smoke"]["cases"][0]["golden"], "refused",
        "another prompt: {s:#}"
    );

    // A golden of another output: refused without --force, then it gates (mismatch at 7).
    let other = fx.dir().join("other");
    team_files(&other, &[(&PROMPT_IDS, &MODEL_B_IDS)]);
    let other_arg = other.to_str().unwrap();
    fx.exits(
        &[
            "golden", "import", "fx.yaml", "--case", "small", team_arg, "--row", "1", "--force",
        ],
        0,
    );
    let o = fx.exits(
        &["golden", "import", "fx.yaml", "--case", "small", other_arg],
        2,
    );
    assert!(text(&o).contains("refuses to replace"), "{}", text(&o));
    assert_eq!(ids(&read_json(&recorded)["output_token_ids"]), MODEL_IDS);
    fx.exits(
        &[
            "golden", "import", "fx.yaml", "--case", "small", other_arg, "--force",
        ],
        0,
    );
    let s = smoke(4);
    assert_eq!(s["smoke"]["cases"][0]["golden"], "mismatched", "{s:#}");
    assert_eq!(s["smoke"]["cases"][0]["golden_diff"]["position"], 7);

    // Bad files: exit 2 naming the file and what is wrong; nothing written.
    let before = std::fs::read(&recorded).unwrap();
    numpy(
        &other,
        "import numpy as np; np.save('greedy_ids.npy', np.zeros((1, 16), dtype='<f4'))",
    );
    let o = fx.exits(
        &[
            "golden", "import", "fx.yaml", "--case", "small", other_arg, "--force",
        ],
        2,
    );
    assert!(
        text(&o).contains("greedy_ids.npy: has dtype \"<f4\""),
        "{}",
        text(&o)
    );
    team_files(&other, &[(&PROMPT_IDS, &MODEL_B_IDS)]);
    let p0 = other.join("p0_prompt.i32");
    let mut bytes = std::fs::read(&p0).unwrap();
    bytes.pop();
    std::fs::write(&p0, bytes).unwrap();
    let o = fx.exits(
        &[
            "golden", "import", "fx.yaml", "--case", "small", other_arg, "--force",
        ],
        2,
    );
    assert!(
        text(&o).contains("p0_prompt.i32: holds 35 bytes"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read(&recorded).unwrap(), before);
}

/// A `.npy` file (format 1.0, C order) of little-endian `descr` (`<i4` or
/// `<i8`) with `shape`, as `np.save` writes it: the tests below need no
/// numpy.
fn npy_file(descr: &str, shape: &[usize], data: &[i64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    let shape = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for &v in data {
        match descr {
            "<i4" => out.extend_from_slice(&(v as i32).to_le_bytes()),
            _ => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    out
}

/// A test directory with `fx.yaml` (the default smoke case `small`, T =
/// 16; a repository that need not exist: `golden` reads no source) and the
/// team's files of one prompt in `team/`: `greedy_ids.npy` (`descr`) holding
/// `output` and `p0_prompt.i32` the canonical prompt.
fn team_dir(descr: &str, output: &[i64]) -> Fx {
    let fx = Fx::new();
    fx.recipe("fx", Path::new("/nonexistent"), &"a".repeat(40), SMOKE);
    let team = fx.dir().join("team");
    std::fs::create_dir_all(&team).unwrap();
    std::fs::write(
        team.join("greedy_ids.npy"),
        npy_file(descr, &[1, 16], output),
    )
    .unwrap();
    let prompt: Vec<u8> = PROMPT_IDS
        .iter()
        .flat_map(|&v| (v as i32).to_le_bytes())
        .collect();
    std::fs::write(team.join("p0_prompt.i32"), prompt).unwrap();
    fx
}

/// `golden <args>` in `fx`'s directory, failed when it runs past 60 s.
fn golden(fx: &Fx, args: &[&str]) -> std::process::Output {
    let mut a = vec!["golden"];
    a.extend_from_slice(args);
    output_or_hang(&mut fx.cmd(&a), 60)
}

const IMPORT: &[&str] = &["import", "fx.yaml", "--case", "small", "team"];
const EXPORT: &[&str] = &["export", "fx.yaml", "--case", "small", "--out", "out"];

// A team file or the golden there that is a FIFO, a device or 2 GiB: never
// a hang or GiBs of memory; exit 2 naming the file, nothing written.
#[test]
fn fifos_devices_and_huge_files_are_refused_by_golden_import_and_export_without_hanging() {
    let fx = team_dir("<i4", &MODEL_IDS);
    let team = fx.dir().join("team");
    let recorded = fx.dir().join("goldens/fx/small.json");
    let copy = fx.store().join("goldens/fx/small.json");
    for name in ["greedy_ids.npy", "greedy_dist.npy", "p0_prompt.i32"] {
        let f = team.join(name);
        let kept = std::fs::read(&f).ok();
        let _ = std::fs::remove_file(&f);
        mkfifo(&f);
        let out = golden(&fx, IMPORT);
        assert_eq!(code(&out), 2, "{name}: {}", text(&out));
        assert!(
            text(&out).contains(&format!("team/{name}: is a FIFO, not a regular file")),
            "{}",
            text(&out)
        );
        assert!(!recorded.exists() && !copy.exists(), "{name}");
        std::fs::remove_file(&f).unwrap();
        if let Some(b) = kept {
            std::fs::write(&f, b).unwrap();
        }
    }

    // What is at the golden's path (beside the recipe) when it is not a file
    // to read: import never replaces it, export never reads it whole.
    std::fs::create_dir_all(recorded.parent().unwrap()).unwrap();
    type Maker<'a> = (&'a str, &'a dyn Fn(&Path));
    let makers: [Maker; 3] = [
        ("is a FIFO, not a regular file", &|p| mkfifo(p)),
        ("is a character device, not a regular file", &|p| {
            std::os::unix::fs::symlink("/dev/zero", p).unwrap()
        }),
        ("is larger than 67108864 bytes, the limit", &|p| {
            sparse_file(p, 2 << 30)
        }),
    ];
    for (what, make) in makers {
        make(&recorded);
        for (args, also) in [
            (IMPORT, "import never overwrites what is not a golden"),
            (EXPORT, ""),
        ] {
            for force in [&[][..], &["--force"][..]] {
                if args == EXPORT && !force.is_empty() {
                    continue;
                }
                let out = golden(&fx, &[args, force].concat());
                let t = text(&out);
                assert_eq!(code(&out), 2, "{args:?} {what}: {t}");
                let said = format!("case small: golden {} {what}", recorded.display());
                assert!(t.contains(&said) && t.contains(also), "{t}");
            }
        }
        assert!(!fx.dir().join("out").exists(), "{what}: nothing exported");
        assert!(!copy.exists(), "{what}: nothing imported");
        std::fs::remove_file(&recorded).unwrap();
    }
    // And the files as they should be: imported, then exported.
    let out = golden(&fx, IMPORT);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = golden(&fx, EXPORT);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

#[test]
fn golden_export_out_must_be_a_directory() {
    let fx = team_dir("<i4", &MODEL_IDS);
    let out = golden(&fx, IMPORT);
    assert_eq!(code(&out), 0, "{}", text(&out));
    std::fs::write(fx.dir().join("afile"), "").unwrap();
    for (dir, what) in [
        ("afile", "--out afile: is a regular file, not a directory"),
        (
            "/dev/null",
            "--out /dev/null: is a character device, not a directory",
        ),
        (
            "afile/sub",
            "--out afile/sub: afile is a regular file, not a directory, so it cannot be made",
        ),
    ] {
        let out = golden(&fx, &["export", "fx.yaml", "--case", "small", "--out", dir]);
        let t = text(&out);
        assert_eq!(code(&out), 2, "{dir}: {t}");
        assert!(
            t.contains(what) && t.contains("nothing was exported"),
            "{t}"
        );
    }
    assert_eq!(std::fs::read(fx.dir().join("afile")).unwrap(), b"");
    // A directory there, or none yet (made): exported.
    for dir in ["team", "new/out"] {
        let out = golden(&fx, &["export", "fx.yaml", "--case", "small", "--out", dir]);
        assert_eq!(code(&out), 0, "{dir}: {}", text(&out));
        assert!(fx.dir().join(dir).join("small.json").is_file(), "{dir}");
    }
}

// Token ids are int32 in the team's files and in what `export` writes: an
// int64 array holding one outside int32 is refused on import, not later.
#[test]
fn golden_import_refuses_token_ids_outside_int32() {
    let mut big = MODEL_IDS;
    big[3] = 1 << 40;
    let fx = team_dir("<i8", &big);
    let recorded = fx.dir().join("goldens/fx/small.json");
    let out = golden(&fx, IMPORT);
    let t = text(&out);
    assert_eq!(code(&out), 2, "{t}");
    assert!(
        t.contains(
            "team/greedy_ids.npy row 0 holds 1099511627776 at output position 3, outside int32"
        ),
        "{t}"
    );
    assert!(!recorded.exists());
    // In greedy_dist.npy (run 2), beside an int64 greedy_ids.npy in range.
    let team = fx.dir().join("team");
    std::fs::write(
        team.join("greedy_ids.npy"),
        npy_file("<i8", &[1, 16], &MODEL_IDS),
    )
    .unwrap();
    let mut dist: Vec<i64> = MODEL_IDS.iter().flat_map(|&v| [v, v, v]).collect();
    dist[5 * 3 + 2] = -(1 << 33);
    std::fs::write(
        team.join("greedy_dist.npy"),
        npy_file("<i8", &[1, 16, 3], &dist),
    )
    .unwrap();
    let out = golden(&fx, IMPORT);
    let t = text(&out);
    assert_eq!(code(&out), 2, "{t}");
    assert!(
        t.contains(
            "team/greedy_dist.npy row 0 run 2 holds -8589934592 at output position 5, outside int32"
        ),
        "{t}"
    );
    assert!(!recorded.exists());
    // int64 arrays of int32 ids: imported, and export writes them back.
    std::fs::remove_file(team.join("greedy_dist.npy")).unwrap();
    let out = golden(&fx, IMPORT);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = golden(&fx, EXPORT);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(
        std::fs::read(fx.dir().join("out/greedy_ids.npy")).unwrap(),
        npy_file("<i4", &[1, 16], &MODEL_IDS)
    );
}
