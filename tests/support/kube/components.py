"""Real Kubernetes control-plane binaries, built once from the Go module proxy with this
machine's Go, into a cache outside the checkout that later runs and CI on the same machine reuse
(issue 55, Build 1). `make kube-components` runs it.

    python -m tests.support.kube.components [--only NAME ...] [--jobs N]

Each component is built in a scratch module of its own (their dependency versions differ):
- `k8s.io/kubernetes` cannot be `go install`ed — its go.mod replaces each staging module
  (`k8s.io/api => ./staging/src/k8s.io/api`) and replace directives of a dependency are ignored —
  so the scratch module requires it and replaces every staging module with the published
  `k8s.io/<name>` at the matching `v0.<minor>.<patch>`;
- etcd's server module (`go.etcd.io/etcd/server/v3`, whose root package is the `etcd` command);
- the batch admission controller. Volcano (`volcano.sh/volcano`) is what the launcher renders,
  but the module proxy refuses every release of it here (403 for v1.11.2 … v1.14.0, 2026-12-06),
  so Kueue (`sigs.k8s.io/kueue`) is built instead, beside kube-scheduler, as the issue directs.

The cache folder is keyed by every component's version (`TRAINYARD_KUBE_CACHE`, default
`~/.cache/trainyard/kube`): a version bump builds into a new folder, an unchanged one is reused
at once. Progress is printed; a failed build names the module and the go command's last lines.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Component:
    name: str
    module: str
    version: str
    binaries: dict[str, str]
    """Binary name → package path inside the module ('' for the module's root package)."""
    staging_replaces: bool = False
    version_flags: tuple[str, ...] = ()
    """`-X` link flags that stamp the release into the binary (`kube-apiserver --version`, the
    `/version` endpoint clients check for skew); a build from a module has no git to read it from."""


KUBERNETES = "v1.37.2"
COMPONENTS = (
    Component("kubernetes", "k8s.io/kubernetes", KUBERNETES,
              {"kube-apiserver": "cmd/kube-apiserver", "kube-controller-manager": "cmd/kube-controller-manager",
               "kube-scheduler": "cmd/kube-scheduler"}, staging_replaces=True,
              version_flags=tuple(f"-X k8s.io/{base}.{name}={value}" for base in
                                  ("component-base/version", "client-go/pkg/version")
                                  for name, value in (("gitVersion", KUBERNETES), ("gitMajor", "1"),
                                                      ("gitMinor", KUBERNETES.split(".")[1]),
                                                      ("gitTreeState", "clean")))),
    Component("etcd", "go.etcd.io/etcd/server/v3", "v3.6.16", {"etcd": ""}),
    Component("kueue", "sigs.k8s.io/kueue", "v0.17.0", {"kueue": "cmd/kueue"}),
)


def cache_root() -> Path:
    return Path(os.environ.get("TRAINYARD_KUBE_CACHE", Path.home() / ".cache" / "trainyard" / "kube"))


def key() -> str:
    return "_".join(f"{c.name}-{c.version}" for c in COMPONENTS)


def bin_dir() -> Path:
    """Where the binaries of these versions are (or will be)."""
    return cache_root() / key() / "bin"


def missing(components: tuple[Component, ...] = COMPONENTS) -> list[str]:
    return [b for c in components for b in c.binaries if not (bin_dir() / b).is_file()]


def staging_replaces(component: Component) -> list[str]:
    """`k8s.io/<name> => k8s.io/<name> v0.<minor>.<patch>` for each staging module the
    kubernetes module replaces with a local path."""
    go_mod = go("mod", "download", "-json", f"{component.module}@{component.version}", cwd=None)
    path = re.search(r'"GoMod":\s*"([^"]+)"', go_mod)
    if not path:
        raise BuildFailed(component, f"the proxy gave no go.mod: {go_mod[-400:]}")
    staging = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", Path(path.group(1)).read_text(), re.M)
    published = "v0." + component.version.removeprefix("v1.")
    return [f"{name} => {name} {published}" for name in staging]


class BuildFailed(RuntimeError):
    def __init__(self, component: Component, why: str) -> None:
        super().__init__(f"building {component.module}@{component.version} failed: {why}")


def go(*args: str, cwd: Path | None) -> str:
    done = subprocess.run(["go", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"})
    if done.returncode:
        raise RuntimeError("\n".join((done.stdout + done.stderr).strip().splitlines()[-15:]))
    return done.stdout


def build(component: Component, *, jobs: int) -> None:
    if not missing((component,)):
        print(f"  {', '.join(component.binaries)}: cached", flush=True)
        return
    scratch = cache_root() / key() / "src" / component.name
    scratch.mkdir(parents=True, exist_ok=True)
    lines = [f"module trainyard.local/build/{component.name}", "", "go 1.26", "",
             f"require {component.module} {component.version}", ""]
    try:
        replaces = staging_replaces(component) if component.staging_replaces else []
        if replaces:
            lines += ["replace (", *(f"\t{r}" for r in replaces), ")", ""]
        (scratch / "go.mod").write_text("\n".join(lines))
        out = bin_dir()
        out.mkdir(parents=True, exist_ok=True)
        for binary, package in component.binaries.items():
            if (out / binary).is_file():
                print(f"  {binary}: cached", flush=True)
                continue
            started = time.monotonic()
            target = f"{component.module}/{package}" if package else component.module
            ldflags = " ".join(("-s", "-w", *component.version_flags))
            go("build", "-p", str(jobs), "-trimpath", f"-ldflags={ldflags}", "-o", str(out / f".{binary}.part"), target,
               cwd=scratch)
            (out / f".{binary}.part").rename(out / binary)
            size = (out / binary).stat().st_size / 2**20
            print(f"  {binary}: built in {time.monotonic() - started:.0f} s ({size:.0f} MiB)", flush=True)
    except RuntimeError as e:
        if isinstance(e, BuildFailed):
            raise
        raise BuildFailed(component, str(e)) from e


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="component names (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="go build -p")
    args = parser.parse_args()
    chosen = tuple(c for c in COMPONENTS if args.only is None or c.name in args.only)
    if missing(chosen) and shutil.which("go") is None:
        sys.exit("go is not on PATH: the Kubernetes components are built with this machine's Go")
    print(f"Kubernetes components into {bin_dir()}", flush=True)
    started = time.monotonic()
    for component in chosen:
        print(f"{component.module}@{component.version}", flush=True)
        try:
            build(component, jobs=args.jobs)
        except BuildFailed as e:
            sys.exit(str(e))
    print(f"done in {time.monotonic() - started:.0f} s; missing: {missing(chosen) or 'none'}", flush=True)


if __name__ == "__main__":
    main()
