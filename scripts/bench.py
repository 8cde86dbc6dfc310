#!/usr/bin/env python3
"""Benchmarks of oracle-build where users wait, against what they would do otherwise.

Usage (from the repository root):  scripts/bench [--runs N] [--quick] [--work DIR] [--out BENCHMARKS.md]
                                                  [--rows all|cache|team-cache] [--binary PATH]

--quick: one run of each (no-op: 3), and no second-pin and footprint rows.
--rows cache: only the first build and the cache rows (5), replaced in --out
              in place; the other rows stay, marked as from the earlier run.
--rows team-cache: only the team compiler cache rows (8 below); the table is
printed, and written only to an --out given explicitly.
--binary: use this oracle-build instead of building target/release/oracle-build.

Builds its own inputs (the release binary, a git repository of the test
fixture, a realistic dependency set from PyPI, a large generated git
repository), then measures, as medians over several runs:

1. restore    an oracle venv (fixture + numpy, scipy, pandas, pyarrow) deleted
              and rebuilt from the store, against `pip install` from a local
              wheel directory and `uv pip install` from a warm uv cache, each
              into a fresh venv;
2. no-op      `oracle-build <PIN>` when the oracle exists and is intact;
3. second pin fetching a second commit of a large repository into the store
              when its mirror exists, against git's incremental path (`git
              fetch` into an existing clone + `git worktree add`, runs
              alternating with ours) and a fresh full `git clone`;
4. footprint  disk used by two oracles sharing their dependencies, against one;
5. cache      `push` to a local registry (Debian's docker-registry, started on
              127.0.0.1 with its own config), then `pull` + `build --offline`
              into an empty store, against building from source (the first
              build) and against copying the same blobs with a plain HTTP
              client (urllib). Skipped when /usr/bin/docker-registry is absent.
6. compiler   the wheel stage of a C/C++-heavy fixture (CMake + Ninja, ccache
   cache     as the launcher): cold cache against a rebuild after the wheel and
              venv entries are wiped (the cache in the store kept);
7. no-op      at 10k, 50k and 100k files: fixture oracles with generated
   growth    modules (.py and their .pyc), so the no-op's growth is visible.
8. team       the same C/C++-heavy fixture with a team compiler cache
   compiler  (`[compiler_cache] remote`, a redis-server started on 127.0.0.1
   cache     with its own config): store A's cold build, store B (another
              path) building the same pin from the shared cache, and store B
              building the next pin where one C++ file changed. Skipped when
              ccache or redis-server is absent.

It prints a Markdown table and writes it to --out. Timings are wall clock on
this machine; the ratios are what the goals are about.
"""
import argparse
import datetime
import json
import os
import platform
import random
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixture"
# Real wheels from PyPI with cp311 manylinux builds: ~400 MB installed, thousands of files.
HEAVY = {"numpy": "2.1.3", "scipy": "1.14.1", "pandas": "2.2.3", "pyarrow": "18.1.0"}
PYTHON = "3.11"


def sh(*args, env=None, cwd=None, check=True, capture=True):
    res = subprocess.run([str(a) for a in args], env=env, cwd=cwd, text=True,
                         stdout=subprocess.PIPE if capture else None,
                         stderr=subprocess.PIPE if capture else None)
    if check and res.returncode != 0:
        sys.exit(f"command failed ({res.returncode}): {' '.join(map(str, args))}\n{res.stdout}\n{res.stderr}")
    return res


def timed(fn, runs, setup=None):
    """Median wall seconds of `runs` calls of fn; `setup` runs before each, untimed."""
    times = []
    for _ in range(runs):
        if setup:
            setup()
        os.sync()  # flush the setup's deletions so they do not slow the timed part
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def force_rmtree(path):
    def onerror(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o755)
        os.chmod(p, stat.S_IWRITE | stat.S_IREAD | stat.S_IEXEC)
        func(p)
    if os.path.lexists(path):
        for d, dirs, files in os.walk(path):
            os.chmod(d, 0o755)
        shutil.rmtree(path, onerror=onerror)


def disk_bytes(*paths):
    """Bytes used by the files under paths, each inode counted once (like du)."""
    seen = set()
    total = 0
    for top in paths:
        for d, _dirs, files in os.walk(top):
            for f in files:
                st = os.lstat(os.path.join(d, f))
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def git(repo, *args):
    return sh("git", "-c", "user.email=b@example.com", "-c", "user.name=bench", "-c", "init.defaultBranch=main",
              *args, cwd=repo).stdout.strip()


def real_python():
    """The real path of the bench's Python (`python3.11` on PATH, else this one)."""
    found = shutil.which(f"python{PYTHON}") or sys.executable
    return sh(found, "-c", "import sys; print(sys.executable)").stdout.strip()


DEMO_TO_FIXTURE = [("demollm", "fixturellm"), ("DEMOLLM", "FIXTURELLM"), ("demo-bigram", "fixture-bigram")]


def write_fixture_pkg(dst):
    """The fixture package as tests/it/support.rs writes it: the demo package
    (demo/pkg) renamed to fixturellm (README and requirements left out),
    then tests/fixture/pkg over it."""
    def renamed(s):
        for a, b in DEMO_TO_FIXTURE:
            s = s.replace(a, b)
        return s

    def copy(src, to, top=False):
        to.mkdir(parents=True, exist_ok=True)
        for e in sorted(src.iterdir()):
            if top and e.name in ("README.md", "requirements"):
                continue
            t = to / renamed(e.name)
            if e.is_dir():
                copy(e, t)
            else:
                t.write_text(renamed(e.read_text()))
    copy(ROOT / "demo" / "pkg", dst, top=True)
    shutil.copytree(FIXTURE / "pkg", dst, dirs_exist_ok=True)


