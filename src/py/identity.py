"""Measure an oracle's identity from inside its own venv (oracle-build).

Run as ``<venv>/bin/python -I identity.py <package>`` from a directory outside
any source tree, so the package can only be imported from the venv.
Prints one JSON object on stdout. Never raises:
failures are reported as fields.
"""
import importlib
import importlib.machinery
import importlib.metadata as md
import json
import os
import platform
import sys
import sysconfig


def dist_version(name):
    try:
        return md.version(name)
    except Exception:
        return None


def url_path(url):
    """The local path of a file:// URL (PEP 610 direct_url.json "url"), else None."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url or "")
    if parsed.scheme != "file":
        return None
    return unquote(parsed.path)


def editable_evidence(package, dist, package_path, prefix, sources):
    """Every sign of an editable install (PEP 610 / PEP 660).

    Appends to ``sources`` the source trees the install points at."""
    found = []
    if dist is not None:
        try:
            text = dist.read_text("direct_url.json")
            if text:
                info = json.loads(text)
                if info.get("dir_info", {}).get("editable"):
                    found.append("direct_url.json: dir_info.editable = true (%s)" % info.get("url"))
                    path = url_path(info.get("url"))
                    if path and path not in sources:
                        sources.append(path)
        except Exception as exc:  # a broken record is evidence too
            found.append("direct_url.json unreadable: %s" % exc)
    seen = set()
    for key in ("purelib", "platlib"):
        site = sysconfig.get_paths().get(key)
        if not site or site in seen or not os.path.isdir(site):
            continue
        seen.add(site)
        for name in sorted(os.listdir(site)):
            if name.endswith(".pth") and (name.startswith("__editable__") or package in name.lower()):
                found.append("%s in %s" % (name, site))
                # A static .pth (setuptools "compat"/legacy mode) lists source directories.
                try:
                    with open(os.path.join(site, name)) as fh:
                        for line in fh:
                            line = line.strip()
                            if line and not line.startswith(("#", "import")) and line not in sources:
                                sources.append(line)
                except OSError:
                    pass
    if package_path and not package_path.startswith(prefix + os.sep):
        found.append("%s.__file__ is outside the venv: %s" % (package, package_path))
    return found


def compiled_extensions(package_dir):
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES) + (".so",)
    out = []
    for root, dirs, files in os.walk(package_dir):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(suffixes):
                path = os.path.join(root, name)
                out.append({"path": os.path.relpath(path, package_dir), "size": os.path.getsize(path)})
    return out


def main():
    package = sys.argv[1]
    prefix = os.path.realpath(sys.prefix)
    ident = {
        "python_version": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": sysconfig.get_platform(),
        "sys_prefix": prefix,
        "runtime_version": None,
        "distribution_version": None,
        "flashinfer_version": None,
        "flashinfer_packages": {},
        "torch_version": None,
        "torch_cuda": None,
        "package_path": None,
        "package_in_venv": False,
        "compiled_extensions": [],
        "import_error": None,
    }
    try:
        dist = md.distribution(package)
        ident["distribution_version"] = dist.version
    except Exception:
        dist = None
    for name in ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"):
        version = dist_version(name)
        if version is not None:
            ident["flashinfer_packages"][name] = version
    package_dir = None
    try:
        module = importlib.import_module(package)
        ident["runtime_version"] = getattr(module, "__version__", None)
        package_path = os.path.realpath(module.__file__)
        ident["package_path"] = package_path
        ident["package_in_venv"] = package_path.startswith(prefix + os.sep)
        package_dir = os.path.dirname(package_path)
    except BaseException as exc:
        ident["import_error"] = "%s: %s" % (type(exc).__name__, exc)
        package_path = None
    sources = []
    ident["editable_evidence"] = editable_evidence(package, dist, package_path, prefix, sources)
    ident["editable_sources"] = sources
    ident["editable"] = bool(ident["editable_evidence"])
    if package_dir is None:
        # The import failed: glob the installed package directory anyway, so a
        # missing extension is named even when it is why the import fails.
        for key in ("platlib", "purelib"):
            site = sysconfig.get_paths().get(key)
            candidate = os.path.join(site, package) if site else None
            if candidate and os.path.isfile(os.path.join(candidate, "__init__.py")):
                package_dir = os.path.realpath(candidate)
                break
    ident["package_dir"] = package_dir
    if package_dir:
        ident["compiled_extensions"] = compiled_extensions(package_dir)
    if ident["flashinfer_packages"]:
        try:
            import flashinfer
            ident["flashinfer_version"] = getattr(flashinfer, "__version__", None)
        except BaseException as exc:
            ident["flashinfer_error"] = "%s: %s" % (type(exc).__name__, exc)
    if dist_version("torch") is not None:
        try:
            import torch
            ident["torch_version"] = torch.__version__
            ident["torch_cuda"] = getattr(torch.version, "cuda", None)
        except BaseException as exc:
            ident["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
    sys.stdout.write(json.dumps(ident) + "\n")


if __name__ == "__main__":
    main()