def fixture_repo(work):
    repo = work / "fixture-repo"
    write_fixture_pkg(repo)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "fixture")
    git(repo, "tag", "v0.1.0")
    commits = []
    for i in range(2):
        (repo / f"NOTES{i}.md").write_text(f"commit {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"commit {i}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    return repo, commits


def recipe(work, name, repo, commit):
    pins = "".join(f"  {k}: {v}\n" for k, v in HEAVY.items())
    path = work / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nsource:\n  repo: file://{repo}\n  commit: {commit}\n  package: fixturellm\n"
        f"python: \"{PYTHON}\"\npins:\n{pins}build:\n  target_device: cpu\n"
        "smoke:\n  runs: 1\n  cases:\n    - name: small\n"
        f"      model: {FIXTURE}/model\n      prompt: \"The capital of France is Paris, and the\"\n"
        "      max_tokens: 16\n      engine_args: {max_model_len: 256, max_num_seqs: 1}\n")
    return path


def big_repo(work, commits=3000, blob_bytes=36_000):
    """A repository of `commits` commits of incompressible data (>= 100 MB), via git fast-import."""
    repo = work / "big-repo"
    repo.mkdir()
    git(repo, "init", "-q")
    rng = random.Random(1)
    proc = subprocess.Popen(["git", "fast-import", "--quiet"], cwd=repo, stdin=subprocess.PIPE)
    w = proc.stdin.write
    for i in range(commits):
        data = rng.randbytes(blob_bytes)
        msg = f"commit {i}\n".encode()
        w(b"commit refs/heads/main\n")
        w(f"committer bench <b@example.com> {1700000000 + i * 60} +0000\n".encode())
        w(f"data {len(msg)}\n".encode() + msg)
        w(f"M 644 inline data/{i // 100}/{i}.bin\n".encode())
        w(f"data {len(data)}\n".encode() + data + b"\n")
    proc.stdin.close()
    if proc.wait() != 0:
        sys.exit("git fast-import failed")
    git(repo, "checkout", "-q", "main")
    return repo


# Real packages (with their dependencies, 40+ artifacts) for the wheelhouse-fill row.
FILL = ["numpy", "pandas", "pyarrow", "scipy", "requests", "rich", "pydantic", "jinja2", "click", "httpx",
        "sqlalchemy", "pyyaml", "aiohttp", "fastapi", "uvicorn", "pillow", "networkx", "sympy", "tqdm", "attrs",
        "jsonschema"]


def wheelhouse_fill(work, binary, env, runs):
    """Rows: the wheelhouse fill of a cold store, against uv's own cold-cache download of the same artifacts.

    The set: the fixture's build and runtime locks with FILL added to its requirements (resolved once by
    `oracle-build lock`, untimed), every artifact from PyPI. The fill is timed by the binary itself (its
    `==> wheelhouse: downloaded N artifacts, X MiB in T s` line: parallel download, sha256 check and persist of
    every entry; process start, source, wheel and venv stages excluded) in a fresh store each run. The anchor is
    `uv pip install --no-deps --target <empty dir> --cache-dir <empty dir> -r <list>`, once per lock, where the
    list names every locked artifact by URL with its sha256: uv downloads them in parallel into its cold cache,
    checks the hashes, and also unpacks each wheel into the target (more work than the fill), wall clock.
    """
    import re
    import tomllib
    repo = work / "fill-repo"
    shutil.copytree(FIXTURE / "pkg", repo)
    with open(repo / "requirements" / "common.txt", "a") as f:
        f.write("".join(f"{p}\n" for p in FILL))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "fixture + fill set")
    git(repo, "tag", "v0.1.0")
    rec = work / "fill.yaml"
    rec.write_text(f"name: fill\nsource:\n  repo: file://{repo}\n  commit: {git(repo, 'rev-parse', 'HEAD')}\n"
                   f"  package: fixturellm\npython: \"{PYTHON}\"\nbuild:\n  target_device: cpu\n")
    locks = work / "fill-lockfiles"
    store = work / "fill-store"
    sh(binary, "lock", rec, "--lockfiles", locks, "--store", work / "fill-lock-store", env=env)

    def fill():
        res = sh(binary, "build", rec, "--no-smoke", "--lockfiles", locks, "--store", store, env=env, check=False)
        assert res.returncode in (0, 4), res.stderr
        got = re.findall(r"wheelhouse: downloaded (\d+) artifacts?, ([\d.]+) MiB in ([\d.]+) s", res.stderr)
        assert got, res.stderr
        return sum(int(n) for n, _, _ in got), sum(float(m) for _, m, _ in got), sum(float(t) for _, _, t in got)

    fills = []
    for _ in range(runs):
        force_rmtree(store)
        os.sync()
        fills.append(fill())
    count, mib = fills[0][0], fills[0][1]
    fill_s = statistics.median(t for _, _, t in fills)

    uv = work / "tools" / "uv-0.13.9" / "bin" / "uv"
    py = shutil.which(f"python{PYTHON}") or sys.executable
    # A package may lock several wheels (e.g. a binary and a pure one), all of which the fill keeps: list k
    # holds the k-th artifact of each package, so uv is run once per (lock, k) and downloads each of them.
    lists = []
    for lock in sorted(locks.glob("*/pylock.*.toml")):
        rounds = []
        for p in tomllib.loads(lock.read_text()).get("packages", []):
            for k, a in enumerate(p.get("wheels") or [p["sdist"]]):
                if k == len(rounds):
                    rounds.append([])
                rounds[k].append(f"{p['name']} @ {a['url']} --hash=sha256:{a['hashes']['sha256']}\n")
        for k, lines in enumerate(rounds):
            lists.append(work / f"fill-{lock.stem}-{k}.txt")
            lists[-1].write_text("".join(lines))

    def uv_fill(cold=True):
        for d in ("fill-uv-cache", "fill-uv-target") if cold else ("fill-uv-target",):
            force_rmtree(work / d)
        os.sync()
        t0 = time.perf_counter()
        for reqs in lists:
            sh(uv, "pip", "install", "-q", "--no-deps", "--python", py, "--target", work / "fill-uv-target" / reqs.stem,
               "--cache-dir", work / "fill-uv-cache", "-r", reqs, env=env)
        return time.perf_counter() - t0

    uv_s = statistics.median(uv_fill() for _ in range(runs))
    # The same with the cache warm: what uv spends besides downloading. Cold minus warm is the stricter
    # anchor (uv's download, hash check and unpacking into its cache), and the goal is judged on it.
    uv_warm = statistics.median(uv_fill(cold=False) for _ in range(runs))
    strict = fill_s / max(uv_s - uv_warm, 1e-3)
    return [
        ("wheelhouse fill: cold store, parallel downloads from PyPI, hashes checked",
         f"{count} artifacts, {mib:.0f} MiB", fill_s,
         f"{fill_s / uv_s:.2f}x uv cold; {strict:.2f}x uv cold minus warm "
         f"(goal <= 1.2x: {'met' if strict <= 1.2 else 'missed'})"),
        ("uv pip install --no-deps --target, cold cache, same artifacts by URL and hash", "same set", uv_s,
         "baseline (also unpacks every wheel)"),
        ("the same, warm uv cache (no download)", "same set", uv_warm, "baseline"),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--quick", action="store_true", help="one run each; skip the second-pin and footprint rows")
    ap.add_argument("--rows", choices=["all", "cache", "team-cache"], default="all",
                    help="cache: only the cache rows, merged into --out (the other rows kept); "
                         "team-cache: only the team compiler cache rows")
    ap.add_argument("--binary", type=Path, help="the oracle-build to measure (default: build the release one)")
    args = ap.parse_args()
    out_given = any(a == "--out" or a.startswith("--out=") for a in sys.argv[1:])
    if args.quick:
        args.runs = 1
    work = args.work or Path(tempfile.mkdtemp(prefix="oracle-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir {work}", file=sys.stderr)

    if args.binary:
        binary = args.binary.resolve()
    else:
        sh("cargo", "build", "--release", "--locked", cwd=ROOT, capture=False)
        binary = ROOT / "target" / "release" / "oracle-build"
    env = dict(os.environ, ORACLE_BUILD_TOOLS=str(work / "tools"))
    env.pop("ORACLE_BUILD_HOME", None)
    # The interpreter itself, not a version manager's shim (pyenv's bash
    # shims take 0.1-1 s per call, which the toolchain probe would time).
    env.setdefault("ORACLE_BUILD_PYTHON", real_python())
    store = work / "store"
    if args.rows == "team-cache":
        rows = team_cache_rows(binary, env, work)
        if not out_given:
            args.out = None
        return finish(args, rows, None)

    def ob(*a, check=True):
        return sh(binary, *a, "--store", store, env=env, check=check)

    repo, (c1, c2) = fixture_repo(work)
    r1 = recipe(work, "bench-a", repo, c1)
    r2 = recipe(work, "bench-b", repo, c2)
    rows = []

    # Lock the bench recipes (hash-pinned; restores then run --offline), then
    # the first build (downloads, builds the wheel): reported for context.
    ob("lock", r1)
    ob("lock", r2)
    t0 = time.perf_counter()
    first = json.loads(ob("build", r1, "--json").stdout)
    first_s = time.perf_counter() - t0
    venv = Path(first["oracle"])
    if args.rows == "cache":
        rows = cache_rows(work, binary, env, store, r1, first, first_s, args.runs)
        return merge(args, rows, first_s)
    venv_files = sum(len(f) for _d, _s, f in os.walk(venv))
    venv_bytes = disk_bytes(venv)
    print(f"oracle: {venv_files} files, {venv_bytes / 2**20:.0f} MiB", file=sys.stderr)

    # 1. Restore: delete the venv entry, rebuild from the store.
    def restore(extra=()):
        # --no-smoke builds exit 4 (built, not gateable): the run still counts.
        res = ob("build", r1, "--offline", "--json", *extra, check=not extra)
        assert res.returncode in (0, 4), res.stderr
        out = json.loads(res.stdout)
        assert out["built"] and "venv" in out["built"], out
    delete_venv = lambda: force_rmtree(venv)
    restore_s, _ = timed(restore, args.runs, delete_venv)
    restore_ns, _ = timed(lambda: restore(("--no-smoke",)), args.runs, delete_venv)
    # Where a restore's time goes: oracle.json's timings of the last (--no-smoke) one.
    timings = json.loads((venv / "oracle.json").read_text()).get("timings", {})

    uv = work / "tools" / "uv-0.13.9" / "bin" / "uv"
    py = shutil.which(f"python{PYTHON}") or sys.executable
    wheel = next((store / "store" / "wheels").glob("*/*.whl"))
    specs = [f"{k}=={v}" for k, v in HEAVY.items()] + ["packaging", "idna"]  # + the fixture's own requirements/common.txt
    wheeldir = work / "wheeldir"
    sh(py, "-m", "pip", "download", "-q", "-d", wheeldir, *specs)
    shutil.copy(wheel, wheeldir)
    uv_cache = work / "uv-cache"
    uv_env = dict(env, UV_CACHE_DIR=str(uv_cache))

    def pip_install():
        target = work / "pip-venv"
        sh(py, "-m", "venv", target)
        sh(target / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--find-links", wheeldir,
           "--disable-pip-version-check", *specs, wheel)

    def uv_install(*extra):
        target = work / "uv-venv"
        sh(uv, "venv", "-q", "--python", py, target, env=uv_env)
        sh(uv, "pip", "install", "-q", "--python", target / "bin" / "python", *extra, *specs, wheel, env=uv_env)

    uv_install()  # warm the uv cache
    force_rmtree(work / "uv-venv")
    pip_s, _ = timed(pip_install, args.runs, lambda: force_rmtree(work / "pip-venv"))
    uv_s, _ = timed(uv_install, args.runs, lambda: force_rmtree(work / "uv-venv"))
    uvc_s, _ = timed(lambda: uv_install("--compile-bytecode"), args.runs, lambda: force_rmtree(work / "uv-venv"))
    rows.append(("restore: oracle venv deleted, rebuilt from the store, --offline (with smoke)",
                 f"{venv_files} files, {venv_bytes / 2**20:.0f} MiB", restore_s,
                 f"{pip_s / restore_s:.2f}x faster than pip; {uvc_s / restore_s:.2f}x uv --compile-bytecode; {uv_s / restore_s:.2f}x plain uv"))
    rows.append(("restore without smoke (`--no-smoke`)", "same", restore_ns,
                 f"{pip_s / restore_ns:.2f}x faster than pip; {uvc_s / restore_ns:.2f}x uv --compile-bytecode; {uv_s / restore_ns:.2f}x plain uv"))
    split = ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in timings.items())
    rows.append(("restore split (last `--no-smoke` restore, from oracle.json)", "same", None,
                 f"{split}; rest (process start, planning, persist): "
                 f"{max(restore_ns - sum(timings.values()), 0):.2f} s"))
    rows.append(("pip install from a local wheel dir, fresh venv (pip compiles bytecode)", "same set", pip_s, "baseline"))
    rows.append(("uv pip install --compile-bytecode, warm uv cache, fresh venv", "same set", uvc_s, "baseline (same work as the oracle's install)"))
    rows.append(("uv pip install, warm uv cache, fresh venv (no bytecode)", "same set", uv_s, "baseline"))

    # 2. No-op.
    noop_s, _ = timed(lambda: ob("build", r1, "--offline"), 3 if args.quick else max(args.runs, 10))
    rows.append(("no-op: `oracle-build <PIN> --offline`, oracle intact", "goal < 0.3 s", noop_s,
                 "met" if noop_s < 0.3 else "missed"))

    rows.extend(wheelhouse_fill(work, binary, env, args.runs))

    # 5. The cache: pull + offline build against building from source.
    rows.extend(cache_rows(work, binary, env, store, r1, first, first_s, args.runs))

    if args.quick:
        return finish(args, rows, first_s)

    # 3. Second pin of a large repository.
    rows.extend(second_pin_rows(binary, env, work, args.runs))

    # 4. Footprint of two oracles sharing their dependencies.
    other = json.loads(ob("build", r2, "--json").stdout)
    one = disk_bytes(Path(first["oracle"]))
    both = disk_bytes(Path(first["oracle"]), Path(other["oracle"]))
    ratio = both / one
    rows.append(("footprint: two oracles sharing dependencies", f"one oracle {one / 2**20:.0f} MiB",
                 None, f"{ratio:.2f}x one oracle (goal <= 1.2x: {'met' if ratio <= 1.2 else 'missed'})"))

    # 6. Compiler cache; 7. no-op growth.
    # One cold/warm pair: a cold build of the 49 TUs takes minutes on 2 CPUs.
    rows.extend(compiler_cache_rows(binary, env, work, 1))
    rows.extend(noop_growth_rows(binary, env, work, max(args.runs, 10)))

    return finish(args, rows, first_s)


def cache_rows(work, binary, env, store, r1, first, first_s, runs):
    """Row 5 (see the module docs); [] without docker-registry."""
    server = Path("/usr/bin/docker-registry")
    if not server.exists():
        print("no /usr/bin/docker-registry: skipping the cache rows", file=sys.stderr)
        return []
    import socket
    import urllib.request
    reg = work / "registry"
    force_rmtree(reg)
    reg.mkdir(parents=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (reg / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {reg / 'storage'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen([server, "serve", reg / "config.yml"], stdout=subprocess.DEVNULL,
                            stderr=open(reg / "registry.log", "w"))
    try:
        for _ in range(400):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        url = f"oci+http://127.0.0.1:{port}/bench/oracles"
        key = work / "bench-key"
        if not key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench@local", "-f", key)
        pub = (work / "bench-key.pub").read_text().split()
        allowed = work / "bench-allowed"
        allowed.write_text(f"bench@local {pub[0]} {pub[1]}\n")
        cenv = dict(env, ORACLE_BUILD_BUILDER="bench@local", XDG_CONFIG_HOME=str(work / "xdg"))
        cfg = store / "config.toml"
        cfg.write_text(f'[[cache]]\nname = "bench"\nurl = "{url}"\nsigning_key = "{key}"\n')
        try:
            sh(binary, "push", r1, "--store", store, env=cenv)
        finally:
            cfg.unlink()
        # Fair to both sides, as the second-pin rows are: nothing is deleted
        # while they are measured (each run pulls into a new store and copies
        # into a new directory, all removed at the end), and the runs
        # alternate. This machine's ext4 has no journal, and there creating a
        # file right after thousands were deleted scans past every recently
        # freed inode: deleting the last run's store (11,000 files) before
        # each pull made its ~11,000 file creations several times slower,
        # which a second box, whose store is new, never sees.
        runs_dir = work / "cache-runs"
        force_rmtree(runs_dir)
        runs_dir.mkdir()
        # The repository's layer and config blobs (its _layers links; manifests
        # are stored as blobs too but are not served by /blobs/).
        v2 = reg / "storage/docker/registry/v2"
        digests = sorted(l.parent.name for l in (v2 / "repositories/bench/oracles/_layers/sha256").glob("*/link"))
        blobs = [v2 / "blobs/sha256" / d[:2] / d / "data" for d in digests]
        total = sum(b.stat().st_size for b in blobs)

        def pull_and_build(i):
            pulled = runs_dir / f"store-{i}"
            pulled.mkdir()
            (pulled / "config.toml").write_text(
                f'[[cache]]\nname = "bench"\nurl = "{url}"\ntrusted_signers = "{allowed}"\n')
            os.sync()
            t0 = time.perf_counter()
            sh(binary, "pull", r1, "--store", pulled, env=cenv)
            pulled_s = time.perf_counter() - t0
            out = json.loads(sh(binary, "build", r1, "--offline", "--json", "--store", pulled, env=cenv).stdout)
            assert "wheel" not in out["built"] and out["key"] == first["key"], out
            return time.perf_counter() - t0, pulled_s

        def plain_copy(i):
            dest = runs_dir / f"plain-copy-{i}"
            dest.mkdir()
            os.sync()
            t0 = time.perf_counter()
            for d in digests:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/bench/oracles/blobs/sha256:{d}") as r, \
                        open(dest / d, "wb") as f:
                    shutil.copyfileobj(r, f, 1 << 20)
            return time.perf_counter() - t0

        ours, pulls, copies = [], [], []
        for i in range(runs):
            # Alternate which side goes first, so neither always follows the other's writes.
            if i % 2 == 0:
                both, p = pull_and_build(i)
                copies.append(plain_copy(i))
            else:
                copies.append(plain_copy(i))
                both, p = pull_and_build(i)
            ours.append(both)
            pulls.append(p)
        if os.environ.get("BENCH_DEBUG"):
            print("cache runs (pull + build, pull, copy)", ours, pulls, copies, file=sys.stderr)
        force_rmtree(runs_dir)
        both_s, pull_s, copy_s = statistics.median(ours), statistics.median(pulls), statistics.median(copies)
        on = f"{len(blobs)} blobs, {total / 2**20:.0f} MiB"
        # Each run's own pair too: on a VM the copy's time swings with the
        # memory the kernel hands out (see BENCHMARKS.md), and so does the ratio.
        pairs = ", ".join(f"{o:.2f}/{c:.2f} s" for o, c in zip(ours, copies))
        return [
            ("cache: `pull` + `build --offline` into an empty store (no wheel built; venv, identity, smoke here)", on,
             both_s, f"{first_s / both_s:.2f}x faster than building from source (the first build); "
                     f"{both_s / copy_s:.1f}x the time of a plain HTTP copy of the same bytes "
                     f"(goal <= 3x: {'met' if both_s <= 3 * copy_s else 'missed'}; each run, ours/copy: {pairs})"),
            ("cache: `pull` alone (median of the same runs; every blob and entry checked)", on, pull_s,
             f"{pull_s / copy_s:.2f}x the time of a plain HTTP copy of the same bytes"),
            ("plain HTTP GET of every blob of the registry (urllib), no checks", on, copy_s, "baseline"),
        ]
    finally:
        proc.kill()
        proc.wait()


def second_pin_rows(binary, env, work, runs):
    """Second pin: `oracle-build fetch` of a commit 50 commits past the one the
    mirror holds, against git's own incremental path (an existing clone:
    `git fetch` of the new commits, then `git worktree add` of the commit in a
    fresh directory) and against a fresh full clone. The source repository's
    `main` is at the old commit while the mirror and the clone are made, then
    moved to the new one, so both sides fetch the same 50 commits.

    Fair to both sides: nothing is deleted while they are measured. Each run
    gets its own copy of the git directory it fetches into (the store with
    only its mirror, the user clone's `.git`: a few pack files) and its own
    new checkout directory, and the runs alternate, each side going first
    every other time.
    (Deleting a few thousand files makes ext4 skip the recently freed inodes
    when it creates new ones, which slowed the next checkout up to tenfold
    here and made the ratio swing from 1.1x to 2.7x between runs.)"""
    big = big_repo(work)
    size = disk_bytes(big / ".git")
    head = git(big, "rev-parse", "HEAD")
    old = git(big, "rev-parse", "HEAD~50")
    src = work / "big-src.git"
    sh("git", "clone", "-q", "--bare", "--no-local", big, src)
    ra = work / "big-a.yaml"
    rb = work / "big-b.yaml"
    for path, commit in ((ra, old), (rb, head)):
        path.write_text(f"name: {path.stem}\nsource:\n  repo: file://{src}\n  commit: {commit}\npython: \"3.11\"\n"
                        "build:\n  target_device: cpu\n")
    at = lambda c: sh("git", "-C", src, "update-ref", "refs/heads/main", c)
    at(old)
    pristine_store = work / "big-store-pristine"
    sh(binary, "fetch", ra, "--store", pristine_store, env=env)
    force_rmtree(pristine_store / "store/src" / old)
    pristine_clone = work / "big-user-clone-pristine"
    sh("git", "clone", "-q", "--no-local", "--no-checkout", f"file://{src}", pristine_clone)
    at(head)
    runs_dir = work / "big-runs"
    runs_dir.mkdir()

    def second_pin(i):
        store = runs_dir / f"store-{i}"
        shutil.copytree(pristine_store, store, symlinks=True)
        os.sync()
        t0 = time.perf_counter()
        sh(binary, "fetch", rb, "--store", store, env=env)
        return time.perf_counter() - t0

    def git_incremental(i):
        clone = runs_dir / f"clone-{i}"
        shutil.copytree(pristine_clone, clone, symlinks=True)
        os.sync()
        t0 = time.perf_counter()
        sh("git", "-C", clone, "fetch", "-q", "origin")
        sh("git", "-C", clone, "worktree", "add", "-q", "--detach", runs_dir / f"tree-{i}", head)
        return time.perf_counter() - t0

    def full_clone(i):
        target = runs_dir / f"full-clone-{i}"
        os.sync()
        t0 = time.perf_counter()
        sh("git", "clone", "-q", "--no-local", f"file://{src}", target)
        sh("git", "-C", target, "checkout", "-q", head)
        return time.perf_counter() - t0

    ours, theirs = [], []
    for i in range(runs):
        # Alternate which side goes first, so neither always follows the other's writes.
        if i % 2 == 0:
            ours.append(second_pin(i))
            theirs.append(git_incremental(i))
        else:
            theirs.append(git_incremental(i))
            ours.append(second_pin(i))
    clones = [full_clone(i) for i in range(runs)]
    if os.environ.get("BENCH_DEBUG"):
        print("second pin runs", ours, theirs, clones, file=sys.stderr)
    force_rmtree(runs_dir)
    second, incr, clone = statistics.median(ours), statistics.median(theirs), statistics.median(clones)
    ratio = second / incr
    return [
        ("second pin: `oracle-build fetch` of a commit 50 past the mirror's (fetch + checkout)",
         f"3000 commits, {size / 2**20:.0f} MiB", second,
         f"{ratio:.2f}x git's incremental path (goal <= 1.2x: {'met' if ratio <= 1.2 else 'missed'}); "
         f"{clone / second:.2f}x faster than a full clone"),
        ("git's incremental path: `git fetch` into an existing clone + `git worktree add` of the commit",
         "same repo, same 50 commits", incr, "baseline"),
        ("fresh full `git clone` + checkout of the same commit", "same repo", clone, "baseline"),
    ]


# C++ translation units of the compiler cache bench: each includes and
# instantiates enough of the standard library to take a compiler a moment.
HEAVY_TU = """#include <algorithm>
#include <map>
#include <string>
#include <vector>
namespace k{i} {{
template <typename T> T fold(const std::vector<T>& v) {{ T s{{}}; for (auto& x : v) s = s + x; return s; }}
}}
extern "C" int fx_gen_{i}(int x) {{
  std::map<std::string, std::vector<int>> m;
  m[std::to_string(x)].push_back(x * {i});
  std::vector<std::string> w{{"a", "b", std::to_string({i})}};
  std::sort(w.begin(), w.end());
  return static_cast<int>(w.size()) + k{i}::fold(m.begin()->second);
}}
"""


def compiler_cache_rows(binary, env, work, runs, tus=48):
    """The wheel stage (build.json `duration_s`) of the fixture with the
    C/C++-heavy CMake overlay and `tus` C++ translation units: with the
    store's compiler cache emptied, against a rebuild after the wheel and
    venv entries are wiped (the cache kept). A first build, untimed, fills
    uv's cache with the build requirements (cmake, ninja) for both."""
    if not shutil.which("ccache"):
        return [("compiler cache: wheel stage rebuild", "", None, "skipped: ccache is not on PATH")]
    repo, commit = heavy_repo(work, tus)
    path = heavy_recipe(work, "heavy", repo, commit)
    store = work / "heavy-store"

    def build():
        res = sh(binary, "build", path, "--no-smoke", "--json", "--store", store, env=env, check=False)
        assert res.returncode == 4, res.stdout + res.stderr  # built, not smoked
        wheel = next((store / "store" / "wheels").iterdir())
        return json.loads((wheel / "build.json").read_text())

    def wipe(cache=False):
        for b in ("venvs", "wheels"):
            for e in (store / "store" / b).iterdir():
                force_rmtree(e)
        if cache:
            force_rmtree(store / "ccache")

    build()
    cold, warm = [], []
    for _ in range(runs):
        wipe(cache=True)
        cold.append(build())
        wipe()
        warm.append(build())
    cold_s = statistics.median(r["duration_s"] for r in cold)
    warm_s = statistics.median(r["duration_s"] for r in warm)
    c, w = cold[-1]["compiler_cache_stats"], warm[-1]["compiler_cache_stats"]
    ratio = warm_s / cold_s
    return [
        (f"compiler cache: wheel stage, cold cache ({tus + 1} C/C++ TUs through CMake + Ninja + ccache)",
         f"{c['hits']} hits, {c['misses']} misses", cold_s, "baseline"),
        ("compiler cache: wheel stage rebuilt after wiping the wheel and venv entries (cache kept)",
         f"{w['hits']} hits, {w['misses']} misses", warm_s,
         f"{ratio:.2f}x the cold build (goal <= 0.25x: {'met' if ratio <= 0.25 else 'missed'})"),
    ]


def heavy_repo(work, tus, name="heavy-repo"):
    """The fixture with the C/C++-heavy CMake overlay and `tus` generated C++
    translation units, committed and tagged: (path, commit)."""
    repo = work / name
    shutil.copytree(FIXTURE / "pkg", repo)
    shutil.copytree(FIXTURE / "cmake-heavy", repo, dirs_exist_ok=True)
    (repo / "csrc" / "gen").mkdir(parents=True)
    for i in range(tus):
        (repo / "csrc" / "gen" / f"k{i:02}.cpp").write_text(HEAVY_TU.format(i=i))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "heavy")
    git(repo, "tag", "v0.1.0")
    return repo, git(repo, "rev-parse", "HEAD")


def heavy_recipe(work, name, repo, commit):
    path = work / f"{name}.yaml"
    path.write_text(f"name: {name}\nsource:\n  repo: file://{repo}\n  commit: {commit}\n  package: fixturellm\n"
                    f"python: \"{PYTHON}\"\nbuild:\n  target_device: cpu\n")
    return path


class Redis:
    """A redis-server on 127.0.0.1 with its own config in `dir` (a free port,
    no persistence), stopped by its pid."""

    def __init__(self, dir):
        import socket
        dir.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        conf = dir / "redis.conf"
        conf.write_text(f"bind 127.0.0.1\nport {self.port}\nsave \"\"\nappendonly no\ndaemonize no\n"
                        f"dir {dir}\nlogfile {dir / 'redis.log'}\n")
        self.proc = subprocess.Popen(["redis-server", str(conf)], stdout=subprocess.DEVNULL)
        for _ in range(400):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    sys.exit(f"redis-server exited {self.proc.returncode}")
                time.sleep(0.025)
        self.stop()
        sys.exit("redis-server did not listen")

    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def team_cache_rows(binary, env, work, tus=48):
    """The wheel stage (build.json `duration_s`) of the C/C++-heavy fixture
    with a team compiler cache (a redis-server on 127.0.0.1): store A cold
    (its own and the team cache empty), store B at another path building
    the same pin from the team cache, and store B building the next pin,
    where one C++ file changed. Each store first builds once untimed (A
    without the team cache, B from it), then its wheel and venv entries and
    its local compiler cache are wiped, so every timed build has warm uv
    and wheelhouse entries and differs only in what the compiler cache
    holds."""
    if not shutil.which("ccache") or not shutil.which("redis-server"):
        return [("team compiler cache", "", None, "skipped: ccache or redis-server is not on PATH")]
    repo, c1 = heavy_repo(work, tus, "team-repo")
    tu = repo / "csrc" / "gen" / "k07.cpp"
    tu.write_text(tu.read_text() + "extern \"C\" int fx_gen_7b(int x) { return x + 7; }\n")
    git(repo, "commit", "-qam", "k07: one more function")
    c2 = git(repo, "rev-parse", "HEAD")
    r1 = heavy_recipe(work, "team", repo, c1)
    r2 = heavy_recipe(work, "team-next", repo, c2)
    a, b = work / "box-a" / "store", work / "box-b" / "home" / "someone" / "store"

    def build(store, recipe):
        res = sh(binary, "build", recipe, "--no-smoke", "--json", "--store", store, env=env, check=False)
        assert res.returncode == 4, res.stdout + res.stderr  # built, not smoked
        recs = [json.loads((w / "build.json").read_text()) for w in (store / "store" / "wheels").iterdir()]
        return max(recs, key=lambda r: r["started"])

    def wipe(store):
        for bucket in ("venvs", "wheels"):
            for e in (store / "store" / bucket).iterdir():
                force_rmtree(e)
        force_rmtree(store / "ccache")

    def configure(store, url):
        store.mkdir(parents=True, exist_ok=True)
        (store / "config.toml").write_text(f"[compiler_cache]\nremote = \"{url}\"\n" if url else "")

    redis = Redis(work / "redis")
    try:
        configure(a, None)
        build(a, r1)  # untimed: fills A's uv cache and wheelhouse, not the team cache
        wipe(a)
        configure(a, redis.url())
        cold = build(a, r1)
        configure(b, redis.url())
        build(b, r1)  # untimed: B's uv cache and wheelhouse
        wipe(b)
        same = build(b, r1)
        nxt = build(b, r2)
    finally:
        redis.stop()
    assert same["sha256"] == cold["sha256"], "the team cache changed the wheel"
    cs, ss, ns = cold["compiler_cache_stats"], same["compiler_cache_stats"], nxt["compiler_cache_stats"]
    ratio_same = same["duration_s"] / cold["duration_s"]
    ratio_next = nxt["duration_s"] / cold["duration_s"]
    missed = ", ".join(m.split("/")[-1] for m in ns.get("missed", []))
    return [
        (f"team compiler cache: wheel stage, store A cold ({tus + 1} C/C++ TUs, CMake + Ninja + ccache, "
         "Redis on 127.0.0.1 empty)",
         f"{cs['misses']} misses, {cs['remote_hits']} remote hits", cold["duration_s"], "baseline"),
        ("team compiler cache: store B (another path) building the same pin",
         f"{ss['remote_hits']} remote hits of {ss['calls']} calls, {ss['misses']} misses; same wheel sha256",
         same["duration_s"],
         f"{ratio_same:.2f}x the cold build (goal <= 0.2x: {'met' if ratio_same <= 0.2 else 'missed'})"),
        ("team compiler cache: store B building the next pin, one C++ file changed",
         f"{ns['misses']} miss ({missed}), {ns['local_hits']} local hits, {ns['remote_hits']} remote",
         nxt["duration_s"],
         f"{ratio_next:.2f}x the cold build (goal <= 0.3x: {'met' if ratio_next <= 0.3 else 'missed'})"),
    ]


def bulk_repo(work, modules, per_dir=24):
    """The fixture with `modules` generated modules under fixturellm/bulk/
    (`per_dir` per package, each package with its __init__.py), committed
    and tagged."""
    repo = work / f"bulk-repo-{modules}"
    shutil.copytree(FIXTURE / "pkg", repo)
    bulk = repo / "fixturellm" / "bulk"
    bulk.mkdir()
    (bulk / "__init__.py").write_text("")
    for d in range(0, modules, per_dir):
        pkg = bulk / f"d{d // per_dir:05}"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        for m in range(d, min(d + per_dir, modules)):
            (pkg / f"m{m}.py").write_text(f"VALUE = {m}\n\ndef value():\n    return VALUE\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "bulk")
    git(repo, "tag", "v0.1.0")
    return repo, git(repo, "rev-parse", "HEAD")


def noop_growth_rows(binary, env, work, runs, sizes=(10_000, 50_000, 100_000)):
    """The no-op (`build --offline` of an intact oracle) of fixture oracles of
    about `sizes` files: each has generated modules (a .py and its .pyc
    each), so the files grow as a vLLM CUDA venv's do."""
    store = work / "noop-store"
    rows = []
    base = None
    for n in sizes:
        if base is None:
            repo, commit = bulk_repo(work, 0)
            base = build_files(binary, env, work, store, "noop-0", repo, commit)[1]
        modules = max((n - base) // 2, 0)
        repo, commit = bulk_repo(work, modules)
        name = f"noop-{n}"
        r, files = build_files(binary, env, work, store, name, repo, commit)
        noop_s, _ = timed(lambda: sh(binary, "build", r, "--offline", "--store", store, env=env), runs)
        rows.append((f"no-op at {n // 1000}k files: `oracle-build <PIN> --offline`, oracle intact",
                     f"{files} files", noop_s,
                     f"goal <= 0.3 s: {'met' if noop_s <= 0.3 else 'missed'}"))
    return rows


def build_files(binary, env, work, store, name, repo, commit):
    """Locks and builds the fixture recipe `name` for `commit` of `repo`
    into `store`; returns the recipe path and the oracle's file count."""
    path = work / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nsource:\n  repo: file://{repo}\n  commit: {commit}\n  package: fixturellm\n"
        f"python: \"{PYTHON}\"\nbuild:\n  target_device: cpu\n"
        "smoke:\n  runs: 1\n  cases:\n    - name: small\n"
        f"      model: {FIXTURE}/model\n      prompt: \"The capital of France is Paris, and the\"\n"
        "      max_tokens: 16\n      engine_args: {max_model_len: 256, max_num_seqs: 1}\n")
    sh(binary, "lock", path, "--store", store, env=env)
    out = json.loads(sh(binary, "build", path, "--json", "--store", store, env=env).stdout)
    files = sum(len(f) for _d, _s, f in os.walk(out["oracle"]))
    print(f"{name}: {files} files", file=sys.stderr)
    return path, files


def finish(args, rows, first_s):
    """Prints the table and writes it to --out (none: printed only)."""
    date = datetime.date.today().isoformat()
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
               f"load average at the end {load}")
    lines = [
        "# Benchmarks",
        "",
        f"`scripts/bench --runs {args.runs}{' --quick' if args.quick else ''}"
        f"{' --rows ' + args.rows if args.rows != 'all' else ''}` on {date}; {machine}. "
        + (f"Medians of {args.runs} runs (no-op: of 10). First build of the bench oracle (downloads, wheel "
           f"build): {first_s:.1f} s." if first_s is not None else "One run of each row."),
        "",
        "| what | on | median | ratio |",
        "|---|---|---|---|",
    ]
    for what, on, secs, ratio_text in rows:
        lines.append(f"| {what} | {on} | {'' if secs is None else f'{secs:.3f} s'} | {ratio_text} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out is not None:
        args.out.write_text(table)
        print(f"wrote {args.out}", file=sys.stderr)


def merge(args, rows, first_s):
    """Replaces the rows of --out whose first cell is one of `rows`' (the
    cache rows) and says, under the header, which rows this run measured."""
    date = datetime.date.today().isoformat()
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    new = {what: f"| {what} | {on} | {'' if secs is None else f'{secs:.3f} s'} | {ratio_text} |"
           for what, on, secs, ratio_text in rows}
    for line in new.values():
        print(line)
    text = args.out.read_text() if args.out.exists() else ""
    if not text:
        return finish(args, rows, first_s)
    out, seen, dropped_note = [], set(), False
    for line in text.splitlines():
        cell = line.split(" | ")[0].removeprefix("| ") if line.startswith("| ") else None
        after_note, dropped_note = dropped_note, False
        if cell in new:
            out.append(new[cell])
            seen.add(cell)
        elif line.startswith("Rows re-measured by `scripts/bench --rows cache"):
            dropped_note = True
        elif after_note and not line:
            continue  # the blank line the note is written with (below)
        else:
            out.append(line)
    missing = [new[w] for w in new if w not in seen]
    note = (f"Rows re-measured by `scripts/bench --rows cache --runs {args.runs}` on {date} "
            f"(load average at the end {load}; first build of the bench oracle {first_s:.1f} s): "
            + "; ".join(f"\"{w.split(' (')[0]}\"" for w in new)
            + ". Every other row is from the earlier full run named above.")
    at = next((i for i, l in enumerate(out) if l.startswith("| what |")), len(out))
    out[at:at] = [note, ""]
    if missing:
        end = max(i for i, l in enumerate(out) if l.startswith("|"))
        out[end + 1:end + 1] = missing
    args.out.write_text("\n".join(out) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
